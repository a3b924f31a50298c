// printable(): untrusted text made safe for a terminal.
#include <gtest/gtest.h>

#include <string>

#include "sys/printable.h"

namespace cudapool {
namespace {

TEST(Printable, EscapesControlsAndKeepsText) {
  EXPECT_EQ(printable(""), "");
  EXPECT_EQ(printable("max_split_size_mb:64 /tmp/a b"), "max_split_size_mb:64 /tmp/a b");
  EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(printable("\x07\x7f\t\n\r"), "\\x07\\x7f\\x09\\x0a\\x0d");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  // Printable UTF-8 passes; C1 controls, separators and bidirectional controls do not.
  EXPECT_EQ(printable("héllo ✓ 日本 \xf0\x9f\x98\x80"), "héllo ✓ 日本 \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xc2\x9b"
                      "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(printable("\xe2\x80\xae"), "\\xe2\\x80\\xae");  // right-to-left override
  EXPECT_EQ(printable("\xe2\x81\xa6"), "\\xe2\\x81\\xa6");  // left-to-right isolate
  EXPECT_EQ(printable("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");  // line separator
  // Malformed UTF-8, byte by byte: stray continuation, truncated, overlong, surrogate, too large.
  EXPECT_EQ(printable("\x80x"), "\\x80x");
  EXPECT_EQ(printable("\xe2\x80"), "\\xe2\\x80");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(printable("\xff"), "\\xff");
  EXPECT_EQ(printable("\xe2\x1b[2J"), "\\xe2\\x1b[2J");  // a lead byte does not swallow an ESC
}

}  // namespace
}  // namespace cudapool
