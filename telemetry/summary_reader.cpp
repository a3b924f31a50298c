// JSON → Summary, for the tools (`cudapool ab`, `run --stats`); unknown names are skipped so
// newer files stay readable. Not linked into libcudapool.so, which only writes summaries.
#include "telemetry/summary_reader.h"

#include <cstring>
#include <sstream>

#include "sys/input_file.h"
#include "telemetry/json_reader.h"

namespace cudapool {
namespace {

bool want_int(const json::Value* v, std::int64_t* out) {
  if (v == nullptr) return true;  // absent: keep the default
  if (v->type != json::Value::Type::integer) return false;
  *out = v->i;
  return true;
}

// Each reader below returns "" or what is wrong with the summary.

// A JSON object whose "format" is a cudapool summary of a version this reader knows.
std::string check_header(const json::Value& root) {
  if (root.type != json::Value::Type::object) return "the summary is not a JSON object";
  const json::Value* fmt = root.find("format");
  if (fmt == nullptr || fmt->type != json::Value::Type::string || fmt->s != "cudapool-summary")
    return "not a cudapool summary (\"format\" is not \"cudapool-summary\")";
  std::int64_t version = 0;
  if (!want_int(root.find("version"), &version) || version < 1) return "\"version\" must be a positive integer";
  if (version > Summary::kFormatVersion)
    return "summary format version " + std::to_string(version) + " is newer than this reader (" +
           std::to_string(Summary::kFormatVersion) + ")";
  return {};
}

// The run's own fields: pid, start, exit status, command, policy, backend, wall time.
std::string read_run(const json::Value& root, Summary& s) {
  if (!want_int(root.find("pid"), &s.pid)) return "\"pid\" must be an integer";
  if (!want_int(root.find("start_unix_ns"), &s.start_unix_ns)) return "\"start_unix_ns\" must be an integer";
  std::int64_t exit_status = s.exit_status;
  if (!want_int(root.find("exit_status"), &exit_status)) return "\"exit_status\" must be an integer";
  s.exit_status = static_cast<int>(exit_status);
  for (auto [key, dst] :
       {std::pair<const char*, std::string*>{"command", &s.command}, {"policy", &s.policy}, {"backend", &s.backend}}) {
    if (const json::Value* v = root.find(key)) {
      if (v->type != json::Value::Type::string) return std::string("\"") + key + "\" must be a string";
      *dst = v->s;
    }
  }
  if (const json::Value* v = root.find("wall_time_s")) {
    if (!v->is_number()) return "\"wall_time_s\" must be a number";
    s.wall_time_s = v->as_double();
  }
  return {};
}

// The counts by name: passthrough, pinned_host, runtime_api.
std::string read_counts(const json::Value& root, Summary& s) {
  if (const json::Value* v = root.find("passthrough")) {
    if (v->type != json::Value::Type::object) return "\"passthrough\" must be an object";
    for (const auto& [kind, count] : v->members) {
      if (count.type != json::Value::Type::integer) return "passthrough count \"" + kind + "\" must be an integer";
      s.passthrough[kind] = count.i;
    }
  }
  for (auto [key, into] : {std::pair{"pinned_host", &s.pinned_host}, std::pair{"runtime_api", &s.runtime_api}}) {
    const json::Value* v = root.find(key);
    if (v == nullptr) continue;
    if (v->type != json::Value::Type::object) return "\"" + std::string(key) + "\" must be an object";
    for (const auto& [name, value] : v->members) {
      if (value.type != json::Value::Type::integer) return std::string(key) + " \"" + name + "\" must be an integer";
      (*into)[name] = value.i;
    }
  }
  return {};
}

// One element of "devices", named `where` in the messages.
std::string read_device(const json::Value& dv, const std::string& where, DeviceSummary& d) {
  if (dv.type != json::Value::Type::object) return where + " must be an object";
  std::int64_t dev = 0, total = 0;
  if (!want_int(dv.find("device"), &dev)) return where + ".device must be an integer";
  if (!want_int(dv.find("driver_total_bytes"), &total) || total < 0)
    return where + ".driver_total_bytes must be a non-negative integer";
  d.device = static_cast<int>(dev);
  d.driver_total_bytes = static_cast<std::uint64_t>(total);
  if (const json::Value* st = dv.find("stats")) {
    if (st->type != json::Value::Type::object) return where + ".stats must be an object";
    for (const auto& [name, val] : st->members) {
      if (val.type != json::Value::Type::integer) return where + ".stats." + name + " must be an integer";
      set_stat(&d.stats, name, val.i);  // unknown names: from a newer writer, skipped
    }
  }
  return {};
}

std::string read_devices(const json::Value& root, Summary& s) {
  const json::Value* v = root.find("devices");
  if (v == nullptr) return {};
  if (v->type != json::Value::Type::array) return "\"devices\" must be an array";
  for (std::size_t i = 0; i < v->items.size(); ++i) {
    DeviceSummary d;
    if (std::string e = read_device(v->items[i], "devices[" + std::to_string(i) + "]", d); !e.empty()) return e;
    s.devices.push_back(d);
  }
  return {};
}

}  // namespace

bool from_json(std::string_view text, Summary* out, std::string* error) {
  json::Value root;
  std::string perr;
  if (!json::parse(text, &root, &perr)) {
    if (error) *error = "invalid JSON: " + perr;
    return false;
  }
  Summary s;
  std::string e = check_header(root);
  if (e.empty()) e = read_run(root, s);
  if (e.empty()) e = read_counts(root, s);
  if (e.empty()) e = read_devices(root, s);
  if (!e.empty()) {
    if (error) *error = std::move(e);
    return false;
  }
  *out = std::move(s);
  return true;
}

bool read_summary_file(const std::string& path, Summary* out, std::string* error) {
  std::string why;
  const int fd = open_input_file(path, &why);  // a FIFO or a device is refused without blocking
  if (fd < 0) {
    if (error) *error = path + ": cannot open: " + why;
    return false;
  }
  InputFileBuf file(fd);
  std::ostringstream buf;
  buf << &file;
  if (file.failed()) {
    if (error) *error = path + ": cannot read: " + std::strerror(file.error());
    return false;
  }
  std::string err;
  if (!from_json(buf.str(), out, &err)) {
    if (error) *error = path + ": " + err;
    return false;
  }
  return true;
}

}  // namespace cudapool
