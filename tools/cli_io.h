// Small pieces the subcommands share: writing an output file and reading --device-memory, each
// with the error printed in the subcommand's name.
#pragma once
#include <cstddef>
#include <optional>
#include <string>

namespace cudapool::tools {

// Writes `text` to `path`; false (after printing "<who>: cannot write PATH") on failure.
bool write_text_file(const std::string& path, const std::string& text, const char* who);

// --device-memory: "" leaves *out unset; else a positive size ("80GiB"). false (after printing
// why) when it is not one.
bool device_memory_option(const std::string& text, std::optional<std::size_t>* out, const char* who);

}  // namespace cudapool::tools
