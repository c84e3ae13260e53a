#include "aggregate/gossip.h"

#include <c10/util/Exception.h>

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <limits>

#include "work/completed_work.h"
#include "aggregate/exact_allreduce.h"
#include "aggregate/neighbour_messages.h"
#include "aggregate/peer_header.h"
#include "codec/payload_padding.h"
#include "aggregate/slots.h"
#include "aggregate/slot_codec.h"
#include "codec/codec_record.h"
#ifdef GRADZIP_WITH_CUDA
#include "aggregate/device_slot_codec.h"
#endif

namespace gradzip {
namespace {

constexpr int64_t kHeaderBytes = kPeerHeaderFields * sizeof(int64_t);

bool averaged(const at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  const auto op = opts.reduceOp.op_;
  return tensor.is_floating_point() && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG);
}

// The header every gossip message carries (aggregate/peer_header.h); `accepts`: the most
// bytes this rank takes from a peer.
PeerHeader message_header(int64_t bytes, bool finite, const at::Tensor& tensor, uint64_t step, int64_t accepts) {
  return {bytes, finite, static_cast<int64_t>(tensor.scalar_type()), tensor.numel(), static_cast<int64_t>(step),
          accepts};
}

std::string describe(const PeerHeader& h) {
  const bool known = h.dtype < static_cast<int64_t>(at::ScalarType::NumOptions);
  return std::to_string(h.numel) + " elements of " +
         (known ? c10::toString(static_cast<at::ScalarType>(h.dtype)) : "dtype " + std::to_string(h.dtype)) +
         " at step " + std::to_string(h.step);
}

// Checks a peer's header before its message is received: well formed, for the same
// tensor and step as mine, and each message within what its receiver accepts. Both ends
// of a pair judge both messages from the same two headers, so they refuse together
// (exchange_neighbour_messages then moves no bytes between them) and each names the cause.
PeerHeaderCheck header_check(const PeerHeader& mine, int rank, const std::string& key) {
  return [mine, rank, &key](int peer, const std::vector<int64_t>& fields) {
    PeerHeader theirs;
    try {
      theirs = parse_peer_header(fields.data(), fields.size());
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "gradzip: rank ", peer, " sent rank ", rank, " ", e.what(), " for the tensor keyed '", key,
                  "'");
    }
    TORCH_CHECK(theirs.agrees_with(mine), "gradzip: gossip between ranks ", rank, " and ", peer,
                " for the tensor keyed '", key, "' does not match: rank ", rank, " has ", describe(mine), ", rank ",
                peer, " has ", describe(theirs), " (every rank must gossip the same tensors in the same order)");
    TORCH_CHECK(theirs.bytes <= mine.accepts, "gradzip: rank ", peer, " announced a message of ", theirs.bytes,
                " bytes for the tensor keyed '", key, "', where rank ", rank, " accepts at most ", mine.accepts,
                " (every rank must gossip with the same spec)");
    TORCH_CHECK(mine.bytes <= theirs.accepts, "gradzip: rank ", rank, "'s message of ", mine.bytes,
                " bytes for the tensor keyed '", key, "' is more than rank ", peer, " accepts (", theirs.accepts,
                "); rank ", peer, " refuses it (every rank must gossip with the same spec)");
  };
}

bool sent_finite(const PeerMessage& m) { return m.header[1] == 1; }

std::vector<int> ranks_of(const std::vector<Neighbour>& neighbours) {
  std::vector<int> ranks;
  for (const auto& n : neighbours) ranks.push_back(n.rank);
  return ranks;
}

int64_t bytes_received(const std::vector<PeerMessage>& messages) {
  int64_t total = 0;
  for (const auto& m : messages) total += m.bytes.numel() + kHeaderBytes;
  return total;
}

