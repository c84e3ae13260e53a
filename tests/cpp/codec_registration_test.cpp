// A codec defined in this file alone, registered with register_codec(), then driven
// through every door that reaches codecs by name or by wire id: make_codec, the payload
// decoders, spec binding (its keys, choco's compress=), and the backend's all_reduce over
// three ranks (one-shot and two-phase exchanges, error feedback in its state_dict) —
// the proof that docs/adding-a-codec.md's "its file pair and one registry line" holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "codec/codec_base.h"
#include "codec/wire.h"
#include "gradzip/backend.h"
#include "gradzip/bound_spec.h"

namespace gradzip {
namespace {

// int8: each element rounded to the nearest of `levels` steps of max|u| / levels each
// side of zero. Body: f32 step, n int8 codes.
struct Int8Parameters {
  int levels = 0;
};

constexpr auto kInt8Id = static_cast<CodecId>(200);

class Int8Codec final : public ValueCodec, public WithParameters<Int8Parameters> {
 public:
  explicit Int8Codec(const Int8Parameters& p) : ValueCodec(kInt8Id), WithParameters(p) {}
  bool biased() const override { return true; }
  size_t max_payload_bytes(int64_t n) const override { return kPayloadHeaderBytes + 4 + static_cast<size_t>(n); }

  void decode_add(const uint8_t* data, size_t size, float* out, int64_t n, float scale) const override {
    wire::Reader r(data, size, "int8");
    r.header(kInt8Id, n);
    const auto step = r.get<float>("step");
    const uint8_t* codes = r.at(r.take(static_cast<uint64_t>(n), "codes"));
    r.finish();
    for (int64_t i = 0; i < n; ++i) {
      const auto code = static_cast<int8_t>(codes[i]);
      if (std::abs(code) > parameters_.levels) r.fail("code " + std::to_string(code) + " is beyond the levels");
      out[i] += scale * (step * static_cast<float>(code));
    }
  }

 protected:
  void encode_values(const float* u, int64_t n, const EncodeContext&, std::vector<uint8_t>& out) const override {
    float most = 0.0f;
    for (int64_t i = 0; i < n; ++i) most = std::max(most, std::fabs(u[i]));
    const float step = most / static_cast<float>(parameters_.levels);
    wire::Writer w(out);
    w.header(id(), n);
    w.put<float>(step);
    uint8_t* codes = w.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      codes[i] = static_cast<uint8_t>(static_cast<int8_t>(step > 0 ? std::nearbyint(u[i] / step) : 0.0f));
    }
  }
};

const CodecRecord& int8_record() {
  static const CodecRecord record = {
      kInt8Id,
      "int8",
      "a test's codec: one signed byte per element, max|u| / levels apart",
      {SpecKey::integer("levels", "127", 1, 127, "steps each side of zero")},
      [](const Spec& spec) -> std::unique_ptr<Codec> {
        return std::make_unique<Int8Codec>(Int8Parameters{static_cast<int>(spec.get_int("levels"))});
      },
      nullptr,
  };
  return record;
}

void register_int8_once() {
  static std::once_flag once;
  std::call_once(once, [] { register_codec(int8_record()); });
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(gen);
  return x;
}

float largest_magnitude(const std::vector<float>& x) {
  float most = 0.0f;
  for (float v : x) most = std::max(most, std::fabs(v));
  return most;
}

TEST(CodecRegistrationTest, ARegisteredCodecIsMadeByNameAndDecodedById) {
  register_int8_once();
  const auto codec = make_codec(parse_spec("int8:levels=100"));
  EXPECT_EQ(codec->name(), "int8");
  const std::vector<float> x = random_values(1000, 1);
  std::vector<float> residual(x.size(), 0.0f);
  std::vector<uint8_t> payload;
  codec->encode(x.data(), 1000, residual.data(), {}, payload);
  EXPECT_EQ(payload.size(), codec->max_payload_bytes(1000));

  const float most = largest_magnitude(x);
  std::vector<float> decoded(1000, 0.0f);
  decode_payload_add(payload.data(), payload.size(), decoded.data(), 1000);  // the codec from the payload's id
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::fabs(decoded[i] - x[i]), most / 100 / 2 * 1.0001f) << i;
    ASSERT_EQ(residual[i], x[i] - decoded[i]) << i;  // error feedback keeps what was not sent
  }
  EXPECT_EQ(codec_for_payload(payload.data(), payload.size())->name(), "int8");

  payload.pop_back();
  EXPECT_THROW(codec->decode_add(payload.data(), payload.size(), decoded.data(), 1000), PayloadError);
}

