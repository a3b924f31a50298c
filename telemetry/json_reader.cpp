// The JSON reader on nlohmann-json's SAX parser: its lexer does the grammar (strict RFC 8259, a
// leading UTF-8 BOM skipped), string escapes and UTF-8 validation; the handler below builds the
// Value tree, in file order and keeping duplicate keys (find() gives the first), as the summary
// reader expects. The SAX parser is iterative; the tree is capped in depth because destroying a
// Value recurses. No exception leaves this file.
#include "telemetry/json_reader.h"

#include <cstdint>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace cudapool::json {
namespace {

constexpr std::size_t kMaxDepth = 64;  // nested arrays and objects

// The byte offset of the bracket that opens nesting level kMaxDepth + 1 in `t`, which the
// parser has read as valid JSON up to there (so a plain scan that skips strings finds it).
std::size_t too_deep_offset(std::string_view t) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return t.size();
}

// nlohmann's message without its "[json.exception...] parse error at line L, column C: " prefix
// and without the token it quotes (hostile bytes stay out of what the tools print): what went
// wrong, then " at byte N" as callers expect.
std::string describe(const std::string& what, const std::string& last_token, std::size_t offset) {
  std::string msg = what;
  if (msg.rfind("[json.exception.", 0) == 0) {
    const std::size_t close = msg.find("] ");
    if (close != std::string::npos) msg.erase(0, close + 2);
  }
  if (msg.rfind("parse error", 0) == 0) {
    const std::size_t colon = msg.find(": ");
    if (colon != std::string::npos) msg.erase(0, colon + 2);
  }
  const std::string quoted = "; last read: '" + last_token + "'";
  if (const std::size_t at = msg.find(quoted); at != std::string::npos) msg.erase(at, quoted.size());
  if (msg.find("; expected end of input") != std::string::npos) msg = "unexpected text after the JSON value";
  return msg + " at byte " + std::to_string(offset);
}

class Builder {
 public:
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;

  Builder(std::string_view text, Value* root, std::string* error) : text_(text), root_(root), error_(error) {}

  bool null() { return put(Value{}); }
  bool boolean(bool b) {
    Value v;
    v.type = Value::Type::boolean;
    v.b = b;
    return put(std::move(v));
  }
  bool number_integer(number_integer_t i) {
    Value v;
    v.type = Value::Type::integer;
    v.i = i;
    v.d = static_cast<double>(i);
    return put(std::move(v));
  }
  bool number_unsigned(number_unsigned_t u) {
    if (u <= static_cast<number_unsigned_t>(std::numeric_limits<std::int64_t>::max()))
      return number_integer(static_cast<number_integer_t>(u));
    // Above INT64_MAX: kept as a double rather than refused (the nearest one, as strtod gives).
    Value v;
    v.type = Value::Type::number;
    v.d = static_cast<double>(u);
    return put(std::move(v));
  }
  bool number_float(number_float_t d, const string_t& /*text*/) {
    Value v;
    v.type = Value::Type::number;
    v.d = d;
    return put(std::move(v));
  }
  bool string(string_t& s) {
    Value v;
    v.type = Value::Type::string;
    v.s = std::move(s);
    return put(std::move(v));
  }
  bool binary(binary_t& /*b*/) { return false; }  // never produced by the JSON input format
  bool start_object(std::size_t /*elements*/) { return open(Value::Type::object); }
  bool key(string_t& k) {
    stack_.back()->members.push_back(Member{std::move(k), Value{}});
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t /*elements*/) { return open(Value::Type::array); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::json::exception& ex) {
    // `position` counts the bytes read, the offending one included: its offset is one less.
    const std::size_t offset = position > 0 ? std::min(position - 1, text_.size()) : 0;
    if (error_) *error_ = describe(ex.what(), last_token, offset);
    return false;
  }

 private:
  // Places `v` where the parser is: the root, the next item of an array, or the value of the
  // member whose key came last. Returns where it went.
  Value* place(Value&& v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Value* parent = stack_.back();
    if (parent->type == Value::Type::array) {
      parent->items.push_back(std::move(v));
      return &parent->items.back();
    }
    parent->members.back().value = std::move(v);
    return &parent->members.back().value;
  }
  bool put(Value&& v) {
    place(std::move(v));
    return true;
  }
  // A container's children are added only while it is on top of the stack, so the pointers to
  // its ancestors (elements of their parents' vectors) stay valid.
  bool open(Value::Type type) {
    if (stack_.size() >= kMaxDepth) {
      if (error_)
        *error_ = "nesting too deep (more than " + std::to_string(kMaxDepth) + " levels) at byte " +
                  std::to_string(too_deep_offset(text_));
      return false;
    }
    Value v;
    v.type = type;
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::string_view text_;
  Value* root_;
  std::string* error_;
  std::vector<Value*> stack_;
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
  try {
    Builder builder(text, out, error);
    if (nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder)) return true;
  } catch (const std::exception& e) {  // out of memory, in practice
    if (error) *error = std::string("cannot parse: ") + e.what();
  } catch (...) {
    if (error) *error = "cannot parse: unknown error";
  }
  *out = Value{};  // nothing half-read
  return false;
}

}  // namespace cudapool::json
