// CallSequenceIdentity: names the logical tensor behind each all_reduce on a
// gradzip process group, so error feedback follows it from step to step.
//
// c10d passes no names, and a tensor's address does not identify it (gradients are
// reallocated after zero_grad(set_to_none=True)). So a tensor is named by its dtype,
// its element count and k, the number of earlier calls with that dtype and count in
// the current step: "float:1000:0", "float:1000:1", ... A step starts at the first
// call and again at every call whose dtype and count equal those of the group's
// first call, when the call before it had another dtype or count, or no other dtype
// and count has been seen yet (a loop over one tensor), or it is the very tensor that
// started the current step, still alive (the same storage, not freed since, at the same
// data pointer): a loop over one kept tensor with other all-reduces now and then (a DDP
// model of one bucket, whose buffer DDP keeps, with a metric all-reduced after each
// epoch). A tensor allocated afresh for each call never counts as the same one, even at
// a freed one's address, so every rank names alike however its allocator reuses memory.
//
// The first step may differ from the rest: DDP rebuilds its buckets after its first
// iteration, so the group's first signature may never come back. When it has not come
// back for two whole periods of a sequence that repeats (the L calls since the last call
// with this signature equal the L calls before that one), the step restarts at this call
// and the repeating sequence is named from here on. Keys named before that (one or two
// steps' worth) are not used again.
//
// Keys come and go: a key not named in the step just finished nor in the one before it
// expires (take_expired() hands it over, once), so that its state can be dropped. State
// is bounded by three steps' worth of keys, whatever tensors pass through; a tensor that
// skips two whole steps starts afresh (no residual) when it comes back.
//
// So a training loop that all-reduces the same tensors in the same order every step
// keeps one residual per tensor, however its tensors are allocated, provided its
// first tensor's dtype and size do not come back inside the step right after a
// different one. The DDP hook (bucket index) and gradzip.Aggregation (parameter
// names) name tensors explicitly and need no such rule.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gradzip {

class CallSequenceIdentity {
 public:
  std::string key(const at::Tensor& tensor);
  // The keys that expired since the last call (see above).
  std::vector<std::string> take_expired();

 private:
  using Signature = std::pair<int, int64_t>;  // (dtype, numel)
  // True when the calls since the last one with `signature` repeat the calls before it,
  // and the step's first signature is not among them.
  bool repeats_without_first(const Signature& signature) const;

  std::mutex mutex_;
  std::vector<Signature> history_;  // the latest calls, oldest first (bounded)
  bool started_ = false;
  bool seen_other_ = false;
  Signature first_{}, previous_{};
  // The tensor that started this step: its storage (not kept alive) and data pointer.
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> step_storage_;
  const void* step_data_ = nullptr;
  bool started_this_step(const at::Tensor& tensor) const;
  std::map<Signature, int64_t> counts_;  // calls per signature in the current step
  void start_step(const at::Tensor& tensor);
  int64_t step_ = 0;                         // steps started so far
  std::map<std::string, int64_t> named_in_;  // each live key's latest step
  std::vector<std::string> expired_;
};

}  // namespace gradzip