TEST(CodecRegistrationTest, ARegisteredCodecBindsAsAnAggregationAndAsChocosCodec) {
  register_int8_once();
  const BoundSpec spec("int8:levels=50,ef=0,exchange=twophase");
  EXPECT_EQ(spec.codec_spec().str(), "int8:levels=50");
  EXPECT_FALSE(spec.error_feedback());
  const bool listed = std::any_of(aggregation_kinds().begin(), aggregation_kinds().end(),
                                  [](const AggregationKind& kind) { return kind.name == "int8"; });
  EXPECT_TRUE(listed);
  EXPECT_EQ(BoundSpec("choco:compress=int8,levels=9,gamma=0.5").codec_spec().str(), "int8:levels=9");
  try {
    BoundSpec("int8:density=0.1");
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("levels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BoundSpec("int8:levels=200"), SpecError);
}

TEST(CodecRegistrationTest, ANameOrIdTakenIsRefused) {
  register_int8_once();
  EXPECT_THROW(register_codec(int8_record()), std::invalid_argument);
  CodecRecord same_id = int8_record();
  same_id.name = "int8_again";
  EXPECT_THROW(register_codec(same_id), std::invalid_argument);
}

// A transport for ranks that are threads of this process: each call hands every rank's
// input to every rank, in rank order.
class Rendezvous {
 public:
  explicit Rendezvous(int size) : size_(size), deposits_(static_cast<size_t>(size)) {}

  // Every rank's `chunks`, once every rank has given its own.
  std::vector<std::vector<at::Tensor>> exchange(int rank, std::vector<at::Tensor> chunks) {
    std::unique_lock lock(mutex_);
    const uint64_t generation = generation_;
    deposits_[static_cast<size_t>(rank)] = std::move(chunks);
    if (++arrived_ == size_) {
      last_ = std::move(deposits_);
      deposits_.assign(static_cast<size_t>(size_), {});
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation; });
    }
    return last_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const int size_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::vector<at::Tensor>> deposits_, last_;
};

c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> tensors) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(tensors));
  return c10d::Work::create_from_future(future);
}

class ThreadTransport final : public c10d::Backend {
 public:
  ThreadTransport(int rank, int size, Rendezvous& rendezvous) : c10d::Backend(rank, size), rendezvous_(rendezvous) {}
  const std::string getBackendName() const override { return "threads"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    for (auto& t : tensors) {
      const auto all = rendezvous_.exchange(getRank(), {t.clone()});
      at::Tensor acc = all[0][0].clone();
      for (size_t r = 1; r < all.size(); ++r) {
        const at::Tensor& other = all[r][0];
        if (opts.reduceOp == c10d::ReduceOp::SUM) acc.add_(other);
        else if (opts.reduceOp == c10d::ReduceOp::MIN) acc = at::minimum(acc, other);
        else if (opts.reduceOp == c10d::ReduceOp::MAX) acc = at::maximum(acc, other);
        else TORCH_CHECK(false, "ThreadTransport: reduce op ", opts.reduceOp.op_, " is not implemented");
      }
      t.copy_(acc);
    }
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions&) override {
    const auto all = rendezvous_.exchange(getRank(), {in.clone()});
    std::vector<at::Tensor> parts;
    for (const auto& chunks : all) parts.push_back(chunks[0].reshape(-1));
    out.view(-1).copy_(at::cat(parts));
    return completed({out});
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions&) override {
    const auto size = static_cast<size_t>(getSize());
    std::vector<int64_t> splits = in_splits;
    if (splits.empty()) splits.assign(size, in.size(0) / getSize());
    const auto all = rendezvous_.exchange(getRank(), in.split_with_sizes(splits));
    std::vector<at::Tensor> mine;
    for (const auto& chunks : all) mine.push_back(chunks[static_cast<size_t>(getRank())]);
    const at::Tensor gathered = at::cat(mine);
    TORCH_CHECK(out_splits.empty() || gathered.size(0) == out.size(0), "ThreadTransport: output splits mismatch");
    out.copy_(gathered);
    return completed({out});
  }

