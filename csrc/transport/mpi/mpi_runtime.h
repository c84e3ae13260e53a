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
// wait() completes requests by polling MPI_Test (which drives Open MPI's progress) until
// they are done or `deadline` passes; then the requests stay posted, and the
// communicator that issued them is broken from then on.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

namespace gradzip::mpi {

using Clock = std::chrono::steady_clock;

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

// Waits for every request in `requests` (MPI_REQUEST_NULL entries are done); false when
// `deadline` passes first.
bool wait(std::vector<MPI_Request>& requests, Clock::time_point deadline);

}  // namespace gradzip::mpi
