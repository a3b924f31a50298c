// `cudapool ab --a S --b S [-n N] [--baseline passthrough] [--json F] [--markdown F] -- CMD …`
//
// Runs are interleaved (A B A B …) so that drift of the machine (clocks, other load, caches)
// lands on both sides alike instead of biasing whichever policy ran second.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <utility>

#include "config/policy.h"
#include "telemetry/summary_reader.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/compare.h"
#include "tools/launch.h"
#include "tools/process.h"
#include "tools/units.h"

namespace cudapool::tools {

namespace {

struct AbOptions {
  std::string a, b, baseline, json, markdown;
  int n = 3;
  bool no_preload = false;
  bool hide_output = false;
  LaunchSettings launch;  // --config / --profile shared by every run
  std::vector<std::string> command;
};

// The stats of every device of a summary, added up: a multi-GPU run is compared as one whole.
Stats combined_stats(const Summary& s) {
  Stats total;
  for (const auto& d : s.devices) {
    auto sum = flatten_stats(total), add = flatten_stats(d.stats);  // same names, same order
    for (std::size_t i = 0; i < add.size(); ++i) set_stat(&total, add[i].first, sum[i].second + add[i].second);
  }
  return total;
}

std::string temp_stats_path() {
  const char* dir = ::secure_getenv("TMPDIR");
  std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/cudapool-ab-XXXXXX.json";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = mkstemps(buf.data(), 5);
  if (fd < 0) return {};
  close(fd);
  return buf.data();
}

// The policies compared, in run order: the baseline (with --baseline), A, B.
std::vector<VariantRuns> ab_variants(const AbOptions& o) {
  std::vector<VariantRuns> variants;
  if (!o.baseline.empty()) variants.push_back({"base", "backend:passthrough", {}, 0});
  variants.push_back({"A", o.a, {}, 0});
  variants.push_back({"B", o.b, {}, 0});
  return variants;
}

// Each variant's policy is valid for the command (false after printing which is not).
bool variants_valid(const AbOptions& o, const std::vector<VariantRuns>& variants,
                    const std::vector<std::string>& command) {
  for (const auto& v : variants) {
    LaunchSettings s = o.launch;
    s.conf = v.conf;
    s.conf_flag = v.label == "A" ? "--a" : v.label == "B" ? "--b" : "--baseline";
    if (std::string err = validate_launch_policy(s, command); !err.empty()) {
      print_error("cudapool ab: policy %s (%s) is invalid: %s\n", v.label.c_str(), v.conf.c_str(), err.c_str());
      return false;
    }
  }
  return true;
}

// Why a finished run does not count ("" when it does).
std::string run_failure(const ChildResult& r, bool have_summary, const std::string& err) {
  if (!r.started) return "could not start";
  if (r.signaled) return "killed by signal " + std::to_string(r.exit_status - 128);
  if (r.exit_status != 0) return "exit status " + std::to_string(r.exit_status);
  if (!have_summary) return "no summary written (was libcudapool.so loaded?): " + err;
  return "";
}

// Run k of `total`: the command once under v's policy, its figures added to v.runs. 0, or the
// exit status when no temporary file could be made.
int run_variant_once(const AbOptions& o, const std::vector<std::string>& command, const std::string& library,
                     VariantRuns& v, int k, int total) {
  LaunchSettings s = o.launch;
  s.conf = v.conf;
  s.stats = temp_stats_path();
  if (s.stats.empty()) {
    print_error("cudapool ab: cannot create a temporary file\n");
    return kExitNoInput;
  }
  EnvChanges changes = launch_environment(library, s);
  if (o.no_preload) changes.erase("LD_PRELOAD");  // the caller's LD_PRELOAD stays as it is
  auto env = build_environment(changes);
  std::fflush(nullptr);
  ChildResult r = run_child(command, env, o.hide_output);
  Summary summary;
  std::string err;
  // The library writes the summary at exit; an empty file means it never did.
  bool have = r.started && read_summary_file(s.stats, &summary, &err);
  std::remove(s.stats.c_str());
  const std::string what = run_failure(r, have, err);
  if (!what.empty()) {
    ++v.failed;
    std::fprintf(stderr, "cudapool ab: run %d/%d %s FAILED: %s\n", k, total, v.label.c_str(), what.c_str());
    return 0;
  }
  v.runs.push_back(metrics_from_stats(combined_stats(summary), r.wall_seconds));
  // Under backend:passthrough the pool serves nothing: only the wall time means anything.
  if (v.label == "base")
    for (std::size_t m = 1; m < v.runs.back().values.size(); ++m) v.runs.back().values[m].reset();
  std::fprintf(stderr, "cudapool ab: run %d/%d %s ok, %s\n", k, total, v.label.c_str(),
               format_seconds(r.wall_seconds).c_str());
  return 0;
}

// The comparison: the table (or the JSON alone with --json -), the JSON and Markdown files. The
// exit status: 1 when a run failed, else whether the files were written.
int report_ab(const AbOptions& o, const std::vector<std::string>& command, const std::vector<VariantRuns>& variants,
              int total) {
  std::size_t a = variants.size() - 2, b = variants.size() - 1;
  Table table = ab_table(variants, a, b);
  bool wrote = true;
  if (o.json == "-") {  // the JSON alone on stdout, for scripts
    emit_json("-", ab_json(command, variants, a, b), "cudapool ab");
  } else {
    std::printf("A: %s\nB: %s\n", o.a.empty() ? "(defaults)" : o.a.c_str(), o.b.empty() ? "(defaults)" : o.b.c_str());
    std::printf("%s", table.to_text().c_str());
  }
  if (!o.json.empty() && o.json != "-") wrote &= emit_json(o.json, ab_json(command, variants, a, b), "cudapool ab");
  if (!o.markdown.empty()) wrote &= write_text_file(o.markdown, table.to_markdown(), "cudapool ab");
  int failed = 0;
  for (const auto& v : variants) failed += v.failed;
  if (failed) print_error("cudapool ab: %d of %d runs failed\n", failed, total);
  return failed ? kExitFailedRuns : (wrote ? 0 : kExitNoInput);
}

// Runs the command n times under each variant, interleaved, then compares them.
int run_ab(const AbOptions& o, const std::vector<std::string>& command, const std::string& library,
           std::vector<VariantRuns> variants) {
  int total = o.n * static_cast<int>(variants.size()), k = 0;
  for (int i = 0; i < o.n; ++i)
    for (auto& v : variants)
      if (int rc = run_variant_once(o, command, library, v, ++k, total); rc != 0) return rc;
  return report_ab(o, command, variants, total);
}

int ab_main(const AbOptions& o, const CommandTail& tail) {
  std::vector<std::string> command = tail.present ? tail.words : o.command;
  if (command.empty()) {
    print_error("cudapool ab: no command given (usage: cudapool ab --a S --b S -- CMD ...)\n");
    return kExitUsage;
  }
  // A program that cannot be started fails every run the same way: say so once, before any.
  int status = 0;
  if (std::string why = check_program(command.front(), &status); !why.empty()) {
    print_error("cudapool ab: cannot run %s\n", why.c_str());
    return status;
  }
  if (!o.baseline.empty() && o.baseline != "passthrough") {
    print_error("cudapool ab: --baseline takes only 'passthrough'\n");
    return kExitUsage;
  }
  if (!output_option_ok(o.json, "--json", "cudapool ab") || !output_option_ok(o.markdown, "--markdown", "cudapool ab"))
    return kExitNoInput;
  std::vector<std::string> searched;
  auto library = o.no_preload ? std::optional<std::string>("") : find_library(&searched);
  if (!library) {
    print_error("cudapool ab: cannot find libcudapool.so (looked at %zu places; set CUDAPOOL_LIBRARY)\n",
                searched.size());
    return kExitNoInput;
  }
  std::vector<VariantRuns> variants = ab_variants(o);
  if (!variants_valid(o, variants, command)) return kPolicyErrorExitStatus;
  return run_ab(o, command, *library, std::move(variants));
}

}  // namespace

void add_ab_command(CLI::App& root, const CommandTail& tail, int* exit_status) {
  auto o = std::make_shared<AbOptions>();
  CLI::App* sub = root.add_subcommand("ab", "run CMD alternately under policies A and B and compare");
  sub->add_option("--a", o->a, "policy A (CUDAPOOL_CONF string; empty = defaults)")->required();
  sub->add_option("--b", o->b, "policy B")->required();
  sub->add_option("-n", o->n, "runs per policy")->check(CLI::Range(1, 1000));
  sub->add_option("--baseline", o->baseline, "also run with the pool off: 'passthrough'");
  sub->add_option("--json", o->json, "write the comparison as JSON here ('-': print only the JSON)");
  sub->add_option("--markdown", o->markdown, "write the table as Markdown");
  sub->add_flag("--no-preload", o->no_preload,
                "do not preload libcudapool.so (CMD loads it itself, or is `cudapool replay`)");
  sub->add_flag("--hide-output", o->hide_output, "send CMD's stdout and stderr to /dev/null");
  add_launch_options(sub, &o->launch, false);
  sub->add_option("command", o->command, "the program and its arguments (after --)");
  sub->callback([o, &tail, exit_status] { *exit_status = ab_main(*o, tail); });
}

}  // namespace cudapool::tools
