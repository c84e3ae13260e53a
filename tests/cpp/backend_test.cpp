// gradzip::Backend over a transport that does no communication: which calls it
// refuses, and what it counts.
#include "gradzip/backend.h"

#include <gtest/gtest.h>

namespace gradzip {
namespace {

// Completes every all-reduce at once and leaves the tensors as they are.
class NullTransport final : public c10d::Backend {
 public:
  using c10d::Backend::Backend;
  const std::string getBackendName() const override { return "null"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions&) override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors));
    return c10d::Work::create_from_future(future);
  }
};

c10::intrusive_ptr<Backend> make_backend(int size) {
  auto fake = c10::make_intrusive<NullTransport>(0, size);
  return gradzip::make_backend(0, size, fake, nullptr, BoundSpec("allreduce"), /*validate=*/false,
                                      std::chrono::milliseconds(1000));
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(BackendTest, NameAndOptions) {
  auto backend = make_backend(4);
  EXPECT_EQ(backend->getBackendName(), "gradzip");
  EXPECT_EQ(backend->getBackendOptions()->backend, "gradzip");
  EXPECT_FALSE(backend->has_cuda_transport());
  EXPECT_FALSE(backend->validates());
  EXPECT_EQ(backend->aggregation().spec().str(), "allreduce");
}

TEST(BackendTest, RefusesTensorsItCannotCarry) {
  auto backend = make_backend(2);
  std::vector<at::Tensor> none;
  EXPECT_NE(error_of([&] { backend->allreduce(none, {}); }).find("all_reduce got no tensors"), std::string::npos);

  std::vector<at::Tensor> meta = {at::empty({4}, at::device(at::kMeta))};
  const std::string meta_error = error_of([&] { backend->allreduce(meta, {}); });
  EXPECT_NE(meta_error.find("device 'meta'"), std::string::npos) << meta_error;
  EXPECT_NE(meta_error.find("supports cpu and cuda"), std::string::npos) << meta_error;

  std::vector<at::Tensor> mixed = {at::ones({2}), at::empty({2}, at::device(at::kMeta))};
  EXPECT_NE(error_of([&] { backend->broadcast(mixed, {}); }).find("different devices"), std::string::npos);
}

TEST(BackendTest, ShutdownIsIdempotentAndRefusesLaterCalls) {
  auto backend = make_backend(2);
  backend->shutdown();
  backend->shutdown();
  backend->abort();
  std::vector<at::Tensor> tensors = {at::ones({3})};
  EXPECT_NE(error_of([&] { backend->allreduce(tensors, {}); }).find("shut down"), std::string::npos);
  EXPECT_NE(error_of([&] { backend->barrier({}); }).find("shut down"), std::string::npos);
}

TEST(BackendTest, ExactAllreduceCountsRingBytes) {
  auto backend = make_backend(4);
  std::vector<at::Tensor> fp32 = {at::ones({1000})};
  std::vector<at::Tensor> fp16 = {at::ones({1000}, at::kHalf)};
  backend->allreduce(fp32, {})->wait();
  backend->allreduce(fp16, {})->wait();
  const auto stats = backend->stats().snapshot();
  EXPECT_EQ(stats.calls, 2);
  EXPECT_EQ(stats.bytes_sent, 6000 + 3000);  // 2·(4−1)/4 of 4000 and of 2000 bytes
  EXPECT_EQ(stats.bytes_received, stats.bytes_sent);
  EXPECT_EQ(stats.dense_bytes, 2 * 6000);  // what fp32 would have cost
  backend->stats().reset();
  EXPECT_EQ(backend->stats().snapshot().calls, 0);
}

TEST(StatsTest, RingBytes) {
  EXPECT_EQ(ring_allreduce_bytes(4000, 1), 0);
  EXPECT_EQ(ring_allreduce_bytes(4000, 2), 4000);
  EXPECT_EQ(ring_allreduce_bytes(4000, 4), 6000);
}

}  // namespace
}  // namespace gradzip
