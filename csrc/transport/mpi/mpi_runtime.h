// MpiRuntime: the process's MPI library, as gradzip's MPI transport uses it.
//
// start() initializes MPI once per process (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE), or adopts an MPI that is already initialized (mpi4py); either way
// it needs at least MPI_THREAD_SERIALIZED, because communicators issue calls from their
// own worker threads. Every MPI call gradzip makes runs under call() (one process-wide
// lock), so SERIALIZED suffices. finish() is called once at interpreter exit, after
// every communicator was released: it runs MPI_Finalize when gradzip initialized MPI
// (under mpirun a process that exits without it is counted as a failure).
//
// wait() completes requests by polling MPI_Testall (MPI moves data only inside MPI
// calls) until they are done or `deadline` passes; then the requests stay posted, and
// the communicator that issued them is broken from then on. It polls at the pace of a
// Backoff, so a rank that waits for a late peer does not hold a core.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

namespace gradzip::mpi {

using Clock = std::chrono::steady_clock;

// The pace of a polling wait. MPI moves data only inside MPI calls (MPICH's large
// messages, Open MPI over TCP), so a wait polls at full pace, only yielding between
// polls, for as long as its own bytes could take: `spin`, kSpin plus the bytes at
// kSlowestRate (a 1 Gbit/s link). Past that the peer is late, not the data: it sleeps
// between polls, each pause a tenth of the time waited so far (so it adds at most about
// 10% to any wait) and at most kLongestPause (so a long idle wait polls 1000 times a
// second and uses almost no CPU).
class Backoff {
 public:
  static constexpr std::chrono::microseconds kSpin{2000};
  static constexpr double kSlowestRate = 125e6;  // bytes per second
  static constexpr std::chrono::microseconds kLongestPause{1000};

  // A wait for `bytes` bytes, starting now.
  explicit Backoff(int64_t bytes = 0);
  // How long to pause before the next poll, `now` being the time of this one; zero: yield.
  Clock::duration pause_at(Clock::time_point now) const;
  // Yields or sleeps pause_at(now), but not past `until`.
  void pause(Clock::time_point until) const;
  // Counts the wait, for `bytes` bytes, from now again (the caller saw progress).
  void restart(int64_t bytes);

 private:
  Clock::time_point start_;
  Clock::duration spin_;
};

// The MPI library this build links: MPI_Get_library_version's text (callable before
// MPI is started), such as "Open MPI v4.1.4, ..." or "MPICH Version: 4.0.2 ...".
std::string library_version();

// Initializes (or adopts) MPI; idempotent. Raises when MPI offers less than
// MPI_THREAD_SERIALIZED or was finalized already.
void start();
// MPI_Finalize when gradzip initialized MPI and it is not finalized yet; a no-op otherwise.
// `clean` false (a communicator timed out with requests still posted): skip it, since
// MPI_Finalize would wait for them forever.
void finish(bool clean);
// True between start() and finish().
bool running();

// Runs `body` holding the process-wide MPI lock; raises when an MPI call in it returned
// an error (checked with check()).
void call(const std::function<void()>& body);
// Raises naming `what` and MPI's own message when `code` is not MPI_SUCCESS.
void check(int code, const char* what);

// A committed contiguous datatype of `bytes` bytes (one tensor element); cached.
MPI_Datatype element_type(size_t bytes);

// Waits for every request in `requests` (MPI_REQUEST_NULL entries are done), which move
// about `bytes` bytes (the Backoff's spin); false when `deadline` passes first.
bool wait(std::vector<MPI_Request>& requests, Clock::time_point deadline, int64_t bytes);

}  // namespace gradzip::mpi
