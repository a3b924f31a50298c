// `cudapool top`'s table (tools/cmd_top.cpp), for its tests.
#pragma once
#include <string>
#include <vector>

#include "shim/group/group_ledger_layout.h"
#include "telemetry/share.h"

namespace cudapool::tools {

// One line per process and device, with a header line; every string from a record escaped with
// printable() (sys/printable.h).
std::string top_table(const std::vector<share::ProcInfo>& procs);

// FRAG: the share of reserved memory that is free inside segments that still hold live blocks
// (inactive_split / reserved); cached whole segments are not counted (docs/tools.md, "top").
double top_fragmentation(const share::RecordDevice& d);

// The lines under the table, one per group on each GPU with a live member, from its ledger.
std::string top_group_lines(const std::vector<share::LedgerView>& ledgers);

}  // namespace cudapool::tools
