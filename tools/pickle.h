// A small writer of Python pickles (protocol 2): dicts, lists, tuples, str, int, float, bool and
// None, streamed into a byte string as they are added. Enough for PyTorch's memory snapshot
// (tools/snapshot.h); no Python is needed to produce one.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cudapool::tools {

class PickleWriter {
 public:
  PickleWriter();
  void none();
  void boolean(bool v);
  void integer(std::int64_t v);
  void uinteger(std::uint64_t v);
  void real(double v);
  void str(std::string_view utf8);
  // Containers: begin_*, then the items (for a dict: key, value, key, value, …), then end().
  void begin_dict();
  void begin_list();
  void begin_tuple();
  void end();
  // Shorthands for dict entries with a str key.
  void key(std::string_view k) { str(k); }
  // The finished pickle (adds STOP). Every container must have been ended.
  std::string finish();
  // Containers still open (0 when the value is complete).
  std::size_t depth() const { return open_.size(); }

 private:
  enum class Kind : std::uint8_t { dict, list, tuple };
  std::string out_;
  std::vector<Kind> open_;
};

}  // namespace cudapool::tools