 private:
  Rendezvous& rendezvous_;
};

// Runs `rank_fn(rank)` on `size` threads; returns each rank's result.
template <class Fn>
auto on_ranks(int size, Fn rank_fn) {
  std::vector<decltype(rank_fn(0))> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = rank_fn(r); });
  for (auto& t : threads) t.join();
  return results;
}

TEST(CodecRegistrationTest, ARegisteredCodecAggregatesOverTheBackend) {
  register_int8_once();
  constexpr int kRanks = 3;
  constexpr int64_t kN = 3000;
  for (const std::string exchange : {"oneshot", "twophase"}) {
    Rendezvous rendezvous(kRanks);
    const std::string text = "int8:levels=60,exchange=" + exchange;
    const auto results = on_ranks(kRanks, [&](int rank) {
      auto transport = c10::make_intrusive<ThreadTransport>(rank, kRanks, rendezvous);
      auto backend = make_backend(rank, kRanks, transport, nullptr, BoundSpec(text), /*validate=*/false,
                                  std::chrono::milliseconds(10000));
      const std::vector<float> x = random_values(kN, 10 + static_cast<uint32_t>(rank));
      std::vector<at::Tensor> tensors = {at::from_blob(const_cast<float*>(x.data()), {kN}, at::kFloat).clone()};
      backend->allreduce(tensors, {})->wait();
      const auto state = backend->state_dict();
      return std::make_pair(tensors[0], state.size());
    });
    // The sum of the ranks' payloads, decoded in rank order (one-shot sends each once).
    const auto codec = make_codec(parse_spec("int8:levels=60"));
    std::vector<float> expected(kN, 0.0f), dense(kN, 0.0f);
    double largest_sum = 0;  // Σ over ranks of max|x_r|
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> x = random_values(kN, 10 + static_cast<uint32_t>(r));
      std::vector<uint8_t> payload;
      codec->encode(x.data(), kN, nullptr, {}, payload);
      codec->decode_add(payload.data(), payload.size(), expected.data(), kN);
      for (int64_t i = 0; i < kN; ++i) dense[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
      largest_sum += largest_magnitude(x);
    }
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(at::equal(results[r].first, results[0].first)) << exchange << ": rank " << r << " differs";
      EXPECT_GT(results[r].second, 0u) << exchange << ": error feedback (on for a biased codec) keeps a residual";
    }
    const at::Tensor want = at::from_blob(expected.data(), {kN}, at::kFloat);
    const at::Tensor exact = at::from_blob(dense.data(), {kN}, at::kFloat);
    if (exchange == "oneshot") EXPECT_TRUE(at::equal(results[0].first, want));
    EXPECT_FALSE(at::equal(results[0].first, exact)) << exchange << ": the sum went uncompressed";
    // Half a step of each rank's, and (two-phase: each chunk's sum compressed once more)
    // half a step of the sum's.
    const double bound = (largest_sum + at::max(exact.abs()).item<double>()) / 60 / 2 * 1.001;
    EXPECT_LE(at::max((results[0].first - exact).abs()).item<double>(), bound) << exchange;
  }
}

}  // namespace
}  // namespace gradzip
