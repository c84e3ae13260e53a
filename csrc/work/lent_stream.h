// LentStream: a stream of one device that no other holder is given while it is lent: the
// side stream of a process group's worker (work/ordered_worker.h).
//
// On CUDA (builds with CUDA) it is a stream gradzip created itself, non-blocking, at the
// device's greatest priority: never one of torch's pool streams, which torch hands round
// robin to every caller (torch.cuda.Stream(), NCCL's internal streams, other libraries),
// so that a pool stream may be the very stream a user queues work on, and gradzip's jobs
// would then wait behind that work. A returned stream is kept for the next lender, never
// destroyed: torch's caching allocator may still record events on it for tensors that
// were record_stream()ed there (a CUDA stream, once destroyed, must not be used again),
// so the process holds at most as many as it ever had groups at once, per device.
//
// Other device types (and CUDA in builds without CUDA) get a high-priority stream from
// torch's pool for that device, as before: torch offers no other way to make one.
#pragma once

#include <c10/core/Stream.h>

namespace gradzip {

class LentStream {
 public:
  explicit LentStream(c10::Device device);
  ~LentStream();
  LentStream(const LentStream&) = delete;
  LentStream& operator=(const LentStream&) = delete;

  const c10::Stream& stream() const { return stream_; }

 private:
  c10::Stream stream_;
  bool owned_;  // ours (goes back to the free list), not torch's pool's
};

}  // namespace gradzip
