// The GPU codecs against the CPU codecs: the same payload bytes and residuals for the
// same input, and bitwise the same decode-accumulated sums. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "codec/bitpack.h"
#include "codec/codec_base.h"
#include "codec/codec_record.h"
#include "codec/position_coding.h"
#include "codec/wire.h"
#include "cuda/cuda_check.h"
#include "cuda/device_codec.h"

namespace gradzip::cuda {
namespace {

class CudaArena final : public DeviceArena {
 public:
  ~CudaArena() override {
    cudaDeviceSynchronize();
    for (void* p : held_) cudaFree(p);
  }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
    held_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> held_;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device here (cudaGetDeviceCount: "
                   << (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status))
                   << "); benchmarks/gpu.sh runs these on a GPU machine";
    }
  }
};

std::vector<float> random_input(int64_t n, uint32_t seed, bool ties = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = ties ? std::round(normal(rng) * 2.0f) : normal(rng);  // ties: few distinct values
  return x;
}

// Inputs that reach the corners of the kernels: every element a signed zero; a ReLU
// output (half exact zeros, ties at 0); denormals among normal values; ±Inf and NaN
// and values past fp16's range or near float's largest (for the codecs that send values
// raw or cast, whose bytes are defined for them: no sums that overflow). The
// NaN is 0x7fffffff, CUDA's own: x86 arithmetic passes an operand's NaN on and CUDA's
// returns that one, so u = residual + x and the payloads that carry u match bit for bit.
enum class Corner { kZeros, kRelu, kDenormals, kNonFinite, kExtremes };
const float kCudaNan = std::bit_cast<float>(uint32_t{0x7fffffff});

std::vector<float> corner_input(int64_t n, Corner corner, uint32_t seed) {
  std::vector<float> x = random_input(n, seed);
  for (int64_t i = 0; i < n; ++i) {
    switch (corner) {
      case Corner::kZeros: x[i] = i % 3 == 0 ? -0.0f : 0.0f; break;
      case Corner::kRelu: x[i] = std::max(x[i], 0.0f); break;
      case Corner::kDenormals: if (i % 2 == 0) x[i] *= 1e-39f; break;
      case Corner::kNonFinite:
        if (i % 7 == 1) x[i] = i % 2 ? INFINITY : -INFINITY;
        if (i % 11 == 3) x[i] = kCudaNan;
        break;
      case Corner::kExtremes:  // past fp16's 65504, near float's largest, fp16 subnormals
        if (i % 5 == 0) x[i] *= 1e5f;
        if (i % 5 == 1) x[i] = i % 2 ? 3.4e38f : -3.4e38f;
        if (i % 5 == 2) x[i] *= 3e-5f;
        break;
    }
  }
  return x;
}

float* upload(CudaArena& arena, const std::vector<float>& v) {
  auto* d = static_cast<float*>(arena.allocate(4 * v.size()));
  check(cudaMemcpy(d, v.data(), 4 * v.size(), cudaMemcpyHostToDevice), "upload");
  return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t count) {
  std::vector<T> h(count);
  check(cudaMemcpy(h.data(), d, sizeof(T) * count, cudaMemcpyDeviceToHost), "download");
  return h;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

// Bitwise equal, except that a NaN matches any NaN (x86 propagates an operand's NaN, CUDA
// returns its canonical one: docs/cuda.md, "Same bytes as the CPU").
bool same_bits_or_both_nan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], 4) != 0) return false;
  }
  return true;
}

// Encodes x on the CPU and the GPU and compares the payloads' bytes and the residuals.
void expect_encoders_agree(const char* text, const std::vector<float>& x, bool feedback, const std::string& what) {
  const Spec spec = parse_spec(text);
  const auto cpu = make_codec(spec);
  const auto n = static_cast<int64_t>(x.size());
  CudaArena arena;
  std::vector<float> residual = feedback ? random_input(n, 99) : std::vector<float>();
  const EncodeContext ctx{42, 3, 1};
  float* d_x = upload(arena, x);
  float* d_residual = feedback ? upload(arena, residual) : nullptr;
  std::vector<uint8_t> expected;
  cpu->encode(x.data(), n, feedback ? residual.data() : nullptr, ctx, expected);
  const DevicePayload got = device_encode(*cpu, d_x, n, d_residual, ctx, arena, nullptr);
  check(cudaDeviceSynchronize(), "encode");
  ASSERT_EQ(download(got.data, got.size), expected) << text << " n=" << n << " " << what << " ef=" << feedback;
  if (feedback) {
    ASSERT_TRUE(same_bits_or_both_nan(download(d_residual, n), residual)) << text << " n=" << n << " " << what;
  }
}

