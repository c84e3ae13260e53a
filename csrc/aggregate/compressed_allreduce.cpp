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

// The residual on the host, where a state handed out or a CPU tensor needs it.
void residual_to_host(TensorState& state) {
  if (!state.device_residual.defined()) return;
  const auto host = state.device_residual.to(at::kCPU).contiguous();
  state.residual.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
  state.device_residual = at::Tensor();
}

#ifdef GRADZIP_WITH_CUDA
// The residual on `device` (zeros at first), for a CUDA tensor of n elements.
at::Tensor& residual_on_device(TensorState& state, const at::Device& device, int64_t n, const std::string& key) {
  if (state.device_residual.defined() && state.device_residual.device() != device) residual_to_host(state);
  if (!state.device_residual.defined()) {
    if (state.residual.empty()) {
      state.device_residual = at::zeros({n}, at::dtype(at::kFloat).device(device));
    } else {
      state.device_residual =
          at::from_blob(state.residual.data(), {static_cast<int64_t>(state.residual.size())}, at::kFloat).to(device);
      state.residual.clear();
    }
  }
  TORCH_CHECK(state.device_residual.numel() == n, "gradzip: the tensor keyed '", key, "' had ",
              state.device_residual.numel(), " elements and now has ", n,
              "; a key must always name a tensor of the same size");
  return state.device_residual;
}
#endif

}  // namespace

const std::vector<std::string>& compressed_aggregation_keys() {
  static const std::vector<std::string> keys = {"ef", "min_numel", "warmup", "seed"};
  return keys;
}

CompressedAllreduce::CompressedAllreduce(const Spec& spec)
    : StatefulAggregation(spec),
      parameters_(codec_parameters(spec)),
      codec_(make_codec(spec)),
      error_feedback_(spec.get_bool("ef", codec_->biased() && spec.get_string("vote", "mean") != "majority")),
      majority_(spec.get_string("vote", "mean") == "majority"),
      min_numel_(spec.get_int("min_numel", 0)),
      warmup_(spec.get_int("warmup", 0)),
      seed_(static_cast<uint64_t>(spec.get_int("seed", 0))) {
  if (min_numel_ < 0) throw SpecError("gradzip: spec '" + spec.str() + "': min_numel must be >= 0");
  if (warmup_ < 0) throw SpecError("gradzip: spec '" + spec.str() + "': warmup must be >= 0");
}

c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts,
                                                              const c10::intrusive_ptr<c10d::Backend>& transport,
                                                              Stats& stats, const std::string& key) {
  TORCH_CHECK(tensors.size() == 1, "gradzip: all_reduce takes one tensor, got ", tensors.size());
  at::Tensor& tensor = tensors.front();
  const auto op = opts.reduceOp.op_;
  const bool supported_op = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  std::unique_lock<std::mutex> lock(mutex_);
  TensorState& state = state_[key];
  const int64_t n = tensor.numel();
  const bool compress = compressible(tensor) && supported_op && n >= min_numel_ && state.calls >= warmup_;
  ++state.calls;
  if (!compress) {
    lock.unlock();
    return exact_allreduce(tensors, opts, transport, stats);
  }
#ifdef GRADZIP_WITH_CUDA
  if (tensor.is_cuda() && cuda::has_device_codec(parameters_.id)) {
    return allreduce_on_device(tensors, op, transport, stats, key, lock, state);
  }
#endif
  if (error_feedback_) {
    residual_to_host(state);
    if (state.residual.empty()) state.residual.assign(n, 0.0f);
    TORCH_CHECK(static_cast<int64_t>(state.residual.size()) == n, "gradzip: the tensor keyed '", key, "' had ",
                state.residual.size(), " elements and now has ", n,
                "; a key must always name a tensor of the same size");
  }

  const int ranks = transport->getSize();
  const auto input = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  std::vector<uint8_t> payload;
  const EncodeContext ctx{seed_, state.step, static_cast<uint32_t>(transport->getRank())};
  codec_->encode(input.data_ptr<float>(), n, error_feedback_ ? state.residual.data() : nullptr, ctx, payload);
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
c10::intrusive_ptr<c10d::Work> CompressedAllreduce::allreduce_on_device(
    std::vector<at::Tensor>& tensors, c10d::ReduceOp::RedOpType op, const c10::intrusive_ptr<c10d::Backend>& transport,
    Stats& stats, const std::string& key, std::unique_lock<std::mutex>& lock, TensorState& state) {
  at::Tensor& tensor = tensors.front();
  const at::Device device = tensor.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t n = tensor.numel();
  const int ranks = transport->getSize();
  at::Tensor residual;
  if (error_feedback_) residual = residual_on_device(state, device, n, key);
  const auto input = tensor.detach().to(at::kFloat).contiguous();
  const EncodeContext ctx{seed_, state.step, static_cast<uint32_t>(transport->getRank())};
  const at::Tensor payload = encode_on_device(parameters_, input, residual, ctx);
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
    decode_add_on_device(parameters_.id, all, stride, lengths, sum);
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

std::map<std::string, TensorState> CompressedAllreduce::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto out = state_;
  for (auto& [key, s] : out) residual_to_host(s);
  return out;
}

TensorState CompressedAllreduce::tensor_state(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = state_.find(key);
  if (it == state_.end()) return {};
  TensorState out = it->second;
  residual_to_host(out);
  return out;
}

}  // namespace gradzip
