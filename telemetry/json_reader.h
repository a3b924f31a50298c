// The JSON reader for the run summary and the tools' tests: objects (members in file order),
// arrays, strings, 64-bit integers, doubles, booleans and null, parsed by nlohmann-json. Integers
// are kept exact (counters can exceed 2^53); one above INT64_MAX is read as a double. Only the
// tools link it (libcudapool_telemetry_reader.a): the shim writes JSON, it never reads any.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cudapool::json {

struct Member;

struct Value {
  enum class Type : std::uint8_t { null, boolean, integer, number, string, array, object };
  Type type = Type::null;
  bool b = false;
  std::int64_t i = 0;
  double d = 0.0;
  std::string s;
  std::vector<Value> items;     // array
  std::vector<Member> members;  // object, in file order

  // The member named `key`, or nullptr (also when this is not an object).
  const Value* find(std::string_view key) const;
  bool is_number() const { return type == Type::integer || type == Type::number; }
  double as_double() const { return type == Type::integer ? static_cast<double>(i) : d; }
};

// (A struct rather than std::pair: a pair of an incomplete type may not be named inside Value.)
struct Member {
  std::string key;
  Value value;
};

// Parses one JSON document (strict RFC 8259; trailing whitespace allowed). Strings must be valid
// UTF-8 (what telemetry/json.h writes always is). Nesting is capped at 64 arrays and objects so
// hostile input cannot exhaust the stack. A member named twice is kept twice (find() gives the
// first). On failure *error says what and at which byte offset.
bool parse(std::string_view text, Value* out, std::string* error);

}  // namespace cudapool::json
