#include "gradzip/aggregation.h"

#include <gtest/gtest.h>

#include <vector>

#include "codec/codec_record.h"
#include "codec/device_half.h"

namespace gradzip {
namespace {

std::string error_of(const std::string& text) {
  try {
    make_aggregation(BoundSpec(text));
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

TEST(AggregationTest, AllreduceIsRegistered) {
  auto aggregation = make_aggregation(BoundSpec("allreduce"));
  ASSERT_NE(aggregation, nullptr);
  EXPECT_EQ(aggregation->spec().str(), "allreduce");
}

TEST(AggregationTest, EveryKindHasASummaryAndAUniqueName) {
  const auto& kinds = aggregation_kinds();
  ASSERT_FALSE(kinds.empty());
  for (size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_FALSE(kinds[i].summary.empty()) << kinds[i].name;
    for (size_t j = i + 1; j < kinds.size(); ++j) EXPECT_NE(kinds[i].name, kinds[j].name);
  }
}

TEST(AggregationTest, UnknownNameListsTheValidNames) {
  const std::string error = error_of("zstd:level=3");
  EXPECT_NE(error.find("unknown aggregation 'zstd'"), std::string::npos) << error;
  for (const auto& kind : aggregation_kinds()) {
    EXPECT_NE(error.find(kind.name), std::string::npos) << error;
  }
}

TEST(AggregationTest, UnknownKeyListsTheValidKeys) {
  const std::string error = error_of("allreduce:density=0.1");
  EXPECT_NE(error.find("unknown key 'density' for aggregation 'allreduce'"), std::string::npos) << error;
  EXPECT_NE(error.find("valid keys: (none)"), std::string::npos) << error;
}

TEST(BoundSpecTest, SplitsTheAggregationsKeysFromTheCodecs) {
  const BoundSpec spec("topk: ef=0, density=0.02, seed=3");
  EXPECT_EQ(spec.str(), "topk:density=0.02,ef=0,seed=3");
  EXPECT_EQ(spec.codec_spec().str(), "topk:density=0.02");
  ASSERT_NE(spec.codec(), nullptr);
  EXPECT_EQ(spec.codec()->budget().value, 0.02);
  EXPECT_FALSE(spec.decentralized());
  EXPECT_EQ(BoundSpec("allreduce").codec(), nullptr);
  EXPECT_EQ(BoundSpec("gossip:topology=ring").codec(), nullptr);
  EXPECT_TRUE(BoundSpec("gossip:topology=ring").decentralized());
}

TEST(BoundSpecTest, ChocoTakesItsCodecFromCompress) {
  const BoundSpec spec("choco:compress=qsgd,bits=8,gamma=0.5,topology=ring");
  EXPECT_EQ(spec.codec_spec().str(), "qsgd:bits=8");
  EXPECT_EQ(spec.codec()->budget().value, 127);
  EXPECT_TRUE(spec.decentralized());
  EXPECT_EQ(BoundSpec("choco:gamma=0.5").codec_spec().str(), "sign");
  const std::string other = error_of("choco:compress=sign,density=0.1,gamma=0.5");
  EXPECT_NE(other.find("unknown key 'density' for aggregation 'choco' with compress=sign"), std::string::npos) << other;
  EXPECT_NE(error_of("choco:compress=sign,vote=majority,gamma=0.5").find("unknown key 'vote'"), std::string::npos);
  EXPECT_NE(error_of("choco:compress=lz4,gamma=0.5").find("compress must be one of identity"), std::string::npos);
  EXPECT_NE(error_of("choco:topology=ring").find("choco needs gamma"), std::string::npos);
}

TEST(BoundSpecTest, ValuesAreCheckedByTheKeyThatOwnsThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"topk:density=0", "density must be a number in (0, 1], got '0'"},
      {"topk:density=1.5", "density must be a number in (0, 1]"},
      {"qsgd:bits=1", "bits must be an integer in [2, 16]"},
      {"qsgd:bits=4,levels=3", "give bits or levels, not both"},
      {"qsgd:norm=l1", "norm must be one of l2, max"},
      {"sign:vote=maybe", "vote must be one of mean, majority"},
      {"sign:vote=majority,block=8", "block must be 0"},
      {"stc:min_numel=-1", "min_numel must be an integer >= 0"},
      {"stc:ef=maybe", "'ef' expects a boolean"},
      {"gossip:topology=star", "topology must be one of ring"},
      {"gossip:topology=explicit", "edges"},
  };
  for (const auto& [text, why] : cases) {
    const std::string error = error_of(text);
    EXPECT_NE(error.find(why), std::string::npos) << text << ": " << error;
    EXPECT_NE(error.find("spec '"), std::string::npos) << text << ": " << error;
  }
}

TEST(CodecRecordTest, EveryRecordIsComplete) {
  std::vector<uint8_t> ids;
  for (const auto* record : codec_records()) {
    EXPECT_FALSE(record->name.empty());
    EXPECT_FALSE(record->summary.empty()) << record->name;
    ASSERT_NE(record->make, nullptr) << record->name;
    for (const auto& key : record->keys) EXPECT_FALSE(key.help.empty()) << record->name << "." << key.name;
    const auto codec = record->build(Spec{record->name, {}});
    EXPECT_EQ(codec->id(), record->id) << record->name;
    EXPECT_EQ(codec->name(), record->name);
    EXPECT_EQ(find_codec_record(record->name), record);
    EXPECT_EQ(find_codec_record(static_cast<uint8_t>(record->id)), record);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), static_cast<uint8_t>(record->id)), 0) << record->name;
    ids.push_back(static_cast<uint8_t>(record->id));
#ifdef GRADZIP_WITH_CUDA
    if (record->device) {
      EXPECT_NE(record->device->encode, nullptr) << record->name;
      EXPECT_NE(record->device->queue_decode_add, nullptr) << record->name;
      // The codecs with one term per element decode all ranks' payloads in one pass.
      const bool element_wise = record->name == "sign" || record->name == "qsgd" || record->name == "identity" ||
                                record->name == "fp16" || record->name == "bf16";
      EXPECT_EQ(record->device->queue_decode_rows != nullptr, element_wise) << record->name;
    }
#endif
  }
}

// DeviceArena::reusable on plain host memory: one block for uses that follow each other,
// a larger one (with room to spare) only when asked for more than it holds.
TEST(CodecRecordTest, ReusableScratchGrowsOnlyWhenAskedForMore) {
  class HostArena final : public DeviceArena {
   public:
    void* allocate(size_t bytes) override {
      sizes.push_back(bytes);
      held.emplace_back(bytes);
      return held.back().data();
    }
    std::vector<size_t> sizes;
    std::vector<std::vector<uint8_t>> held;
  } arena;
  void* first = arena.reusable(1000);
  EXPECT_EQ(arena.reusable(1000), first);
  EXPECT_EQ(arena.reusable(1250), first);  // within the 25% kept to spare
  void* larger = arena.reusable(1251);
  EXPECT_NE(larger, first);
  EXPECT_EQ(arena.reusable(10), larger);
  EXPECT_EQ(arena.sizes, (std::vector<size_t>{1250, 1563}));
}

TEST(CodecRecordTest, EveryAggregationKeyIsDocumented) {
  for (const auto& kind : aggregation_kinds()) {
    for (const auto& key : all_keys(kind)) EXPECT_FALSE(key.help.empty()) << kind.name << "." << key.name;
  }
}

}  // namespace
}  // namespace gradzip
