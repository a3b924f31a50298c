// Side-by-side comparison of policies: the median / min–max / ratio table that `ab` prints and
// the per-policy table that `replay` prints for several --conf.
#pragma once
#include <string>
#include <vector>

#include "tools/metrics.h"
#include "tools/table.h"

namespace cudapool::tools {

struct Spread {
  bool any = false;  // false: no successful run measured this metric
  double median = 0, min = 0, max = 0;
};

// One policy's runs. Failed runs are counted but contribute no metrics.
struct VariantRuns {
  std::string label;  // "A", "B", "base"
  std::string conf;
  std::vector<Metrics> runs;  // successful runs only
  int failed = 0;
};

// Median (mean of the middle two for an even count), min and max of metric `m` over the runs.
Spread spread(const std::vector<Metrics>& runs, std::size_t m);

// b / a as "0.87×"; "—" when undefined (a missing or 0 while b is not; both 0 gives 1.00×).
std::string ratio_text(const Spread& a, const Spread& b);

// Rows = metric_defs(); for each variant a median and a min–max column, then "B/A" comparing
// variants[b_index] with variants[a_index]. Metrics no variant measured are left out.
Table ab_table(const std::vector<VariantRuns>& variants, std::size_t a_index, std::size_t b_index);

// The same as JSON: {"command":[...],"variants":[{label,conf,runs,failed,metrics:{key:{median,min,max}}}],
// "ratios":{key: b/a or null}}.
std::string ab_json(const std::vector<std::string>& command, const std::vector<VariantRuns>& variants,
                    std::size_t a_index, std::size_t b_index);

// One column per policy (single values, e.g. replay results); rows = metric_defs() that any has.
Table policy_table(const std::vector<std::string>& column_names, const std::vector<Metrics>& results);

}  // namespace cudapool::tools
