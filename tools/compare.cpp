#include "tools/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tools/json_text.h"

namespace cudapool::tools {

Spread spread(const std::vector<Metrics>& runs, std::size_t m) {
  std::vector<double> v;
  for (const auto& r : runs)
    if (m < r.values.size() && r.values[m]) v.push_back(*r.values[m]);
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.any = true;
  s.min = v.front();
  s.max = v.back();
  std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
  return s;
}

namespace {

bool ratio_value(const Spread& a, const Spread& b, double* out) {
  if (!a.any || !b.any) return false;
  if (a.median == 0) {
    if (b.median != 0) return false;
    *out = 1.0;
    return true;
  }
  *out = b.median / a.median;
  return true;
}

}  // namespace

std::string ratio_text(const Spread& a, const Spread& b) {
  double r;
  if (!ratio_value(a, b, &r)) return "—";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f×", r);
  return buf;
}

Table ab_table(const std::vector<VariantRuns>& variants, std::size_t a_index, std::size_t b_index) {
  Table t;
  t.header.push_back("metric");
  for (const auto& v : variants) {
    t.header.push_back(v.label + " median");
    t.header.push_back(v.label + " min–max");
  }
  t.header.push_back(variants[b_index].label + "/" + variants[a_index].label);
  const auto& defs = metric_defs();
  for (std::size_t m = 0; m < defs.size(); ++m) {
    std::vector<Spread> sp;
    bool any = false;
    for (const auto& v : variants) {
      sp.push_back(spread(v.runs, m));
      any |= sp.back().any;
    }
    if (!any) continue;
    std::vector<std::string> row{defs[m].label};
    for (const auto& s : sp) {
      if (!s.any) {
        row.push_back("—");
        row.push_back("—");
        continue;
      }
      row.push_back(format_metric(defs[m].unit, s.median));
      row.push_back(format_metric(defs[m].unit, s.min) + " – " + format_metric(defs[m].unit, s.max));
    }
    row.push_back(ratio_text(sp[a_index], sp[b_index]));
    t.add(std::move(row));
  }
  std::vector<std::string> runs_row{"runs ok / failed"};
  for (const auto& v : variants) {
    runs_row.push_back(std::to_string(v.runs.size()) + " / " + std::to_string(v.failed));
    runs_row.push_back("");
  }
  runs_row.push_back("");
  t.add(std::move(runs_row));
  return t;
}

std::string ab_json(const std::vector<std::string>& command, const std::vector<VariantRuns>& variants,
                    std::size_t a_index, std::size_t b_index) {
  const auto& defs = metric_defs();
  std::string o = "{\n  \"command\": [";
  for (std::size_t i = 0; i < command.size(); ++i) o += (i ? ", " : "") + json_string(command[i]);
  o += "],\n  \"variants\": [";
  for (std::size_t vi = 0; vi < variants.size(); ++vi) {
    const auto& v = variants[vi];
    o += vi ? ",\n    {" : "\n    {";
    o += "\"label\": " + json_string(v.label) + ", \"conf\": " + json_string(v.conf) +
         ", \"runs\": " + std::to_string(v.runs.size()) + ", \"failed\": " + std::to_string(v.failed) +
         ", \"metrics\": {";
    bool first = true;
    for (std::size_t m = 0; m < defs.size(); ++m) {
      Spread s = spread(v.runs, m);
      if (!s.any) continue;
      o += (first ? "" : ", ") + json_string(defs[m].key) + ": {\"median\": " + json_number(s.median) +
           ", \"min\": " + json_number(s.min) + ", \"max\": " + json_number(s.max) + "}";
      first = false;
    }
    o += "}}";
  }
  o += "\n  ],\n  \"ratios\": {";
  for (std::size_t m = 0; m < defs.size(); ++m) {
    double r;
    bool ok = ratio_value(spread(variants[a_index].runs, m), spread(variants[b_index].runs, m), &r);
    o += (m ? ", " : "") + json_string(defs[m].key) + ": " + (ok ? json_number(r) : "null");
  }
  o += "}\n}\n";
  return o;
}

Table policy_table(const std::vector<std::string>& names, const std::vector<Metrics>& results) {
  Table t;
  t.header.push_back("metric");
  for (const auto& n : names) t.header.push_back(n);
  const auto& defs = metric_defs();
  for (std::size_t m = 0; m < defs.size(); ++m) {
    bool any = false;
    for (const auto& r : results) any |= m < r.values.size() && r.values[m].has_value();
    if (!any) continue;
    std::vector<std::string> row{defs[m].label};
    for (const auto& r : results)
      row.push_back(m < r.values.size() && r.values[m] ? format_metric(defs[m].unit, *r.values[m]) : "—");
    t.add(std::move(row));
  }
  return t;
}

}  // namespace cudapool::tools
