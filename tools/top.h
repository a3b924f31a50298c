// `cudapool top`'s table (tools/cmd_top.cpp), for its tests.
#pragma once
#include <string>
#include <vector>

#include "telemetry/share.h"

namespace cudapool::tools {

// One line per process and device, with a header line; every string from a record escaped with
// printable() (config/printable.h).
std::string top_table(const std::vector<share::ProcInfo>& procs);

}  // namespace cudapool::tools
