#include "gradzip/aggregation.h"

#include <gtest/gtest.h>

namespace gradzip {
namespace {

std::string error_of(const std::string& text) {
  try {
    make_aggregation(parse_spec(text));
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

TEST(AggregationTest, AllreduceIsRegistered) {
  auto aggregation = make_aggregation(parse_spec("allreduce"));
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

}  // namespace
}  // namespace gradzip
