// Recursive-descent JSON parser. Written for the summary file; strict (RFC 8259 grammar) so that
// a truncated or hand-mangled file is reported, not half-read.
#include "telemetry/json_reader.h"

#include <charconv>
#include <cstdlib>

namespace cudapool::json {
namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(std::string_view t, std::string* error) : t_(t), error_(error) {}

  bool document(Value* out) {
    ws();
    if (!value(out, 0)) return false;
    ws();
    if (pos_ != t_.size()) return fail("unexpected text after the JSON value");
    return true;
  }

 private:
  bool fail(const char* what) {
    if (error_) *error_ = std::string(what) + " at byte " + std::to_string(pos_);
    return false;
  }
  void ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r')) ++pos_;
  }
  bool literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool value(Value* v, int depth) {
    if (depth > kMaxDepth) return fail("nesting too deep");
    if (pos_ >= t_.size()) return fail("unexpected end of input");
    char c = t_[pos_];
    switch (c) {
      case '{': return object(v, depth);
      case '[': return array(v, depth);
      case '"': v->type = Value::Type::string; return string(&v->s);
      case 't':
        v->type = Value::Type::boolean;
        v->b = true;
        return literal("true");
      case 'f':
        v->type = Value::Type::boolean;
        v->b = false;
        return literal("false");
      case 'n': v->type = Value::Type::null; return literal("null");
      default: return number(v);
    }
  }

  bool object(Value* v, int depth) {
    v->type = Value::Type::object;
    ++pos_;
    ws();
    if (pos_ < t_.size() && t_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      ws();
      if (pos_ >= t_.size() || t_[pos_] != '"') return fail("expected a member name");
      std::string key;
      if (!string(&key)) return false;
      ws();
      if (pos_ >= t_.size() || t_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      ws();
      Value member;
      if (!value(&member, depth + 1)) return false;
      v->members.push_back(Member{std::move(key), std::move(member)});
      ws();
      if (pos_ >= t_.size()) return fail("unexpected end of input in an object");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  bool array(Value* v, int depth) {
    v->type = Value::Type::array;
    ++pos_;
    ws();
    if (pos_ < t_.size() && t_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      ws();
      Value item;
      if (!value(&item, depth + 1)) return false;
      v->items.push_back(std::move(item));
      ws();
      if (pos_ >= t_.size()) return fail("unexpected end of input in an array");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }

  static void put_utf8(std::string* out, std::uint32_t cp) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool hex4(std::uint32_t* out) {
    if (t_.size() - pos_ < 4) return fail("truncated \\u escape");
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(t_.data() + pos_, t_.data() + pos_ + 4, v, 16);
    if (ec != std::errc() || p != t_.data() + pos_ + 4) return fail("invalid \\u escape");
    pos_ += 4;
    *out = v;
    return true;
  }

  bool string(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= t_.size()) return fail("unterminated string");
      char c = t_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (pos_ >= t_.size()) return fail("unterminated escape");
      char e = t_[pos_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {  // surrogate pair
            std::uint32_t lo = 0;
            if (t_.substr(pos_, 2) != "\\u") return fail("lone high surrogate");
            pos_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return fail("lone low surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: return fail("invalid escape");
      }
    }
  }

  bool number(Value* v) {
    std::size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    if (pos_ >= t_.size() || t_[pos_] < '0' || t_[pos_] > '9') return fail("invalid value");
    if (t_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
    }
    bool is_int = true;
    if (pos_ < t_.size() && t_[pos_] == '.') {
      is_int = false;
      ++pos_;
      if (pos_ >= t_.size() || t_[pos_] < '0' || t_[pos_] > '9') return fail("digit expected after '.'");
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      is_int = false;
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (pos_ >= t_.size() || t_[pos_] < '0' || t_[pos_] > '9') return fail("digit expected in exponent");
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
    }
    std::string_view text = t_.substr(start, pos_ - start);
    if (is_int) {
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v->i);
      if (ec == std::errc() && p == text.data() + text.size()) {
        v->type = Value::Type::integer;
        v->d = static_cast<double>(v->i);
        return true;
      }
      // Out of int64 range: keep it as a double rather than failing.
    }
    std::string copy(text);  // strtod needs a terminator
    char* end = nullptr;
    v->d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) return fail("invalid number");
    v->type = Value::Type::number;
    return true;
  }

  std::string_view t_;
  std::string* error_;
  std::size_t pos_ = 0;
};

}  // namespace

const Value* Value::find(std::string_view key) const {
  if (type != Type::object) return nullptr;
  for (const auto& [k, v] : members) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool parse(std::string_view text, Value* out, std::string* error) {
  *out = Value{};
  return Parser(text, error).document(out);
}

}  // namespace cudapool::json