// Densities 1/n (k = 1 below 10^9 elements), 0.1%, 1%, 30%, 50% and 100%; sign blocks
// of 0 (plain signs), 100 (two passes), 512 and 1024 (fused); QSGD widths 3, 4, 8 and 16
// bits, buckets 100, 512 and 1024 (16-bit codes at 1024: the fused kernel's largest
// shared-memory stage).
const char* const kSpecs[] = {
    "topk:density=0.01", "topk:density=0.001", "topk:density=0.3", "topk:density=0.01,approx=1",
    "topk:density=1", "topk:density=0.000000001",
    "stc:density=0.01",  "stc:density=0.001",  "stc:density=0.5",  "stc:density=0.01,approx=1",
    "stc:density=1", "stc:density=0.000000001",
    "sign",              "sign:block=100",     "sign:vote=majority", "sign:block=0", "sign:block=1024",
    "qsgd", "qsgd:bits=8",       "qsgd:levels=5,bucket=100", "qsgd:norm=max,bits=3", "qsgd:bits=16,bucket=1024",
    "qsgd:bucket=1024", "identity", "fp16", "bf16",
    "uniform",           "uniform:threshold=0", "uniform:threshold=0,rounding=nearest",
    "randomk:density=0.01", "randomk:density=0.3,unbiased=0", "randomk:density=1",
    "topk:density=0.01,values=fp16", "topk:density=0.3,values=fp16", "topk:density=0.3,values=bf16",
    "topk:density=0.01,values=fp16,approx=1"};

// Sizes on both sides of warp (32), block (256, 1024) and word boundaries, and a grid of
// thousands of blocks. GRADZIP_CUDA_TEST_QUICK (compute-sanitizer's runs) stops at 100003.
std::vector<int64_t> test_sizes() {
  std::vector<int64_t> sizes = {0, 1, 7, 31, 32, 33, 1000, 1023, 1025, 4099, 100003};
  if (!std::getenv("GRADZIP_CUDA_TEST_QUICK")) sizes.push_back((int64_t{1} << 20) + 7);
  return sizes;
}

bool decodes_in_one_pass(const Codec& codec) { return codec_record(codec.id()).device->queue_decode_rows != nullptr; }

