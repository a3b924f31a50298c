// The JSON writer's pieces: quoted strings and doubles that read back exactly. What libcudapool.so
// needs to write its summary and C API answers; the reader is telemetry/json_reader.h, which only
// the tools link.
#pragma once
#include <string>
#include <string_view>

namespace cudapool::json {

// Appends `s` as a quoted JSON string.
void append_string(std::string* out, std::string_view s);
// Appends a double that parses back to the same value ("null" for NaN/inf).
void append_double(std::string* out, double d);

}  // namespace cudapool::json
