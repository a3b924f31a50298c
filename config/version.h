// The project's version, in one place: `cudapool --version`, the shim's start report, the JSON
// summary and the installed pkg-config file (the Makefile reads it from here).
#pragma once

namespace cudapool {

inline constexpr char kVersion[] = "0.7.0";

}  // namespace cudapool
