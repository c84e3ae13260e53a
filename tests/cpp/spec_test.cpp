#include "gradzip/spec.h"

#include <gtest/gtest.h>

namespace gradzip {
namespace {

TEST(SpecTest, NameOnly) {
  const Spec spec = parse_spec("allreduce");
  EXPECT_EQ(spec.name, "allreduce");
  EXPECT_TRUE(spec.params.empty());
  EXPECT_EQ(spec.str(), "allreduce");
}

TEST(SpecTest, KeysAreParsedTrimmedAndCanonicallyOrdered) {
  const Spec spec = parse_spec(" qsgd : bucket=512 , bits = 4 ");
  EXPECT_EQ(spec.name, "qsgd");
  ASSERT_EQ(spec.params.size(), 2u);
  EXPECT_EQ(spec.params.at("bits"), "4");
  EXPECT_EQ(spec.params.at("bucket"), "512");
  EXPECT_EQ(spec.str(), "qsgd:bits=4,bucket=512");
  EXPECT_EQ(parse_spec(spec.str()).str(), spec.str());
}

TEST(SpecTest, TypedReads) {
  const Spec spec = parse_spec("topk:density=0.01,warmup=10,ef=off,mode=approx");
  EXPECT_DOUBLE_EQ(spec.get_double("density", 1.0), 0.01);
  EXPECT_EQ(spec.get_int("warmup", 0), 10);
  EXPECT_FALSE(spec.get_bool("ef", true));
  EXPECT_EQ(spec.get_string("mode", "exact"), "approx");
  EXPECT_EQ(spec.get_int("seed", 42), 42);
  EXPECT_TRUE(spec.has("density"));
  EXPECT_FALSE(spec.has("seed"));
}

TEST(SpecTest, BadValuesNameTheKey) {
  const Spec spec = parse_spec("topk:density=abc,warmup=1.5,ef=maybe");
  try {
    spec.get_double("density", 1.0);
    FAIL() << "expected SpecError";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("'density' expects a number, got 'abc'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spec.get_int("warmup", 0), SpecError);
  EXPECT_THROW(spec.get_bool("ef", true), SpecError);
}

TEST(SpecTest, SyntaxErrorsSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "the name is empty"},
      {":density=1", "the name is empty"},
      {"Top-K", "may only hold"},
      {"topk:", "nothing follows ':'"},
      {"topk:density", "is not key=value"},
      {"topk:density=", "has no value"},
      {"topk:density=1,density=2", "given twice"},
      {"topk:Density=1", "may only hold"},
      {"topk:a=b:c", "holds '=' or ':'"},
      {"topk:density=0.1,", "is not key=value"},
  };
  for (const auto& [text, why] : cases) {
    try {
      parse_spec(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("expected name[:key=value"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace gradzip
