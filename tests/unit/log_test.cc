#include "common/log.h"

#include "gtest/gtest.h"

namespace podlink {
namespace {

// A client-controlled value cannot close its field or start a new log line.
TEST(LogQuoted, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(LogQuoted("plain"), "\"plain\"");
  EXPECT_EQ(LogQuoted("a\" event=deny pod=\"x"), "\"a\\\" event=deny pod=\\\"x\"");
  EXPECT_EQ(LogQuoted("line\nevent=forged"), "\"line\\nevent=forged\"");
  EXPECT_EQ(LogQuoted("back\\slash"), "\"back\\\\slash\"");
  EXPECT_EQ(LogQuoted(std::string("nul\0bel\a", 8)), "\"nul\\x00bel\\x07\"");
  EXPECT_EQ(LogQuoted(""), "\"\"");
}

}  // namespace
}  // namespace podlink
