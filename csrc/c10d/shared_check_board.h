// SharedCheckBoard: the collective check's fingerprints exchanged through memory that
// every rank of a group shares, for a group whose ranks all run on one host.
//
// Why: the check is a round trip before every checked collective. Over Gloo it is an
// all-to-all of a few int64s, which costs one to two and a half milliseconds where ranks
// share cores (every message waits for Gloo's threads and its receiver to be scheduled);
// through shared memory it is a write and a futex barrier, tens of microseconds.
//
// Each check posts this rank's fingerprint in the slot of the check's parity, arrives at
// a sense-reversing barrier (a count and a generation the waiters sleep on with a futex),
// and reads every rank's slot. A rank cannot post twice before every rank has read: its
// next check waits at the next barrier, which needs every rank. Waiting wakes every
// 50 ms to name what holds it: a rank whose process has exited, or whose board has
// stopped (its group shut down, aborted or destroyed: a Gloo peer's connections close
// then), raises at once on the others; a rank that does not come within the group's
// timeout raises on the ones that wait; and stop() ends this rank's wait. After any of
// them the group is unusable, as a Gloo group is after its timeout.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gradzip {

class SharedCheckBoard {
 public:
  // Collective over `transport` (the group's own): rank 0 makes the POSIX shared-memory
  // object `name`, every rank maps it and confirms it is the same object and that it can
  // see every rank's process; the object is unlinked once mapped. Returns nullptr on
  // every rank when any rank cannot (ranks on several hosts, separate IPC or process
  // namespaces, a full /dev/shm): the check then stays on the transport.
  static std::unique_ptr<SharedCheckBoard> open(const std::string& name, int width,
                                                const c10::intrusive_ptr<c10d::Backend>& transport);
  ~SharedCheckBoard();
  SharedCheckBoard(const SharedCheckBoard&) = delete;
  SharedCheckBoard& operator=(const SharedCheckBoard&) = delete;

  // Posts `mine` (width int64) and returns every rank's, width each in rank order, once
  // every rank has posted. Throws std::runtime_error naming the ranks it waited for when
  // one has exited or stopped, or `timeout` passed.
  std::vector<int64_t> exchange(const int64_t* mine, std::chrono::milliseconds timeout);
  // Ends a wait in exchange() on this rank within 50 ms, and every later one at once, with
  // an error, and tells the other ranks that this one will post no more: their waits for
  // it raise at once (the group's abort() and shutdown(); the destructor too).
  void stop();

 private:
  struct Layout;
  SharedCheckBoard(void* base, size_t bytes, int rank, int size, int width);

  void* base_;
  size_t bytes_;
  int rank_, size_, width_;
  uint64_t checks_ = 0;  // the checks this rank has made
  std::atomic<bool> stopped_{false};
};

}  // namespace gradzip