// Adds a payload (uint8, any device) into `target` (on the codec's device), as the
// codec's decode_add adds it. It goes through a slot of its own (aggregate/slots.h): the
// decoders read whole 8-byte words.
void add_payload(const SlotCodec& codec, const at::Tensor& payload, at::Tensor& target) {
  const int64_t size = payload.numel();
  const int64_t stride = kSlotHeaderBytes + padded_payload_bytes(size);
  at::Tensor slot = at::zeros({stride}, at::dtype(at::kByte).device(target.device()));
  slot.narrow(0, 0, kSlotHeaderBytes).view(at::kLong).fill_(size);
  slot.narrow(0, kSlotHeaderBytes, size).copy_(payload);
  codec.decode_add(slot, stride, 1, target);
}

// What one gossip call runs on: the group, its graph, and this tensor's state and step.
template <typename KeyState>
struct GossipCall {
  int size;
  int rank;
  const Topology& topology;
  KeyState& state;
  uint64_t step;
};

template <typename KeyState>
GossipCall<KeyState> begin_call(TopologyCache& topologies, std::mutex& mutex, std::map<std::string, KeyState>& states,
                                const c10::intrusive_ptr<c10d::Backend>& transport, const std::string& key) {
  const int size = transport->getSize();
  const Topology& topology = topologies.get(size);
  std::lock_guard<std::mutex> lock(mutex);
  KeyState& state = states[key];
  const auto step = static_cast<uint64_t>(state.calls++);
  return {size, transport->getRank(), topology, state, step};
}

}  // namespace

std::vector<SpecKey> topology_keys() {
  return {SpecKey::choice("topology", "exp", Topology::names(), "the graph (table below)"),
          SpecKey::choice("weights", "mh", {"mh", "uniform"},
                          "mh: Metropolis-Hastings, 1/(1 + max(deg_i, deg_j)); uniform: 1/(1 + the largest degree)"),
          SpecKey::text("edges", "", "topology=explicit only: the undirected edges, e.g. 0-1;1-2;2-3;3-0")};
}

void check_topology_spec(const Spec& spec) {
  if ((spec.get_string("topology") == "explicit") != spec.has("edges")) {
    throw SpecError("gradzip: spec '" + spec.str() + "': topology=explicit takes its graph from edges=a-b;c-d;... "
                    "and edges are only for topology=explicit");
  }
}

std::vector<SpecKey> choco_keys() {
  std::vector<SpecKey> keys = topology_keys();
  std::vector<std::string> codecs;
  for (const auto* record : codec_records()) codecs.push_back(record->name);
  keys.push_back(SpecKey::choice("compress", "sign", codecs, "the codec of the differences q = Q(x - x^); its keys follow"));
  keys.push_back(SpecKey::number("gamma", "", 0.0, 1.0,
                                 "required: the consensus step; the stronger the compression, the smaller"));
  keys.push_back(SpecKey::integer("seed", "0", 0, 9.2e18, "seeds the codec's random draws"));
  return keys;
}

void check_choco_spec(const Spec& spec) {
  check_topology_spec(spec);
  if (spec.get_string("topology") == "onepeer") {
    throw SpecError("gradzip: spec '" + spec.str() + "': choco keeps public copies of fixed neighbours, and onepeer "
                    "changes them every step; use ring, torus, exp, complete or explicit");
  }
  if (!spec.has("gamma")) {
    throw SpecError("gradzip: spec '" + spec.str() + "': choco needs gamma, its consensus step, in (0, 1]; the "
                    "stronger the compression the smaller (e.g. 0.5 for sign, 0.05 for topk at density 0.01)");
  }
}

void GossipState::save(const std::string& key, std::map<std::string, at::Tensor>& out) const {
  out[state_name(key, "calls")] = count_tensor(calls);
}

void GossipState::load(const std::string& field, const at::Tensor& value, const std::string& name) {
  if (field != "calls") unknown_state_field(name);
  calls = count_of(value, name);
}

void ChocoState::save(const std::string& key, std::map<std::string, at::Tensor>& out) const {
  out[state_name(key, "calls")] = count_tensor(calls);
  for (const auto& [rank, copy] : public_copies) {
    out[state_name(key, "public_copy_" + std::to_string(rank))] = copy.to(at::kCPU, false, /*copy=*/true);
  }
}