TEST_F(CudaKernelsTest, EncodersWriteTheCpuBytesAndResiduals) {
  for (const char* text : kSpecs) {
    for (int64_t n : test_sizes()) {
      for (bool ties : {false, true}) {
        for (bool feedback : {false, true}) {
          ASSERT_NO_FATAL_FAILURE(expect_encoders_agree(text, random_input(n, static_cast<uint32_t>(n) + 3, ties),
                                                        feedback, ties ? "ties" : "random"));
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, EncodersAgreeOnZerosReluDenormalsAndNonFiniteValues) {
  const std::vector<std::string> raw = {"topk:density=0.01", "topk:density=0.3", "identity", "fp16", "bf16",
                                        "topk:density=0.01,values=fp16", "topk:density=0.3,values=fp16",
                                        "topk:density=0.3,values=bf16"};
  for (const char* text : kSpecs) {
    const bool sends_raw = std::find(raw.begin(), raw.end(), text) != raw.end();
    for (int64_t n : {int64_t{33}, int64_t{4099}, int64_t{100003}}) {
      for (Corner corner : {Corner::kZeros, Corner::kRelu, Corner::kDenormals, Corner::kNonFinite, Corner::kExtremes}) {
        if ((corner == Corner::kNonFinite || corner == Corner::kExtremes) && !sends_raw) continue;
        for (bool feedback : {false, true}) {
          ASSERT_NO_FATAL_FAILURE(expect_encoders_agree(text, corner_input(n, corner, 17), feedback,
                                                        "corner " + std::to_string(static_cast<int>(corner))));
        }
      }
    }
  }
}

// Payload rows in device memory, `stride` bytes apart.
struct Rows {
  uint8_t* data;
  size_t stride;
  std::vector<size_t> sizes;
};

Rows upload_rows(CudaArena& arena, const std::vector<std::vector<uint8_t>>& payloads) {
  Rows rows{nullptr, 8, {}};
  for (const auto& p : payloads) rows.stride = std::max(rows.stride, (p.size() + 7) / 8 * 8);
  std::vector<uint8_t> bytes(payloads.size() * rows.stride, 0);
  for (size_t r = 0; r < payloads.size(); ++r) {
    std::memcpy(bytes.data() + r * rows.stride, payloads[r].data(), payloads[r].size());
    rows.sizes.push_back(payloads[r].size());
  }
  rows.data = static_cast<uint8_t*>(arena.allocate(bytes.size()));
  check(cudaMemcpy(rows.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
  return rows;
}

// What device_decode_add must leave in out: the host's decode_add(..., scale) of each
// payload in order (one-pass codecs, or scale 1), else start + scale × the unscaled sum.
std::vector<float> expected_sum(const std::vector<std::vector<uint8_t>>& payloads, const std::vector<float>& start,
                                float scale, bool one_pass) {
  const auto n = static_cast<int64_t>(start.size());
  std::vector<float> out = start;
  if (one_pass || scale == 1.0f) {
    for (const auto& p : payloads) decode_payload_add(p.data(), p.size(), out.data(), n, scale);
    return out;
  }
  std::vector<float> terms(n, 0.0f);
  for (const auto& p : payloads) decode_payload_add(p.data(), p.size(), terms.data(), n);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + scale * terms[i];
  return out;
}

TEST_F(CudaKernelsTest, DecodeAccumulateIsTheCpuSumInRankOrder) {
  std::vector<int64_t> sizes = {0, 1, 33, 1025, 4099};
  if (!std::getenv("GRADZIP_CUDA_TEST_QUICK")) sizes.push_back((int64_t{1} << 20) + 7);
  for (const char* text : kSpecs) {
    const auto cpu = make_codec(parse_spec(text));
    for (int64_t n : sizes) {
      std::vector<std::vector<uint8_t>> payloads(8);
      for (uint32_t r = 0; r < 8; ++r) {
        cpu->encode(random_input(n, 7 * r + 1).data(), n, nullptr, {5, 0, r}, payloads[r]);
      }
      for (float scale : {1.0f, 0.125f}) {
        for (bool set : {false, true}) {
          CudaArena arena;
          const Rows rows = upload_rows(arena, payloads);
          const std::vector<float> start = set ? std::vector<float>(n, 0.0f) : random_input(n, 1234);
          float* d_sum = upload(arena, set ? std::vector<float>(n, 7.5f) : start);  // set: nothing of it read
          device_decode_add(cpu->id(), rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr, scale, set);
          ASSERT_TRUE(same_bits(download(d_sum, n), expected_sum(payloads, start, scale, decodes_in_one_pass(*cpu))))
              << text << " n=" << n << " scale=" << scale << " set=" << set;
        }
      }
    }
  }
}

// Rows that a one-pass decoder cannot take together (other blocks, other levels of the
// same width) are decoded one by one by it, each term scaled as the host scales it.
TEST_F(CudaKernelsTest, RowsLaidOutDifferentlyDecodeOneByOne) {
  const int64_t n = 4099;
  for (const auto& [a, b] : {std::pair{"sign:block=100", "sign"}, std::pair{"qsgd:levels=5", "qsgd:levels=6"},
                             std::pair{"qsgd:bucket=512", "qsgd:bucket=1024"}}) {
    std::vector<std::vector<uint8_t>> payloads(4);
    for (uint32_t r = 0; r < 4; ++r) {
      make_codec(parse_spec(r % 2 ? b : a))->encode(random_input(n, r + 40).data(), n, nullptr, {5, 0, r}, payloads[r]);
    }
    for (float scale : {1.0f, 0.25f}) {
      CudaArena arena;
      const Rows rows = upload_rows(arena, payloads);
      const std::vector<float> start(n, 0.0f);
      float* d_sum = upload(arena, start);
      device_decode_add(make_codec(parse_spec(a))->id(), rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr,
                        scale, true);
      ASSERT_TRUE(same_bits(download(d_sum, n), expected_sum(payloads, start, scale, true))) << a << " " << b;
    }
  }
}

// Selections clustered at the tensor's end, but for one large element early on: the
// second position's Golomb code starts inside the first one's word and is a unary run of
// up to hundreds of whole words (stored plainly by one thread), which the decoder's
// segments lie inside of.
TEST_F(CudaKernelsTest, ClusteredSelectionsCodeLongUnaryRuns) {
  std::vector<int64_t> sizes = {4099, 100003};
  if (!std::getenv("GRADZIP_CUDA_TEST_QUICK")) sizes.push_back((int64_t{1} << 20) + 7);
  for (const char* text : {"stc:density=0.01", "topk:density=0.01,values=fp16", "stc:density=0.001"}) {
    const auto cpu = make_codec(parse_spec(text));
    for (int64_t n : sizes) {
      std::vector<std::vector<uint8_t>> payloads(4);
      for (uint32_t r = 0; r < 4; ++r) {
        std::vector<float> x = random_input(n, r + 60);
        for (int64_t i = 0; i < n - n / 50 - static_cast<int64_t>(r); ++i) x[i] *= 1e-3f;  // the large ones last
        x[5 + r] = 50.0f;  // and one early: the long run starts mid-word
        ASSERT_NO_FATAL_FAILURE(expect_encoders_agree(text, x, false, "clustered"));
        cpu->encode(x.data(), n, nullptr, {5, 0, r}, payloads[r]);
      }
      CudaArena arena;
      const Rows rows = upload_rows(arena, payloads);
      const std::vector<float> start(n, 0.0f);
      float* d_sum = upload(arena, start);
      device_decode_add(cpu->id(), rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr, 1.0f, true);
      ASSERT_TRUE(same_bits(download(d_sum, n), expected_sum(payloads, start, 1.0f, false))) << text << " n=" << n;
    }
  }
}

// A Golomb position stream of about 32M bits (STC at 10% of 2^26 + 7 elements: b = 3,
// about 975 groups of 32768 bits, two chunks of group tables for the chaining kernel)
// decodes as on the CPU.
TEST_F(CudaKernelsTest, LongGolombStreamsDecode) {
  if (std::getenv("GRADZIP_CUDA_TEST_QUICK")) GTEST_SKIP() << "GRADZIP_CUDA_TEST_QUICK: the long stream is left out";
  const int64_t n = (int64_t{1} << 26) + 7;
  const auto cpu = make_codec(parse_spec("stc:density=0.1"));
  std::vector<std::vector<uint8_t>> payloads(1);
  cpu->encode(random_input(n, 8).data(), n, nullptr, {5, 0, 0}, payloads[0]);
  CudaArena arena;
  const Rows rows = upload_rows(arena, payloads);
  const std::vector<float> start(n, 0.0f);
  float* d_sum = upload(arena, start);
  device_decode_add(cpu->id(), rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr, 1.0f, true);
  ASSERT_TRUE(same_bits(download(d_sum, n), expected_sum(payloads, start, 1.0f, false)));
}

// An STC payload built by hand with the largest Golomb parameter, b = 40 (41 states: 49
// groups' tables per chunk of the chaining kernel), and 40000 gaps of 1: 1.64M bits, 50
// groups, so the chain crosses a chunk at a size the sanitizer runs take too. The CPU
// decoder takes it (b is the payload's to choose).
TEST_F(CudaKernelsTest, GolombChainCrossesChunksAtTheLargestParameter) {
  const int64_t n = 100003, k = 40000;
  const int b = kMaxGolombParameter;
  std::vector<uint8_t> golomb;
  bitpack::BitWriter bits(golomb);
  for (int64_t j = 0; j < k; ++j) {
    bits.put(0, 1);  // no unary part: every gap is 1
    bits.put(1, b);
  }
  bits.flush();
  std::vector<std::vector<uint8_t>> payloads(2);
  for (uint32_t r = 0; r < 2; ++r) {
    wire::Writer w(payloads[r]);
    w.header(CodecId::kStc, static_cast<uint64_t>(n));
    w.put<uint64_t>(static_cast<uint64_t>(k));
    w.put<float>(0.5f + static_cast<float>(r));
    w.put<uint8_t>(kGolombPositions);
    w.put<uint8_t>(static_cast<uint8_t>(b));
    w.put<uint64_t>(golomb.size());
    std::memcpy(w.reserve(golomb.size()), golomb.data(), golomb.size());
    uint8_t* signs = w.reserve(wire::bytes_for_bits(static_cast<uint64_t>(k)));
    for (int64_t j = 0; j < k; ++j) signs[j / 8] |= static_cast<uint8_t>(((j * 7 + r) % 3 == 0) << (j % 8));
  }
  CudaArena arena;
  const Rows rows = upload_rows(arena, payloads);
  const std::vector<float> start(n, 0.0f);
  float* d_sum = upload(arena, start);
  device_decode_add(CodecId::kStc, rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr, 1.0f, true);
  const std::vector<float> expected = expected_sum(payloads, start, 1.0f, false);
  ASSERT_NE(expected[1], 0.0f);  // the CPU took the payloads
  ASSERT_TRUE(same_bits(download(d_sum, n), expected));
}

// Top-k's pass 1 gathers the boundary bucket's indices per block in shared memory and
// flushes them when a step could overflow the buffer: here the boundary bucket holds 3%
// of 2^25 + 5 elements (about 1M, under the n/32 the candidate list takes), about 1900
// per block, so every block flushes mid-way. The selection must still be the CPU's.
TEST_F(CudaKernelsTest, TopKCandidatesOutnumberABlocksBuffer) {
  if (std::getenv("GRADZIP_CUDA_TEST_QUICK")) GTEST_SKIP() << "GRADZIP_CUDA_TEST_QUICK: 2^25 elements are left out";
  const int64_t n = (int64_t{1} << 25) + 5;
  std::vector<float> x = random_input(n, 11);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> boundary(2.5f, 2.7f);  // one bucket of pass 0: [2.5, 2.75)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = i % 200;
    if (slot == 0) x[i] = 100.0f + static_cast<float>(i % 1000);  // 0.5%: above the boundary
    else if (slot <= 6) x[i] = i % 2 ? boundary(rng) : -boundary(rng);  // 3%: the boundary bucket
    else x[i] = std::fmod(x[i], 1.0f);  // below it
  }
  for (const char* text : {"topk:density=0.01", "stc:density=0.01"}) {
    for (bool feedback : {false, true}) ASSERT_NO_FATAL_FAILURE(expect_encoders_agree(text, x, feedback, "candidates"));
  }
}

// Bit offsets past 2^31 (16-bit QSGD codes of 2^27 + 33 elements: 2^31 + 528 bits):
// encode and decode against the CPU. Needs about 2 GB of device memory.
TEST_F(CudaKernelsTest, BitOffsetsBeyond2To31) {
  if (std::getenv("GRADZIP_CUDA_TEST_QUICK")) GTEST_SKIP() << "GRADZIP_CUDA_TEST_QUICK: the 2^31-bit case is left out";
  const int64_t n = (int64_t{1} << 27) + 33;
  const char* text = "qsgd:bits=16,bucket=1024";
  std::vector<float> x = random_input(n, 5);
  ASSERT_NO_FATAL_FAILURE(expect_encoders_agree(text, x, false, "2^31 bits"));
  std::vector<std::vector<uint8_t>> payloads(1);
  make_codec(parse_spec(text))->encode(x.data(), n, nullptr, {5, 0, 0}, payloads[0]);
  x.clear();
  CudaArena arena;
  const Rows rows = upload_rows(arena, payloads);
  const std::vector<float> start(n, 0.0f);
  float* d_sum = upload(arena, start);
  device_decode_add(CodecId::kQsgd, rows.data, rows.stride, rows.sizes, d_sum, n, arena, nullptr, 1.0f, true);
  ASSERT_TRUE(same_bits(download(d_sum, n), expected_sum(payloads, start, 1.0f, true)));
}

// The payload heads of rows further apart than a 2-D copy's pitch allows (2 GiB: slots of
// half a billion fp32 elements) are read row by row, the same bytes as rows close
// together through the 2-D copy. Needs about 4.3 GB of device memory.
TEST_F(CudaKernelsTest, RowHeadsPastThe2DCopysPitchAreReadRowByRow) {
  if (std::getenv("GRADZIP_CUDA_TEST_QUICK")) GTEST_SKIP() << "GRADZIP_CUDA_TEST_QUICK: the 4 GB rows are left out";
  int device = 0, max_pitch = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device), "cudaDeviceGetAttribute");
  const size_t far = (static_cast<size_t>(max_pitch) + 8 + 7) / 8 * 8, near = size_t{1} << 20, bytes = 64;
  const int count = 2;
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  if (free_bytes < far * count + (size_t{256} << 20)) GTEST_SKIP() << "this GPU has less than 4.3 GB free";
  CudaArena arena;
  auto* rows = static_cast<uint8_t*>(arena.allocate(far * count));
  std::vector<uint8_t> expected(bytes * count);
  for (size_t stride : {near, far}) {
    for (int r = 0; r < count; ++r) {
      for (size_t b = 0; b < bytes; ++b) expected[bytes * r + b] = static_cast<uint8_t>(31 * r + 7 * b + stride % 251);
      check(cudaMemcpy(rows + stride * r, expected.data() + bytes * r, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    EXPECT_EQ(read_row_prefixes(rows, stride, count, bytes, nullptr), expected) << "rows " << stride << " bytes apart";
  }
}

TEST_F(CudaKernelsTest, InvalidPayloadsAreRefusedNamingTheirRank) {
  const int64_t n = 1000;
  const auto x = random_input(n, 5);
  for (const char* text :
       {"topk:density=0.05", "stc:density=0.05", "qsgd:levels=5", "sign", "topk:density=0.05,values=fp16"}) {
    const Spec spec = parse_spec(text);
    std::vector<uint8_t> good, bad;
    make_codec(spec)->encode(x.data(), n, nullptr, {}, good);
    bad = good;
    const bool compact = std::string(text).find("values=fp16") != std::string::npos;
    if (spec.name == "topk" && !compact) std::swap(bad[25], bad[29]);  // the first two indices out of order
    if (compact) {  // every position bit a one: a Golomb run past the tensor
      uint64_t position_bytes;
      std::memcpy(&position_bytes, bad.data() + 28, 8);
      std::fill(bad.begin() + 36, bad.begin() + 36 + static_cast<int64_t>(position_bytes), uint8_t{0xff});
    }
    if (spec.name == "stc") {  // every position bit a one: a Golomb run past the tensor
      uint64_t position_bytes;
      std::memcpy(&position_bytes, bad.data() + 30, 8);
      std::fill(bad.begin() + 38, bad.begin() + 38 + static_cast<int64_t>(position_bytes), uint8_t{0xff});
    }
    if (spec.name == "qsgd") bad[24 + 4 * 2] = 0x77;      // two 4-bit codes of level 7 > s = 5
    if (spec.name == "sign") bad[8] ^= 1;                   // the element count: no longer the tensor's
    bool threw = false;
    CudaArena arena;
    const size_t stride = (good.size() + 7) / 8 * 8;
    std::vector<uint8_t> rows(2 * stride, 0);
    std::memcpy(rows.data(), good.data(), good.size());
    std::memcpy(rows.data() + stride, bad.data(), bad.size());
    auto* d_rows = static_cast<uint8_t*>(arena.allocate(rows.size()));
    check(cudaMemcpy(d_rows, rows.data(), rows.size(), cudaMemcpyHostToDevice), "upload");
    float* d_sum = upload(arena, std::vector<float>(n, 0.0f));
    std::vector<float> cpu_out(n, 0.0f);
    bool cpu_threw = false;
    try {
      make_codec(spec)->decode_add(bad.data(), bad.size(), cpu_out.data(), n);
    } catch (const PayloadError&) {
      cpu_threw = true;
    }
    ASSERT_TRUE(cpu_threw) << text << ": the corruption left a valid payload; the test checks nothing";
    try {
      device_decode_add(make_codec(spec)->id(), d_rows, stride, {good.size(), bad.size()}, d_sum, n, arena, nullptr);
    } catch (const RankPayloadError& e) {
      threw = true;
      EXPECT_EQ(e.rank(), 1) << text;
    }
    EXPECT_EQ(threw, cpu_threw) << text << ": the GPU and the CPU decoders disagree on a corrupt payload";
  }
}

}  // namespace
}  // namespace gradzip::cuda
