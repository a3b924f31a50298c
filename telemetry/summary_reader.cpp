// JSON → Summary, for the tools (`cudapool ab`, `run --stats`); unknown names are skipped so
// newer files stay readable. Not linked into libcudapool.so, which only writes summaries.
#include "telemetry/summary_reader.h"

#include <cstring>
#include <sstream>

#include "config/input_file.h"
#include "telemetry/json_reader.h"

namespace cudapool {
namespace {

bool want_int(const json::Value* v, std::int64_t* out) {
  if (v == nullptr) return true;  // absent: keep the default
  if (v->type != json::Value::Type::integer) return false;
  *out = v->i;
  return true;
}

}  // namespace

bool from_json(std::string_view text, Summary* out, std::string* error) {
  json::Value root;
  std::string perr;
  if (!json::parse(text, &root, &perr)) {
    if (error) *error = "invalid JSON: " + perr;
    return false;
  }
  auto bad = [&](const std::string& what) {
    if (error) *error = what;
    return false;
  };
  if (root.type != json::Value::Type::object) return bad("the summary is not a JSON object");
  const json::Value* fmt = root.find("format");
  if (fmt == nullptr || fmt->type != json::Value::Type::string || fmt->s != "cudapool-summary")
    return bad("not a cudapool summary (\"format\" is not \"cudapool-summary\")");
  std::int64_t version = 0;
  if (!want_int(root.find("version"), &version) || version < 1) return bad("\"version\" must be a positive integer");
  if (version > Summary::kFormatVersion)
    return bad("summary format version " + std::to_string(version) + " is newer than this reader (" +
               std::to_string(Summary::kFormatVersion) + ")");

  Summary s;
  if (!want_int(root.find("pid"), &s.pid)) return bad("\"pid\" must be an integer");
  if (!want_int(root.find("start_unix_ns"), &s.start_unix_ns)) return bad("\"start_unix_ns\" must be an integer");
  std::int64_t exit_status = s.exit_status;
  if (!want_int(root.find("exit_status"), &exit_status)) return bad("\"exit_status\" must be an integer");
  s.exit_status = static_cast<int>(exit_status);
  for (auto [key, dst] :
       {std::pair<const char*, std::string*>{"command", &s.command}, {"policy", &s.policy}, {"backend", &s.backend}}) {
    if (const json::Value* v = root.find(key)) {
      if (v->type != json::Value::Type::string) return bad(std::string("\"") + key + "\" must be a string");
      *dst = v->s;
    }
  }
  if (const json::Value* v = root.find("wall_time_s")) {
    if (!v->is_number()) return bad("\"wall_time_s\" must be a number");
    s.wall_time_s = v->as_double();
  }
  if (const json::Value* v = root.find("passthrough")) {
    if (v->type != json::Value::Type::object) return bad("\"passthrough\" must be an object");
    for (const auto& [kind, count] : v->members) {
      if (count.type != json::Value::Type::integer) return bad("passthrough count \"" + kind + "\" must be an integer");
      s.passthrough[kind] = count.i;
    }
  }
  for (auto [key, into] : {std::pair{"pinned_host", &s.pinned_host}, std::pair{"runtime_api", &s.runtime_api}}) {
    const json::Value* v = root.find(key);
    if (v == nullptr) continue;
    if (v->type != json::Value::Type::object) return bad("\"" + std::string(key) + "\" must be an object");
    for (const auto& [name, value] : v->members) {
      if (value.type != json::Value::Type::integer)
        return bad(std::string(key) + " \"" + name + "\" must be an integer");
      (*into)[name] = value.i;
    }
  }
  if (const json::Value* v = root.find("devices")) {
    if (v->type != json::Value::Type::array) return bad("\"devices\" must be an array");
    for (std::size_t i = 0; i < v->items.size(); ++i) {
      const json::Value& dv = v->items[i];
      const std::string where = "devices[" + std::to_string(i) + "]";
      if (dv.type != json::Value::Type::object) return bad(where + " must be an object");
      DeviceSummary d;
      std::int64_t dev = 0, total = 0;
      if (!want_int(dv.find("device"), &dev)) return bad(where + ".device must be an integer");
      if (!want_int(dv.find("driver_total_bytes"), &total) || total < 0)
        return bad(where + ".driver_total_bytes must be a non-negative integer");
      d.device = static_cast<int>(dev);
      d.driver_total_bytes = static_cast<std::uint64_t>(total);
      if (const json::Value* st = dv.find("stats")) {
        if (st->type != json::Value::Type::object) return bad(where + ".stats must be an object");
        for (const auto& [name, val] : st->members) {
          if (val.type != json::Value::Type::integer) return bad(where + ".stats." + name + " must be an integer");
          set_stat(&d.stats, name, val.i);  // unknown names: from a newer writer, skipped
        }
      }
      s.devices.push_back(d);
    }
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