void ChocoState::load(const std::string& field, const at::Tensor& value, const std::string& name) {
  const std::string prefix = "public_copy_";
  if (field == "calls") {
    calls = count_of(value, name);
  } else if (field.rfind(prefix, 0) == 0 && field.size() > prefix.size() &&
             field.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
    public_copies[std::stoi(field.substr(prefix.size()))] = float_state(value, name);
  } else {
    unknown_state_field(name);
  }
}

const Topology& TopologyCache::get(int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = topologies_.find(size);
  if (it == topologies_.end()) it = topologies_.emplace(size, Topology::from_spec(spec_, size)).first;
  return it->second;
}

GossipAverage::GossipAverage(const BoundSpec& spec) : StatefulAggregation(spec), topologies_(spec.spec()) {}

c10::intrusive_ptr<c10d::Work> GossipAverage::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts,
                                                        const c10::intrusive_ptr<c10d::Backend>& transport,
                                                        Stats& stats, const std::string& key,
                                                        std::optional<bool>) {
  TORCH_CHECK(tensors.size() == 1, "gradzip: all_reduce takes one tensor, got ", tensors.size());
  at::Tensor& tensor = tensors.front();
  if (!averaged(tensor, opts)) return exact_allreduce(tensors, opts, transport, stats);
  const auto [size, rank, topology, state, step] = begin_call(topologies_, mutex_, states_, transport, key);
  const auto& neighbours = topology.neighbours(rank, step);
  const auto flat = tensor.detach().contiguous().view(-1);
  const auto bytes = flat.view(at::kByte);
  const auto header = message_header(bytes.numel(), true, tensor, step, bytes.numel());
  const auto messages = exchange_neighbour_messages(header.fields(), bytes, ranks_of(neighbours), transport,
                                            header_check(header, rank, key));

  // Sum the weighted terms in ascending rank order, this rank's own among them.
  const auto accumulate = tensor.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor sum;
  auto add = [&](const at::Tensor& x, double weight) {
    const auto term = x.to(accumulate);
    if (sum.defined()) {
      sum.add_(term, weight);
    } else {
      sum = term * weight;
    }
  };
  bool self_added = false;
  for (size_t p = 0; p < messages.size(); ++p) {
    if (!self_added && rank < messages[p].rank) {
      add(flat, topology.self_weight(rank, step));
      self_added = true;
    }
    add(messages[p].bytes.view(tensor.scalar_type()), neighbours[p].weight);
  }
  if (!self_added) add(flat, topology.self_weight(rank, step));
  if (opts.reduceOp.op_ == c10d::ReduceOp::SUM) sum.mul_(size);
  tensor.copy_(sum.view(tensor.sizes()));

  const int64_t peers = static_cast<int64_t>(neighbours.size());
  stats.add(peers * (bytes.numel() + kHeaderBytes), bytes_received(messages),
            ring_allreduce_bytes(tensor.numel() * 4, size));
  return completed_work(tensors);
}

ChocoGossip::ChocoGossip(const BoundSpec& spec)
    : StatefulAggregation(spec),
      topologies_(spec.spec()),
      codec_(spec.codec()),
      gamma_(spec.spec().get_double("gamma", 0.0)),
      seed_(static_cast<uint64_t>(spec.spec().get_int("seed"))) {}

