// How the backend names the tensors of its all-reduces (c10d/call_sequence_identity.h).
#include "c10d/call_sequence_identity.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <memory>
#include <set>

namespace gradzip {
namespace {

std::vector<std::string> keys(CallSequenceIdentity& identity, const std::vector<int64_t>& sizes) {
  std::vector<std::string> out;
  for (int64_t n : sizes) out.push_back(identity.key(at::empty({n})));
  return out;
}

TEST(CallSequenceIdentityTest, ASteadyLoopKeepsItsKeys) {
  CallSequenceIdentity identity;
  const std::vector<int64_t> step = {10, 20, 20, 30};
  const auto first = keys(identity, step);
  EXPECT_EQ(first, (std::vector<std::string>{"Float:10:0", "Float:20:0", "Float:20:1", "Float:30:0"}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(keys(identity, step), first);
}

TEST(CallSequenceIdentityTest, OneTensorInALoop) {
  CallSequenceIdentity identity;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(keys(identity, {7}), std::vector<std::string>{"Float:7:0"});
}

// A DDP model of one bucket: the same buffer every step, and now and then other
// all-reduces (a metric after each epoch). Every step names the buffer alike.
TEST(CallSequenceIdentityTest, OneTensorInALoopWithOtherCallsNowAndThen) {
  CallSequenceIdentity identity;
  const at::Tensor bucket = at::empty({7});
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(identity.key(bucket), "Float:7:0") << epoch << " " << i;
    keys(identity, {2, 3});
  }
  for (const auto& key : identity.take_expired()) EXPECT_NE(key, "Float:7:0");
}

// A tensor allocated afresh is never the step's first tensor, even where the allocator
// hands out the freed one's address: every rank names alike.
TEST(CallSequenceIdentityTest, AFreshTensorAtAFreedAddressIsAnother) {
  CallSequenceIdentity identity;
  keys(identity, {7, 3});
  auto first = std::make_unique<at::Tensor>(at::empty({7}));
  EXPECT_EQ(identity.key(*first), "Float:7:0");
  first.reset();
  EXPECT_EQ(identity.key(at::empty({7})), "Float:7:1");
}

// Live tensors of the first call's size inside a step that holds others too: told apart
// once the first step has shown that the step holds other sizes.
TEST(CallSequenceIdentityTest, TensorsOfTheFirstSizeInsideAStep) {
  CallSequenceIdentity identity;
  const at::Tensor a = at::empty({7}), b = at::empty({7}), c = at::empty({9});
  for (const auto* t : {&a, &b, &c}) identity.key(*t);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(identity.key(a), "Float:7:0");
    EXPECT_EQ(identity.key(b), "Float:7:1");
    EXPECT_EQ(identity.key(c), "Float:9:0");
  }
}

TEST(CallSequenceIdentityTest, RepeatedSizesInsideAStep) {
  CallSequenceIdentity identity;
  const std::vector<int64_t> step = {5, 6, 7, 6, 8};
  const auto first = keys(identity, step);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(keys(identity, step), first);
}

// Tensors that come once and go (metrics of new sizes): their keys expire two steps
// later, once each; a steady loop's keys never do.
TEST(CallSequenceIdentityTest, KeysThatStopComingExpire) {
  CallSequenceIdentity identity;
  const std::vector<int64_t> step = {10, 20, 20};
  std::set<std::string> expired;
  for (int i = 0; i < 50; ++i) {
    keys(identity, step);
    identity.key(at::empty({1000 + i}));  // a size never seen before
    for (const auto& key : identity.take_expired()) EXPECT_TRUE(expired.insert(key).second) << key;
  }
  EXPECT_EQ(expired.size(), 47u);  // every one-off key but the last three steps'
  for (int i = 0; i < 47; ++i) EXPECT_TRUE(expired.count("Float:" + std::to_string(1000 + i) + ":0")) << i;
  EXPECT_TRUE(identity.take_expired().empty());
}

// DDP: the first iteration's buckets differ from all later ones (the rebuild), so its
// first signature never comes back; the later sequence is named steadily after two of
// its periods, and the number of keys stays bounded.
TEST(CallSequenceIdentityTest, AFirstStepThatNeverComesBack) {
  CallSequenceIdentity identity;
  keys(identity, {100, 200, 300});
  const std::vector<int64_t> step = {250, 150, 200};
  std::set<std::string> seen;
  std::vector<std::string> last;
  for (int i = 0; i < 20; ++i) {
    last = keys(identity, step);
    seen.insert(last.begin(), last.end());
  }
  EXPECT_EQ(last, (std::vector<std::string>{"Float:250:0", "Float:150:0", "Float:200:0"}));
  EXPECT_LE(seen.size(), 7u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(keys(identity, step), last);
}

}  // namespace
}  // namespace gradzip
