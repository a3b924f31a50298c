// The JSON writer's pieces: quoted strings that are valid UTF-8 whatever bytes they are given, and
// doubles that read back exactly. What libcudapool.so needs to write its summary and C API answers;
// the reader is telemetry/json_reader.h, which only the tools link.
#pragma once
#include <string>
#include <string_view>

namespace cudapool::json {

// Appends `s` as a quoted JSON string that is valid UTF-8 whatever bytes `s` holds (a command
// line, a path, a group name another process chose): `"` and `\` escaped; C0 controls, DEL, the
// C1 controls, U+2028/U+2029 and the bidirectional controls (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069) written as \uXXXX, so they arrive intact but never act on a
// terminal or a viewer; other well-formed UTF-8 unchanged; each malformed part (a stray byte, a
// sequence cut short, an overlong form, a surrogate, a value above U+10FFFF) becomes one U+FFFD,
// as Unicode recommends and Python's and browsers' decoders do.
void append_string(std::string* out, std::string_view s);
// Appends a double that parses back to the same value ("null" for NaN/inf).
void append_double(std::string* out, double d);

}  // namespace cudapool::json
