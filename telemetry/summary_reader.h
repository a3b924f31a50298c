// Reading the run summary back (telemetry/summary.h writes it): for the tools only, in
// libcudapool_telemetry_reader.a, which libcudapool.so does not link.
#pragma once
#include <string>
#include <string_view>

#include "telemetry/summary.h"

namespace cudapool {

// Parses what to_json wrote (unknown keys are ignored, so newer writers stay readable).
// false with *error (what is wrong, with the byte offset) on malformed input.
bool from_json(std::string_view text, Summary* out, std::string* error);

// Reads the summary file at `path` (taken as it is: no patterns expanded); false with *error
// (the path, then what is wrong).
bool read_summary_file(const std::string& path, Summary* out, std::string* error);

}  // namespace cudapool
