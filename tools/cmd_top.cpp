// `cudapool top [--once] [--json PATH] [--interval S]`: every pooled process of this user on this
// machine, from the stats records the shim publishes (telemetry/share.h), refreshed like top.
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "shim/group/group_ledger_layout.h"
#include "sys/printable.h"
#include "telemetry/share.h"
#include "tools/cli_io.h"
#include "tools/commands.h"
#include "tools/json_text.h"
#include "tools/top.h"

namespace cudapool::tools {

namespace {

struct TopSettings {
  bool once = false;
  std::string json;  // --json PATH ('-' = stdout), as in every command
  double interval = 1.0;
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

std::string mib(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

// At one moment, memory cached in whole free segments is not fragmented: the pool can give it
// back or hand it out whole (CACHED shows it). FRAG is the part of reserved memory that is free
// but cut up: free pieces of segments that still hold live blocks (inactive_split), which neither
// empty_cache nor a request larger than the piece can use. A process whose memory is all cache
// shows 0 %, one whose segments are all live 0 % too.
double top_fragmentation(const share::RecordDevice& d) {
  if (d.reserved == 0) return 0.0;
  return static_cast<double>(std::min(d.inactive_split, d.reserved)) / static_cast<double>(d.reserved);
}

namespace {

double frag(const share::RecordDevice& d) { return top_fragmentation(d); }

std::string fragmentation_text(const share::RecordDevice& d) {
  if (d.reserved == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * frag(d));
  return buf;
}

std::string json_u(std::uint64_t v) { return std::to_string(v); }

// One group on one GPU, from its ledger: what the budget bounds, summed over the members that
// may still live (slots of processes that are certainly gone wait for the next member to join or
// be refused, which reclaims them; they are left out here and only counted). A group with no
// member left is not shown at all.
struct GroupFigures {
  std::string group, gpu;
  std::uint64_t budget = 0, total = 0, reserved = 0, outside = 0;
  std::uint64_t gone_bytes = 0;  // still charged to members that exited
  int parked = 0;
  std::uint64_t parked_bytes = 0;  // the parked members' bytes in host memory
  int members = 0, gone = 0;
};

std::vector<GroupFigures> group_figures(const std::vector<share::LedgerView>& ledgers) {
  std::vector<GroupFigures> out;
  for (const share::LedgerView& l : ledgers) {
    GroupFigures g;
    g.group = l.group;
    g.gpu = l.gpu;
    g.budget = l.budget;
    g.total = l.total;
    for (const share::SlotView& s : l.live) {
      if (share::process_liveness(s.pid, s.start_time, s.pid_ns) == share::Liveness::gone) {
        ++g.gone;
        g.gone_bytes += s.reserved + s.outside;
        continue;
      }
      ++g.members;
      if (s.parked) {
        ++g.parked;
        g.parked_bytes += s.parked_bytes;
      }
      g.reserved += s.reserved;
      g.outside += s.outside;
    }
    if (g.members == 0) continue;  // a group that ended: its file waits for the next member
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.group + a.gpu < b.group + b.gpu; });
  return out;
}

// Parking (shim/parking/parking.h): the process as a whole.
std::string parking_json(const share::ProcInfo::Parking& k) {
  return std::string("{\"parked\":") + (k.parked ? "true" : "false") + ",\"parked_bytes\":" + json_u(k.parked_bytes) +
         ",\"parking_on\":" + (k.parkable != share::kRecordParkOff ? "true" : "false") +
         ",\"parkable\":" + (k.parkable == share::kRecordParkable ? "true" : "false") +
         ",\"why_not_parkable\":" + json_string(k.parkable == share::kRecordParkable ? std::string() : k.why) +
         ",\"parks\":" + json_u(k.parks) + ",\"unparks\":" + json_u(k.unparks) +
         ",\"bytes_out\":" + json_u(k.bytes_out) + ",\"bytes_in\":" + json_u(k.bytes_in) +
         ",\"park_ns\":" + json_u(k.park_ns) + ",\"unpark_ns\":" + json_u(k.unpark_ns) + "}";
}

std::string to_json(const std::vector<share::ProcInfo>& procs, const std::vector<GroupFigures>& groups) {
  std::string o = "{\"processes\":[";
  for (std::size_t i = 0; i < procs.size(); ++i) {
    const share::ProcInfo& p = procs[i];
    if (i != 0) o += ",";
    o += "{\"pid\":" + std::to_string(p.pid) + (p.other_namespace ? ",\"other_pid_namespace\":true" : "") +
         ",\"command\":" + json_string(p.command) + ",\"group\":" + json_string(p.group) +
         ",\"updated_unix_ns\":" + std::to_string(p.updated_unix_ns) + ",\"parking\":" + parking_json(p.parking) +
         ",\"devices\":[";
    for (std::size_t k = 0; k < p.devices.size(); ++k) {
      const share::RecordDevice& d = p.devices[k];
      if (k != 0) o += ",";
      o += "{\"device\":" + std::to_string(d.device) + ",\"reserved_bytes\":" + json_u(d.reserved) +
           ",\"allocated_bytes\":" + json_u(d.allocated) + ",\"cached_bytes\":" + json_u(d.cached) +
           ",\"external_bytes\":" + json_u(d.external) + ",\"outside_bytes\":" + json_u(d.outside) +
           ",\"inactive_split_bytes\":" + json_u(d.inactive_split) + ",\"fragmentation\":" + json_number(frag(d)) +
           ",\"peak_reserved_bytes\":" + json_u(d.peak_reserved) + ",\"ooms\":" + json_u(d.ooms) +
           ",\"fence_waits\":" + json_u(d.fence_waits) + ",\"group_budget_bytes\":" + json_u(d.group_budget) +
           ",\"group_reserved_bytes\":" + json_u(d.group_reserved) + "}";
    }
    o += "]}";
  }
  o += "],\"groups\":[";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const GroupFigures& g = groups[i];
    if (i != 0) o += ",";
    o += "{\"group\":" + json_string(g.group) + ",\"gpu\":" + json_string(g.gpu) +
         ",\"budget_bytes\":" + json_u(g.budget) + ",\"reserved_bytes\":" + json_u(g.reserved) +
         ",\"outside_bytes\":" + json_u(g.outside) + ",\"total_bytes\":" + json_u(g.total) +
         ",\"members\":" + std::to_string(g.members) + ",\"gone_members\":" + std::to_string(g.gone) +
         ",\"gone_bytes\":" + json_u(g.gone_bytes) + ",\"parked_members\":" + std::to_string(g.parked) +
         ",\"parked_bytes\":" + json_u(g.parked_bytes) + "}";
  }
  o += "]}\n";
  return o;
}

// One line per group under the table (names from a ledger: another process's, so printable()).
// The members that exited are still charged until the next join or refusal reclaims their slots:
// their bytes are a term of the sum, so the terms add up to the ledger's total.
std::string group_lines(const std::vector<GroupFigures>& groups) {
  char line[512];
  std::string o;
  for (const GroupFigures& g : groups) {
    const std::string gone = g.gone != 0 ? " + exited members " + mib(g.gone_bytes) + " MiB" : "";
    std::snprintf(line, sizeof line,
                  "group %s on %s: pool %s MiB + outside the pools %s MiB%s = %s of %s MiB (%d member(s)",
                  printable(g.group).c_str(), printable(g.gpu).c_str(), mib(g.reserved).c_str(), mib(g.outside).c_str(),
                  gone.c_str(), mib(g.total).c_str(), mib(g.budget).c_str(), g.members);
    o += line;
    if (g.parked != 0) o += "; " + std::to_string(g.parked) + " parked, " + mib(g.parked_bytes) + " MiB in host memory";
    if (g.gone != 0) o += "; " + std::to_string(g.gone) + " exited, reclaimed at the next join or refusal";
    o += ")\n";
  }
  return o;
}

}  // namespace

std::string top_group_lines(const std::vector<share::LedgerView>& ledgers) {
  return group_lines(group_figures(ledgers));
}

// Every string of a record is another process's (its command line, its group) or a file name in
// a shared directory: printed only through printable(), so no escape sequence reaches the terminal.
std::string top_table(const std::vector<share::ProcInfo>& procs) {
  char line[512];
  std::string o;
  std::snprintf(line, sizeof line, "%7s %3s %10s %10s %9s %9s %9s %6s %-12s %14s %5s %7s %8s  %s\n", "PID", "GPU",
                "RESERVED", "ALLOCATED", "CACHED", "EXTERNAL", "OUTSIDE", "FRAG", "GROUP", "GROUP/BUDGET", "OOMS",
                "FWAITS", "PARKED", "COMMAND");
  o += line;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::int64_t now_ns = static_cast<std::int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
  for (const share::ProcInfo& p : procs) {
    std::string cmd = printable(p.command.size() > 60 ? p.command.substr(0, 57) + "..." : p.command);
    const std::string group = p.group.empty() ? "-" : printable(p.group);
    // Records are refreshed every 250 ms; an older one belongs to a process that is stopped or
    // stuck (its figures are that old).
    if (const std::int64_t age = now_ns - p.updated_unix_ns; p.updated_unix_ns != 0 && age > 2'000'000'000LL)
      cmd = "[not updated for " + std::to_string(age / 1'000'000'000LL) + " s] " + cmd;
    if (p.other_namespace) cmd = "[pid of another PID namespace] " + cmd;
    // PARKED: the MiB the process holds in host memory while parked. One whose group parks but
    // that may not be parked now says why (another process's text: printable()).
    const std::string parked = p.parking.parked ? mib(p.parking.parked_bytes) : "-";
    if (!p.parking.parked && p.parking.parkable == share::kRecordParkNotNow)
      cmd = "[not parkable: " + printable(p.parking.why) + "] " + cmd;
    if (p.devices.empty()) {
      std::snprintf(line, sizeof line, "%7d %3s %10s %10s %9s %9s %9s %6s %-12s %14s %5s %7s %8s  %s\n", p.pid, "-",
                    "-", "-", "-", "-", "-", "-", group.c_str(), "-", "-", "-", parked.c_str(), cmd.c_str());
      o += line;
    }
    for (const share::RecordDevice& d : p.devices) {
      const std::string budget = d.group_budget != 0 ? mib(d.group_reserved) + "/" + mib(d.group_budget) : "-";
      std::snprintf(line, sizeof line, "%7d %3d %10s %10s %9s %9s %9s %6s %-12s %14s %5llu %7llu %8s  %s\n", p.pid,
                    d.device, mib(d.reserved).c_str(), mib(d.allocated).c_str(), mib(d.cached).c_str(),
                    mib(d.external).c_str(), mib(d.outside).c_str(), fragmentation_text(d).c_str(), group.c_str(),
                    budget.c_str(), static_cast<unsigned long long>(d.ooms),
                    static_cast<unsigned long long>(d.fence_waits), parked.c_str(), cmd.c_str());
      o += line;
    }
  }
  return o;
}

namespace {

int top_main(const TopSettings& s) {
  if (!(s.interval >= 0.1 && s.interval <= 3600)) {
    print_error("cudapool top: --interval %g is outside [0.1, 3600] seconds\n", s.interval);
    return kExitUsage;
  }
  const std::string dir = share::shm_dir();
  if (std::string why = share::check_dir(dir); !why.empty()) {
    print_error("cudapool top: %s %s; set CUDAPOOL_SHM_DIR to the directory the processes use\n",
                printable(dir).c_str(), why.c_str());
    return kExitNoInput;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  if (!output_option_ok(s.json, "--json", "cudapool top")) return kExitNoInput;
  const bool tty = !s.once && s.json.empty() && isatty(1) != 0;
  std::set<std::string> warned;  // each warning once per session, not on every refresh
  for (;;) {
    std::vector<std::string> warnings;
    std::vector<share::ProcInfo> procs = share::read_records(::geteuid(), true, &warnings);
    std::sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
    const std::vector<GroupFigures> groups = group_figures(share::read_ledgers(::geteuid(), &warnings));
    if (!s.json.empty()) {
      // '-': one object per refresh on stdout; a file: rewritten with the latest each refresh.
      if (!emit_json(s.json, to_json(procs, groups), "cudapool top")) return kExitNoInput;
    } else {
      std::string out = top_table(procs) + group_lines(groups);
      if (tty) out = "\x1b[H\x1b[2J" + out + "(" + std::to_string(procs.size()) + " pooled process(es); Ctrl-C ends)\n";
      std::fputs(out.c_str(), stdout);
      std::fflush(stdout);
    }
    for (const std::string& w : warnings)
      if (warned.insert(w).second) std::fprintf(stderr, "warning: %s\n", printable(w).c_str());
    if (s.once || g_stop) return 0;
    const auto us = static_cast<useconds_t>(s.interval * 1e6);
    for (useconds_t slept = 0; slept < us && !g_stop; slept += 50000) usleep(std::min<useconds_t>(50000, us - slept));
    if (g_stop) return 0;
  }
}

}  // namespace

void add_top_command(CLI::App& root, int* exit_status) {
  auto s = std::make_shared<TopSettings>();
  CLI::App* sub = root.add_subcommand("top",
                                      "live table of this user's pooled processes (reserved, cached, group budget)");
  sub->add_flag("--once", s->once, "print one table (or JSON object) and exit");
  sub->add_option("--json", s->json,
                  "write JSON instead of the table here, as every command does ('-': stdout, one object per "
                  "refresh; a file: rewritten each refresh)");
  sub->add_option("--interval", s->interval, "seconds between refreshes");
  sub->callback([s, exit_status] { *exit_status = top_main(*s); });
}

}  // namespace cudapool::tools
