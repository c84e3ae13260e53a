// The gossip/choco message header (aggregate/peer_header.h): round trip and refusals.
#include "aggregate/peer_header.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace gradzip {
namespace {

void expect_refused(std::vector<int64_t> fields, const std::string& why) {
  try {
    parse_peer_header(fields.data(), fields.size());
    FAIL() << why;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(PeerHeaderTest, FieldsRoundTripAndAgreement) {
  const PeerHeader h{4000, true, 6, 1000, 3, 5000};
  const auto fields = h.fields();
  const PeerHeader back = parse_peer_header(fields.data(), fields.size());
  EXPECT_EQ(back.fields(), fields);
  EXPECT_TRUE(back.agrees_with(h));
  EXPECT_FALSE(back.agrees_with(PeerHeader{4000, true, 6, 1001, 3, 5000}));
  EXPECT_FALSE(back.agrees_with(PeerHeader{4000, true, 6, 1000, 4, 5000}));
  EXPECT_TRUE(back.agrees_with(PeerHeader{0, false, 6, 1000, 3, 5000}));  // finiteness is not agreed on
  EXPECT_TRUE(back.agrees_with(PeerHeader{4000, true, 6, 1000, 3, 9}));   // nor the sizes each accepts
}

TEST(PeerHeaderTest, MalformedHeadersAreRefusedByName) {
  expect_refused({1, 1, 6, 10, 0}, "5 fields, not 6");
  expect_refused({-1, 1, 6, 10, 0, 8}, "a message of -1 bytes");
  expect_refused({8, 2, 6, 10, 0, 8}, "finite flag 2");
  expect_refused({8, 0, 6, 10, 0, 8}, "a non-finite message with 8 bytes");
  expect_refused({8, 1, -6, 10, 0, 8}, "negative");
  expect_refused({8, 1, 6, 10, -1, 8}, "negative");
  expect_refused({8, 1, 6, 10, 0, -8}, "negative");
}

}  // namespace
}  // namespace gradzip
