// Opcodes of pickle protocol 2 (Python's Lib/pickletools.py documents each one).
#include "tools/pickle.h"

#include <cstring>
#include <stdexcept>

namespace cudapool::tools {
namespace {

constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt1 = 'K';     // 1-byte unsigned
constexpr char kBinInt = 'J';      // 4-byte signed little-endian
constexpr char kLong1 = '\x8a';    // n bytes of two's complement little-endian
constexpr char kBinFloat = 'G';    // 8-byte big-endian IEEE double
constexpr char kBinUnicode = 'X';  // 4-byte little-endian length + UTF-8
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kMark = '(';
constexpr char kSetItems = 'u';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';

void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

PickleWriter::PickleWriter() {
  out_ += kProto;
  out_ += '\x02';
}

void PickleWriter::none() { out_ += kNone; }
void PickleWriter::boolean(bool v) { out_ += v ? kNewTrue : kNewFalse; }

void PickleWriter::integer(std::int64_t v) {
  if (v >= 0 && v < 256) {
    out_ += kBinInt1;
    out_ += static_cast<char>(v);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_ += kBinInt;
    put_le32(out_, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
  } else {
    // Fewest bytes that keep the sign bit right.
    auto u = static_cast<std::uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const std::uint8_t top = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
      const std::uint8_t next = static_cast<std::uint8_t>(u >> (8 * (n - 2)));
      if ((top == 0x00 && !(next & 0x80)) || (top == 0xff && (next & 0x80)))
        --n;
      else
        break;
    }
    out_ += kLong1;
    out_ += static_cast<char>(n);
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((u >> (8 * i)) & 0xff);
  }
}

void PickleWriter::uinteger(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  // Above INT64_MAX: 9 bytes, the last 0 so the value stays positive.
  out_ += kLong1;
  out_ += static_cast<char>(9);
  for (int i = 0; i < 8; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  out_ += '\0';
}

void PickleWriter::real(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  out_ += kBinFloat;
  for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
}

void PickleWriter::str(std::string_view s) {
  out_ += kBinUnicode;
  put_le32(out_, static_cast<std::uint32_t>(s.size()));
  out_.append(s.data(), s.size());
}

void PickleWriter::begin_dict() {
  out_ += kEmptyDict;
  out_ += kMark;
  open_.push_back(Kind::dict);
}

void PickleWriter::begin_list() {
  out_ += kEmptyList;
  out_ += kMark;
  open_.push_back(Kind::list);
}

void PickleWriter::begin_tuple() {
  out_ += kMark;
  open_.push_back(Kind::tuple);
}

void PickleWriter::end() {
  if (open_.empty()) throw std::logic_error("PickleWriter::end without an open container");
  switch (open_.back()) {
    case Kind::dict: out_ += kSetItems; break;
    case Kind::list: out_ += kAppends; break;
    case Kind::tuple: out_ += kTuple; break;
  }
  open_.pop_back();
}

std::string PickleWriter::finish() {
  if (!open_.empty()) throw std::logic_error("PickleWriter::finish with open containers");
  out_ += kStop;
  return std::move(out_);
}

}  // namespace cudapool::tools
