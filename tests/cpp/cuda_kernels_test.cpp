// The GPU codecs against the CPU codecs: the same payload bytes and residuals for the
// same input, and bitwise the same decode-accumulated sums. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/codec_base.h"
#include "cuda_check.h"
#include "device_codec.h"

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

const char* const kSpecs[] = {
    "topk:density=0.01", "topk:density=0.001", "topk:density=0.3", "topk:density=0.01,approx=1",
    "stc:density=0.01",  "stc:density=0.001",  "stc:density=0.5",  "stc:density=0.01,approx=1",
    "sign",              "sign:block=100",     "sign:vote=majority", "qsgd",
    "qsgd:bits=8",       "qsgd:levels=5,bucket=100", "qsgd:norm=max,bits=3", "identity", "fp16", "bf16",
    "uniform",           "uniform:threshold=0", "uniform:threshold=0,rounding=nearest"};
const int64_t kSizes[] = {0, 1, 7, 1000, 4099, 100003, int64_t{1} << 20};

TEST_F(CudaKernelsTest, EncodersWriteTheCpuBytesAndResiduals) {
  cudaStream_t stream = nullptr;
  for (const char* text : kSpecs) {
    const Spec spec = parse_spec(text);
    const auto cpu = make_codec(spec);
    for (int64_t n : kSizes) {
      for (bool ties : {false, true}) {
        for (bool feedback : {false, true}) {
          CudaArena arena;
          const auto x = random_input(n, static_cast<uint32_t>(n) + 3, ties);
          std::vector<float> residual = feedback ? random_input(n, 99) : std::vector<float>();
          const EncodeContext ctx{42, 3, 1};
          float* d_x = upload(arena, x);
          float* d_residual = feedback ? upload(arena, residual) : nullptr;
          std::vector<uint8_t> expected;
          cpu->encode(x.data(), n, feedback ? residual.data() : nullptr, ctx, expected);
          const DevicePayload got = device_encode(*cpu, d_x, n, d_residual, ctx, arena, stream);
          check(cudaDeviceSynchronize(), "encode");
          const auto bytes = download(got.data, got.size);
          ASSERT_EQ(bytes, expected) << text << " n=" << n << " ties=" << ties << " ef=" << feedback;
          if (feedback) {
            ASSERT_TRUE(same_bits(download(d_residual, n), residual)) << text << " n=" << n << " ties=" << ties;
          }
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, DecodeAccumulateIsTheCpuSumInRankOrder) {
  for (const char* text : kSpecs) {
    const Spec spec = parse_spec(text);
    const auto cpu = make_codec(spec);
    for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{4099}, int64_t{1} << 20}) {
      CudaArena arena;
      std::vector<std::vector<uint8_t>> payloads(4);
      size_t stride = 8;
      for (uint32_t r = 0; r < 4; ++r) {
        const auto x = random_input(n, 7 * r + 1);
        cpu->encode(x.data(), n, nullptr, {5, 0, r}, payloads[r]);
        stride = std::max(stride, (payloads[r].size() + 7) / 8 * 8);
      }
      std::vector<uint8_t> rows(4 * stride, 0);
      std::vector<size_t> sizes;
      for (int r = 0; r < 4; ++r) {
        std::memcpy(rows.data() + r * stride, payloads[r].data(), payloads[r].size());
        sizes.push_back(payloads[r].size());
      }
      auto* d_rows = static_cast<uint8_t*>(arena.allocate(rows.size()));
      check(cudaMemcpy(d_rows, rows.data(), rows.size(), cudaMemcpyHostToDevice), "upload");
      std::vector<float> expected(n, 0.0f);
      for (const auto& p : payloads) cpu->decode_add(p.data(), p.size(), expected.data(), n);
      float* d_sum = upload(arena, std::vector<float>(n, 0.0f));
      device_decode_add(make_codec(spec)->id(), d_rows, stride, sizes, d_sum, n, arena, nullptr);
      ASSERT_TRUE(same_bits(download(d_sum, n), expected)) << text << " n=" << n;
    }
  }
}

TEST_F(CudaKernelsTest, InvalidPayloadsAreRefusedNamingTheirRank) {
  const int64_t n = 1000;
  const auto x = random_input(n, 5);
  for (const char* text : {"topk:density=0.05", "stc:density=0.05", "qsgd:levels=5"}) {
    const Spec spec = parse_spec(text);
    std::vector<uint8_t> good, bad;
    make_codec(spec)->encode(x.data(), n, nullptr, {}, good);
    bad = good;
    if (spec.name == "topk") std::swap(bad[25], bad[29]);  // the first two indices out of order
    if (spec.name == "stc") {  // every position bit a one: a Golomb run past the tensor
      uint64_t position_bytes;
      std::memcpy(&position_bytes, bad.data() + 30, 8);
      std::fill(bad.begin() + 38, bad.begin() + 38 + static_cast<int64_t>(position_bytes), uint8_t{0xff});
    }
    if (spec.name == "qsgd") bad[24 + 4 * 2] = 0x77;      // two 4-bit codes of level 7 > s = 5
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
