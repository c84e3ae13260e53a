// The worker's side stream on a GPU (work/lent_stream.h): none of torch's pool streams,
// at the device's greatest priority, one per live worker, reused once a worker is gone.
// Skips without a CUDA device (benchmarks/gpu.sh runs it on a GPU machine).
#include <cuda_runtime_api.h>

#include <set>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include "work/ordered_worker.h"

namespace gradzip {
namespace {

class CudaWorkerStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (c10::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  }
};

// The stream current while a job on a CUDA tensor runs.
cudaStream_t job_stream(OrderedWorker& worker) {
  cudaStream_t seen = nullptr;
  auto work = worker.submit({at::zeros({4}, at::kCUDA)},
                            [&seen] { seen = c10::cuda::getCurrentCUDAStream().stream(); });
  work->wait();
  return seen;
}

TEST_F(CudaWorkerStreamTest, AJobRunsOnAStreamNoPoolHandsOut) {
  OrderedWorker worker;
  const cudaStream_t stream = job_stream(worker);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(job_stream(worker), stream) << "one worker, one stream per device";
  // Every stream torch's pools hand out, at every priority they have (each pool is a ring
  // of 32; twice round covers it), with the default and current streams.
  std::set<cudaStream_t> torch_streams = {c10::cuda::getDefaultCUDAStream().stream(),
                                          c10::cuda::getCurrentCUDAStream().stream()};
  for (int priority = 0; priority >= -8; --priority) {
    for (int i = 0; i < 64; ++i) torch_streams.insert(c10::cuda::getStreamFromPool(priority).stream());
  }
  for (int i = 0; i < 64; ++i) torch_streams.insert(c10::cuda::getStreamFromPool(true).stream());
  EXPECT_EQ(torch_streams.count(stream), 0u) << "the side stream is one of torch's pool streams";
  int priority = 0, least = 0, greatest = 0;
  ASSERT_EQ(cudaStreamGetPriority(stream, &priority), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(priority, greatest);
}

TEST_F(CudaWorkerStreamTest, LiveWorkersHaveTheirOwnStreamsAndAGoneOnesIsReused) {
  auto first = std::make_unique<OrderedWorker>();
  OrderedWorker second;
  const cudaStream_t a = job_stream(*first);
  const cudaStream_t b = job_stream(second);
  EXPECT_NE(a, b) << "two live workers share a stream";
  first.reset();
  OrderedWorker third;
  EXPECT_EQ(job_stream(third), a) << "a gone worker's stream is not reused: streams would grow with groups";
}

}  // namespace
}  // namespace gradzip
