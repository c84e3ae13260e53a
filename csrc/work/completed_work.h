// The Work an aggregation returns once its result is in place.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace gradzip {

// A completed Work whose future holds `tensors`, as c10d's allreduce does. For tensors on
// an accelerator the future is created with their device, so it records an event on the
// current stream and waiters synchronize with the stream that computed the result (a
// worker job's side stream: work/ordered_worker.h).
c10::intrusive_ptr<c10d::Work> completed_work(std::vector<at::Tensor>& tensors);

}  // namespace gradzip
