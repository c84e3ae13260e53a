#include "aggregate/compressed_allreduce.h"

#include <c10/util/Exception.h>

#include "aggregate/completed_work.h"
#include "aggregate/exact_allreduce.h"
#ifdef GRADZIP_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "aggregate/device_codec_glue.h"
#include "device_codec.h"
#endif

namespace gradzip {
namespace {

bool compressible(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

// Allgathers byte payloads of any sizes over `transport`, on `device` (NCCL moves CUDA
// tensors only): the sizes, then the payloads padded to the largest. Returns them on the CPU.
std::vector<at::Tensor> allgather_payloads(const std::vector<uint8_t>& mine, const at::Device& device,
                                           const c10::intrusive_ptr<c10d::Backend>& transport, int64_t& padded) {
  const int ranks = transport->getSize();
  auto size = at::full({1}, static_cast<int64_t>(mine.size()), at::dtype(at::kLong).device(device));
  auto sizes = at::empty({ranks}, at::dtype(at::kLong).device(device));
  transport->_allgather_base(sizes, size)->wait();
  sizes = sizes.cpu();
  padded = sizes.max().item<int64_t>();
  auto send = at::zeros({padded}, at::kByte);
  std::memcpy(send.data_ptr<uint8_t>(), mine.data(), mine.size());
  send = send.to(device);
  auto all = at::empty({ranks * padded}, at::dtype(at::kByte).device(device));
  transport->_allgather_base(all, send)->wait();
  all = all.cpu();
  std::vector<at::Tensor> out;
  for (int r = 0; r < ranks; ++r) out.push_back(all.narrow(0, r * padded, sizes[r].item<int64_t>()));
  return out;
}

// The state's residual as a float32 tensor of n elements on `device` (zeros at first).
at::Tensor& residual_on(CompressedState& state, const at::Device& device, int64_t n, const std::string& key) {
  if (!state.residual.defined()) state.residual = at::zeros({n}, at::dtype(at::kFloat).device(device));
  TORCH_CHECK(state.residual.numel() == n, "gradzip: the tensor keyed '", key, "' had ", state.residual.numel(),
              " elements and now has ", n, "; a key must always name a tensor of the same size");
  if (state.residual.device() != device) state.residual = state.residual.to(device);
  return state.residual;
}

}  // namespace

std::vector<SpecKey> compressed_aggregation_keys() {
  return {SpecKey::boolean("ef", "",
                           "error feedback: add what earlier steps did not send, keep what this step does not send "
                           "(default: on for topk, stc, sign with vote=mean; off otherwise)"),
          SpecKey::integer("min_numel", "0", 0, 9.2e18, "tensors with fewer elements go exact"),
          SpecKey::integer("warmup", "0", 0, 9.2e18, "the first warmup all-reduces of each tensor go exact"),
          SpecKey::integer("seed", "0", 0, 9.2e18,
                           "seeds random-k's choice and QSGD's stochastic rounding (with the step and the rank)")};
}

void CompressedState::save(const std::string& key, std::map<std::string, at::Tensor>& out) const {
  if (residual.defined()) out[state_name(key, "residual")] = residual.to(at::kCPU).clone();
  out[state_name(key, "calls")] = count_tensor(calls);
  out[state_name(key, "step")] = count_tensor(static_cast<int64_t>(step));
}

void CompressedState::load(const std::string& field, const at::Tensor& value, const std::string& name) {
  if (field == "residual") {
    residual = float_state(value, name);
  } else if (field == "calls") {
    calls = count_of(value, name);
  } else if (field == "step") {
    step = static_cast<uint64_t>(count_of(value, name));
  } else {
    unknown_state_field(name);
  }
}

CompressedAllreduce::CompressedAllreduce(const BoundSpec& spec)
    : StatefulAggregation(spec),
      codec_(spec.codec()),
      error_feedback_(spec.spec().get_bool("ef", codec_->biased())),
      majority_(codec_->parameters().majority),
      min_numel_(spec.spec().get_int("min_numel", 0)),
      warmup_(spec.spec().get_int("warmup", 0)),
      seed_(static_cast<uint64_t>(spec.spec().get_int("seed", 0))) {}

at::Device CompressedAllreduce::residual_device(const at::Tensor& tensor) const {
#ifdef GRADZIP_WITH_CUDA
  if (tensor.is_cuda() && cuda::has_device_half(codec_->id())) return tensor.device();
#endif
  return at::Device(at::kCPU);
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts,
                                                              const c10::intrusive_ptr<c10d::Backend>& transport,
                                                              Stats& stats, const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  return run(tensors, opts, transport, stats, key, lock, states_[key]);
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce_pieces(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceOptions& opts,
                                                                     const c10::intrusive_ptr<c10d::Backend>& transport,
                                                                     Stats& stats,
                                                                     const std::vector<TensorPiece>& pieces) {
  TORCH_CHECK(tensors.size() == 1 && !pieces.empty(), "gradzip: all_reduce of pieces takes one tensor and its pieces");
  int64_t total = 0;
  for (const auto& piece : pieces) total += piece.numel;
  TORCH_CHECK(total == tensors.front().numel(), "gradzip: the pieces hold ", total, " elements, the tensor ",
              tensors.front().numel());
  const at::Device device = residual_device(tensors.front());
  std::unique_lock<std::mutex> lock(mutex_);
  // One state for the whole tensor, assembled from the pieces' and returned to them.
  const CompressedState& first = states_[pieces.front().key];
  CompressedState whole{at::Tensor(), first.calls, first.step};
  if (error_feedback_) {
    std::vector<at::Tensor> parts;
    for (const auto& piece : pieces) parts.push_back(residual_on(states_[piece.key], device, piece.numel, piece.key));
    whole.residual = at::cat(parts);
  }
  const std::string key = pieces.front().key + " (and the rest of its bucket)";
  auto work = run(tensors, opts, transport, stats, key, lock, whole);
  lock.lock();
  int64_t offset = 0;
  for (const auto& piece : pieces) {
    CompressedState& state = states_[piece.key];
    state.calls = whole.calls;
    state.step = whole.step;
    if (error_feedback_) state.residual = whole.residual.narrow(0, offset, piece.numel).clone();
    offset += piece.numel;
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::run(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts,
                                                        const c10::intrusive_ptr<c10d::Backend>& transport,
                                                        Stats& stats, const std::string& key,
                                                        std::unique_lock<std::mutex>& lock, CompressedState& state) {
  TORCH_CHECK(tensors.size() == 1, "gradzip: all_reduce takes one tensor, got ", tensors.size());
  at::Tensor& tensor = tensors.front();
  const auto op = opts.reduceOp.op_;
  const bool supported_op = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  const int64_t n = tensor.numel();
  const bool compress = compressible(tensor) && supported_op && n >= min_numel_ && state.calls >= warmup_;
  ++state.calls;
  if (!compress) {
    lock.unlock();
    return exact_allreduce(tensors, opts, transport, stats);
  }
#ifdef GRADZIP_WITH_CUDA
  if (tensor.is_cuda() && cuda::has_device_half(codec_->id())) {
    return run_on_device(tensors, op, transport, stats, key, lock, state);
  }
#endif
  float* residual = error_feedback_ ? residual_on(state, at::Device(at::kCPU), n, key).data_ptr<float>() : nullptr;

  const int ranks = transport->getSize();
  const auto input = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  std::vector<uint8_t> payload;
  const EncodeContext ctx{seed_, state.step, static_cast<uint32_t>(transport->getRank())};
  codec_->encode(input.data_ptr<float>(), n, residual, ctx, payload);
  ++state.step;
  lock.unlock();

  int64_t padded = 0;
  const auto payloads = allgather_payloads(payload, tensor.device(), transport, padded);
  // An fp32 CPU tensor is its own sum (the encoder is done with it): no 4n-byte buffer to
  // allocate and no pass to copy it back. Same additions, same order, same bits.
  const bool in_place = tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous();
  auto sum = in_place ? tensor.view({n}).zero_() : at::zeros({n}, at::kFloat);
  for (int r = 0; r < ranks; ++r) {
    try {
      codec_->decode_add(payloads[r].data_ptr<uint8_t>(), payloads[r].numel(), sum.data_ptr<float>(), n);
    } catch (const PayloadError& e) {
      TORCH_CHECK(false, "gradzip: the payload of rank ", r, " for the tensor keyed '", key,
                  "' cannot be decoded: ", e.what());
    }
  }
  if (majority_) {
    sum.sign_();
  } else if (op == c10d::ReduceOp::AVG) {
    sum.div_(ranks);
  }
  if (!in_place) tensor.copy_(sum.view(tensor.sizes()));
  // An allgather sends this rank's (padded) payload to every other rank and receives theirs.
  stats.add((ranks - 1) * (padded + 8), (ranks - 1) * (padded + 8), ring_allreduce_bytes(n * 4, ranks));
  return completed_work(tensors);
}

#ifdef GRADZIP_WITH_CUDA
c10::intrusive_ptr<c10d::Work> CompressedAllreduce::run_on_device(
    std::vector<at::Tensor>& tensors, c10d::ReduceOp::RedOpType op, const c10::intrusive_ptr<c10d::Backend>& transport,
    Stats& stats, const std::string& key, std::unique_lock<std::mutex>& lock, CompressedState& state) {
  at::Tensor& tensor = tensors.front();
  const at::Device device = tensor.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t n = tensor.numel();
  const int ranks = transport->getSize();
  at::Tensor residual;
  if (error_feedback_) residual = residual_on(state, device, n, key);
  const auto input = tensor.detach().to(at::kFloat).contiguous();
  const EncodeContext ctx{seed_, state.step, static_cast<uint32_t>(transport->getRank())};
  const at::Tensor payload = encode_on_device(*codec_, input, residual, ctx);
  ++state.step;
  lock.unlock();

  // Sizes first (the host needs them to size the rows), then the rows, padded to 8-byte
  // multiples so that every payload's sections keep their alignment.
  auto size = at::full({1}, payload.numel(), at::dtype(at::kLong).device(device));
  auto sizes = at::empty({ranks}, at::dtype(at::kLong).device(device));
  transport->_allgather_base(sizes, size)->wait();
  sizes = sizes.cpu();
  const int64_t largest = sizes.max().item<int64_t>();
  const int64_t stride = std::max<int64_t>(8, (largest + 7) / 8 * 8);
  auto send = at::zeros({stride}, at::dtype(at::kByte).device(device));
  send.narrow(0, 0, payload.numel()).copy_(payload);
  auto all = at::empty({ranks * stride}, at::dtype(at::kByte).device(device));
  transport->_allgather_base(all, send)->wait();

  std::vector<size_t> lengths(ranks);
  for (int r = 0; r < ranks; ++r) lengths[r] = static_cast<size_t>(sizes[r].item<int64_t>());
  auto sum = at::zeros({n}, at::dtype(at::kFloat).device(device));
  try {
    decode_add_on_device(codec_->id(), all, stride, lengths, sum);
  } catch (const cuda::RankPayloadError& e) {
    TORCH_CHECK(false, "gradzip: the payload of rank ", e.rank(), " for the tensor keyed '", key,
                "' cannot be decoded: ", e.what());
  }
  if (majority_) {
    sum = sum.sign();
  } else if (op == c10d::ReduceOp::AVG) {
    sum.div_(ranks);
  }
  tensor.copy_(sum.view(tensor.sizes()));
  stats.add((ranks - 1) * (stride + 8), (ranks - 1) * (stride + 8), ring_allreduce_bytes(n * 4, ranks));
  return completed_work(tensors);
}
#endif

}  // namespace gradzip