c10::intrusive_ptr<c10d::Work> ChocoGossip::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts,
                                                      const c10::intrusive_ptr<c10d::Backend>& transport,
                                                      Stats& stats, const std::string& key, std::optional<bool>) {
  TORCH_CHECK(tensors.size() == 1, "gradzip: all_reduce takes one tensor, got ", tensors.size());
  at::Tensor& tensor = tensors.front();
  if (!averaged(tensor, opts)) return exact_allreduce(tensors, opts, transport, stats);
  const auto [size, rank, topology, state, step] = begin_call(topologies_, mutex_, states_, transport, key);
  const int64_t n = tensor.numel();
  const auto& neighbours = topology.neighbours(rank, step);
  // With a codec that has GPU kernels, a CUDA tensor's public copies live on its device.
  const at::Device device = codec_device(*codec_, tensor);
  const c10::OptionalDeviceGuard guard(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt);
  auto& copies = state.public_copies;
  auto copy_tensor = [&](int owner) -> at::Tensor& {
    auto& copy = copies[owner];
    if (!copy.defined()) copy = at::zeros({n}, at::dtype(at::kFloat).device(device));
    TORCH_CHECK(copy.numel() == n, "gradzip: the tensor keyed '", key, "' had ", copy.numel(),
                " elements and now has ", n, "; a key must always name a tensor of the same size");
    if (copy.device() != device) copy = copy.to(device);  // a loaded state comes from the host
#ifdef GRADZIP_WITH_CUDA
    if (copy.is_cuda()) record_on_current_stream(copy);
#endif
    return copy;
  };
  const auto codec = slot_codec(codec_, device);
  at::Tensor& mine = copy_tensor(rank);

  // q = Q(x - x^) goes to the neighbours; every holder of x^ adds the same decoded q.
  // A rank whose x holds Inf or NaN sends no q: no holder changes its copy of that rank.
  const at::Tensor x = tensor.detach().reshape({n}).to(device, at::kFloat).contiguous();
  const bool finite = at::isfinite(x).all().item<bool>();
  at::Tensor slot;
  at::Tensor bytes = at::empty({0}, at::dtype(at::kByte).device(tensor.device()));  // none when not finite
  if (finite) {
    slot = at::empty({codec->slot_bytes(n)}, at::dtype(at::kByte).device(device));
    codec->encode(x - mine, at::Tensor(), EncodeContext{seed_for_key(seed_, key), step, static_cast<uint32_t>(rank)},
                  slot);
    const int64_t size = slot.narrow(0, 0, kSlotHeaderBytes).view(at::kLong).item<int64_t>();
    bytes = slot.narrow(0, kSlotHeaderBytes, size).to(tensor.device());
  }
  const int64_t payload_bytes = bytes.numel();
  const auto header =
      message_header(payload_bytes, finite, tensor, step, static_cast<int64_t>(codec_->max_payload_bytes(n)));
  const auto messages = exchange_neighbour_messages(header.fields(), bytes, ranks_of(neighbours), transport,
                                            header_check(header, rank, key));

  bool all_sent = finite;
  if (finite) codec->decode_add(slot, slot.numel(), 1, mine);
  for (const auto& m : messages) {
    if (!sent_finite(m)) {
      all_sent = false;
      continue;
    }
    try {
      add_payload(*codec, m.bytes, copy_tensor(m.rank));
    } catch (const SlotError& e) {
      TORCH_CHECK(false, "gradzip: the choco payload of rank ", m.rank, " for the tensor keyed '", key,
                  "' cannot be decoded: ", e.what());
    }
  }

  const int64_t peers = static_cast<int64_t>(neighbours.size());
  stats.add(peers * (payload_bytes + kHeaderBytes), bytes_received(messages), ring_allreduce_bytes(n * 4, size));
  if (!all_sent) {  // this rank's input or a neighbour's held Inf or NaN: so does the result
    tensor.fill_(std::numeric_limits<float>::quiet_NaN());
    return completed_work(tensors);
  }

  // x += gamma * sum_j w_ij (x^_j - x^_i), neighbours in ascending rank order.
  at::Tensor delta = at::zeros({n}, x.options());
  for (const auto& neighbour : neighbours) delta.add_(copy_tensor(neighbour.rank) - mine, neighbour.weight);
  tensor.add_(delta.view(tensor.sizes()).to(tensor.device(), tensor.scalar_type()), gamma_);
  if (opts.reduceOp.op_ == c10d::ReduceOp::SUM) tensor.mul_(size);
  return completed_work(tensors);
}

}  // namespace gradzip
