// The JSON writer's strings (telemetry/json.h): whatever bytes it is given (a command line another
// process published, a path, a trace's text), what it writes is valid UTF-8 that a strict reader
// (Python's json.loads on the bytes, a browser) takes, with nothing in it that acts on a terminal.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "telemetry/json.h"
#include "telemetry/json_reader.h"
#include "telemetry/summary.h"
#include "telemetry/summary_reader.h"
#include "tests/support/utf8_check.h"

namespace cudapool {
namespace {

constexpr const char* kFffd = "\xEF\xBF\xBD";  // U+FFFD

std::string as_json(std::string_view s) {
  std::string out;
  json::append_string(&out, s);
  return out;
}

// The string `s` becomes: valid UTF-8, a JSON string the project's reader takes, and the text
// that reader gives back.
std::string written(std::string_view s) {
  const std::string q = as_json(s);
  EXPECT_TRUE(test::valid_utf8(q)) << "invalid UTF-8 at byte " << test::first_invalid_utf8(q) << " of " << q;
  json::Value v;
  std::string err;
  EXPECT_TRUE(json::parse(q, &v, &err)) << err << ": " << q;
  EXPECT_EQ(v.type, json::Value::Type::string);
  return v.s;
}

std::string fffd(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += kFffd;
  return s;
}

TEST(JsonString, MalformedUtf8BecomesReplacementCharacters) {
  // One U+FFFD for each maximal part that is not well formed, as Unicode recommends (and
  // Python's bytes.decode("utf-8", "replace") does).
  struct Case {
    const char* what;
    std::string in, out;
  };
  const Case cases[] = {
      {"a lone 0xff",
       "a\xff"
       "b",
       "a" + fffd(1) + "b"},
      {"0xfe and 0xff", "\xfe\xff", fffd(2)},
      {"a lone continuation byte", "x\x80y", "x" + fffd(1) + "y"},
      {"overlong '/' in two bytes", "\xc0\xaf", fffd(2)},
      {"overlong NUL in two bytes", "\xc1\x80", fffd(2)},
      {"overlong '/' in three bytes", "\xe0\x80\xaf", fffd(3)},
      {"overlong in four bytes", "\xf0\x80\x80\xaf", fffd(4)},
      {"a high surrogate in UTF-8", "\xed\xa0\x80", fffd(3)},
      {"a low surrogate in UTF-8", "\xed\xbf\xbf", fffd(3)},
      {"a surrogate pair in UTF-8 (CESU-8)", "\xed\xa0\xbd\xed\xb8\x80", fffd(6)},
      {"above U+10FFFF", "\xf4\x90\x80\x80", fffd(4)},
      {"F5 and above never start a sequence", "\xf5\x80\x80\x80", fffd(4)},
      {"a three-byte sequence cut at the end", "ok\xe2\x80", "ok" + fffd(1)},
      {"a four-byte sequence cut at the end", "\xf0\x9f\x98", fffd(1)},
      {"a sequence cut by ASCII", "\xe2\x80z", fffd(1) + "z"},
      {"a sequence cut by a quote", "\xe2\"", fffd(1) + "\""},
      {"a sequence cut by another start", "\xe2\x82\xc3\xa9", fffd(1) + "\xc3\xa9"},
      {"a lead byte alone before a valid char", "\xc3\xe2\x82\xac", fffd(1) + "\xe2\x82\xac"},
  };
  for (const Case& c : cases) EXPECT_EQ(written(c.in), c.out) << c.what;
}

TEST(JsonString, WellFormedTextPassesUnchanged) {
  for (const std::string s : {"python train.py --lr 0.1", "héllo wörld", "日本語のテキスト", "emoji 😀 and 𝔘",
                              "\xef\xbf\xbd", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf", "\xee\x80\x80", "~"}) {
    EXPECT_EQ(as_json(s), "\"" + s + "\"") << s;  // raw, not escaped
    EXPECT_EQ(written(s), s);
  }
}

TEST(JsonString, ControlsAndBidiAreEscaped) {
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"a\"b\\c", R"("a\"b\\c")"},
      {"\n\r\t", R"("\n\r\t")"},
      {std::string("\x00", 1), R"("\u0000")"},
      {"\x1b[2J", R"("\u001b[2J")"},
      {"\x07\x08\x0c\x1f", R"("\u0007\u0008\u000c\u001f")"},
      {"\x7f", R"("\u007f")"},  // DEL
      {"\xc2\x80\xc2\x9b"
       "2J\xc2\x9f",
       R"("\u0080\u009b2J\u009f")"},                          // C1, CSI among them
      {"\xc2\xa0", "\"\xc2\xa0\""},                           // past the C1 block: unchanged
      {"evil\xe2\x80\xaetxt.exe", R"("evil\u202etxt.exe")"},  // RIGHT-TO-LEFT OVERRIDE
      {"\xe2\x80\xaa\xe2\x80\xab\xe2\x80\xac\xe2\x80\xad", R"("\u202a\u202b\u202c\u202d")"},
      {"\xe2\x81\xa6\xe2\x81\xa7\xe2\x81\xa8\xe2\x81\xa9", R"("\u2066\u2067\u2068\u2069")"},  // isolates
      {"\xe2\x80\x8e\xe2\x80\x8f\xd8\x9c", R"("\u200e\u200f\u061c")"},                        // marks
      {"\xe2\x80\xa8\xe2\x80\xa9", R"("\u2028\u2029")"},  // line and paragraph separators
  };
  for (const Case& c : cases) {
    EXPECT_EQ(as_json(c.in), c.out);
    EXPECT_EQ(written(c.in), c.in) << c.out;  // escaped, never lost
  }
}

// Every string of two bytes, and many random longer ones weighted to the bytes that matter:
// always valid UTF-8 that reads back; well-formed input always reads back exactly.
TEST(JsonString, AnyBytesGiveValidUtf8) {
  for (unsigned a = 0; a < 256; ++a) {
    for (unsigned b = 0; b < 256; ++b) {
      const char in[2] = {static_cast<char>(a), static_cast<char>(b)};
      const std::string_view s(in, 2);
      const std::string q = as_json(s);
      ASSERT_TRUE(test::valid_utf8(q)) << std::hex << a << " " << b;
      json::Value v;
      std::string err;
      ASSERT_TRUE(json::parse(q, &v, &err)) << err;
      if (test::valid_utf8(s)) {
        ASSERT_EQ(v.s, s) << std::hex << a << " " << b;
      }
    }
  }
  std::mt19937 rng(12345);
  const unsigned char interesting[] = {0x00, 0x1b, '"',  '\\', 'a',  0x7f, 0x80, 0x9b, 0xbf, 0xc0, 0xc2,
                                       0xdf, 0xe0, 0xe2, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0xa0, 0x8f};
  for (int round = 0; round < 20000; ++round) {
    std::string s(rng() % 12, '\0');
    for (char& c : s)
      c = static_cast<char>(rng() % 2 ? interesting[rng() % sizeof interesting] : static_cast<unsigned char>(rng()));
    const std::string q = as_json(s);
    ASSERT_TRUE(test::valid_utf8(q)) << q;
    json::Value v;
    std::string err;
    ASSERT_TRUE(json::parse(q, &v, &err)) << err;
    ASSERT_TRUE(test::valid_utf8(v.s));
    if (test::valid_utf8(s)) {
      ASSERT_EQ(v.s, s);
    }
    // Writing what was read gives the same text: the repair is done once.
    ASSERT_EQ(as_json(v.s), q);
  }
}

// The summary the library writes at exit carries the process's policy, whose paths may hold any
// bytes: the file is still valid UTF-8, and reads back.
TEST(JsonString, SummaryWithHostileTextIsValidUtf8) {
  Summary s;
  s.command = "python \xe2\x80\xaetrain.py \xff\x1b]0;owned\x07";
  s.policy = "trace_file:/tmp/\xff\xfe.csv,log_file:/tmp/\x1b[2J\xc0\xaf";
  const std::string text = to_json(s);
  EXPECT_TRUE(test::valid_utf8(text)) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(text.find("\xe2\x80\xae"), std::string::npos) << "U+202E raw";
  EXPECT_NE(text.find("python \\u202etrain.py "), std::string::npos) << text;
  Summary back;
  std::string err;
  ASSERT_TRUE(from_json(text, &back, &err)) << err;
  EXPECT_EQ(back.command, "python \xe2\x80\xaetrain.py " + fffd(1) + "\x1b]0;owned\x07");
  EXPECT_EQ(back.policy, "trace_file:/tmp/" + fffd(2) + ".csv,log_file:/tmp/\x1b[2J" + fffd(2));
}

// The reader (telemetry/json_reader.h) on input the writer never produces.
json::Value parsed(std::string_view text) {
  json::Value v;
  std::string err;
  EXPECT_TRUE(json::parse(text, &v, &err)) << err << ": " << text;
  return v;
}

std::string refusal(std::string_view text) {
  json::Value v;
  std::string err;
  EXPECT_FALSE(json::parse(text, &v, &err)) << text;
  EXPECT_FALSE(err.empty()) << text;
  return err;
}

TEST(JsonReader, MembersInFileOrderAndNamedTwiceKeptTwice) {
  const json::Value v = parsed(R"({"b":1,"a":{"y":[true,null],"x":"s"},"b":3})");
  ASSERT_EQ(v.type, json::Value::Type::object);
  ASSERT_EQ(v.members.size(), 3u);
  EXPECT_EQ(v.members[0].key, "b");
  EXPECT_EQ(v.members[1].key, "a");
  EXPECT_EQ(v.members[2].key, "b");
  EXPECT_EQ(v.find("b")->i, 1);  // the first
  EXPECT_EQ(v.members[2].value.i, 3);
  const json::Value* a = v.find("a");
  ASSERT_EQ(a->members.size(), 2u);
  EXPECT_EQ(a->members[0].key, "y");
  ASSERT_EQ(a->members[0].value.items.size(), 2u);
  EXPECT_EQ(a->members[0].value.items[0].type, json::Value::Type::boolean);
  EXPECT_TRUE(a->members[0].value.items[0].b);
  EXPECT_EQ(a->members[0].value.items[1].type, json::Value::Type::null);
  EXPECT_EQ(a->find("x")->s, "s");
}

TEST(JsonReader, IntegersExactAndBeyondInt64AsDoubles) {
  EXPECT_EQ(parsed("9223372036854775807").i, INT64_MAX);
  EXPECT_EQ(parsed("-9223372036854775808").i, INT64_MIN);
  EXPECT_EQ(parsed("-0").type, json::Value::Type::integer);
  const json::Value big = parsed("18446744073709551615");  // beyond int64: a double, not refused
  EXPECT_EQ(big.type, json::Value::Type::number);
  EXPECT_DOUBLE_EQ(big.d, 18446744073709551615.0);
  const json::Value small = parsed("-9223372036854775809");
  EXPECT_EQ(small.type, json::Value::Type::number);
  EXPECT_DOUBLE_EQ(small.d, -9223372036854775808.0);
  const json::Value f = parsed("[1.5,2e3,1E-2]");
  ASSERT_EQ(f.items.size(), 3u);
  for (const json::Value& x : f.items) EXPECT_EQ(x.type, json::Value::Type::number);
  EXPECT_EQ(f.items[1].as_double(), 2000.0);
  EXPECT_EQ(parsed(R"("\ud83d\ude00 \u00e9")").s, "\xf0\x9f\x98\x80 \xc3\xa9");
}

// What is wrong, and the offset of the byte where it went wrong; the input's bytes are not
// echoed (the tools print these messages).
TEST(JsonReader, RefusalsSayWhatAndWhere) {
  struct Case {
    std::string text, what;
  };
  const Case cases[] = {
      {"", "unexpected end of input; expected '[', '{', or a literal at byte 0"},
      {"[1,2", "unexpected end of input; expected ']' at byte 4"},
      {"[1,]", "at byte 3"},
      {"{\"a\" 1}", "expected ':' at byte 5"},
      {"{\"a\":1} x", "unexpected text after the JSON value at byte 8"},
      {"01", "unexpected text after the JSON value at byte 1"},
      {"\"a\xff\"", "ill-formed UTF-8 byte at byte 2"},
      {"\"\xc0\xaf\"", "ill-formed UTF-8 byte at byte 1"},      // an overlong '/'
      {"\"\xed\xa0\x80\"", "ill-formed UTF-8 byte at byte 2"},  // a surrogate in UTF-8
      {"\"\x1b[2J\"", "control character U+001B"},
      {"1e400", "number overflow"},  // not read as infinity
      {"[tru]", "invalid literal"},
  };
  for (const Case& c : cases) {
    const std::string err = refusal(c.text);
    EXPECT_NE(err.find(c.what), std::string::npos) << c.text << " -> " << err;
    EXPECT_EQ(err.find("last read"), std::string::npos) << err;
  }
}

// Nesting is capped (destroying the tree recurses): 64 arrays and objects deep is read, one
// more is refused at the bracket that opens it.
TEST(JsonReader, NestingCapped) {
  std::string ok;
  for (int i = 0; i < 32; ++i) ok += "[{\"k\":";
  ok += "1";
  for (int i = 0; i < 32; ++i) ok += "}]";
  EXPECT_EQ(parsed(ok).type, json::Value::Type::array);
  const std::string deep = "{\"k\":" + ok + "}";
  EXPECT_EQ(refusal(deep), "nesting too deep (more than 64 levels) at byte " + std::to_string(deep.find("{\"k\":1")));
  EXPECT_NE(refusal(std::string(100000, '[') + std::string(100000, ']')).find("nesting too deep"), std::string::npos);
}

}  // namespace
}  // namespace cudapool
