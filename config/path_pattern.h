// The patterns the paths of log_file, trace_file and stats_file (and the tools' output paths
// checked with them) may hold, so every process of a job writes its own file:
//   %p  process id      %h  host name      %t  Unix time in seconds (when the path is expanded)
//   %%  a literal '%'
// Any other '%x', and a '%' at the end, is kept as written (a stray '%' never makes a path
// unusable). The one definition of these patterns: the library and the tools both use it.
#pragma once
#include <string>
#include <string_view>

namespace cudapool {

std::string expand_path_pattern(std::string_view pattern, long pid, std::string_view host, long long unix_time);
// The same with this process's pid, host name ("unknown-host" if it has none) and the time now.
std::string expand_path_pattern(std::string_view pattern);

// A pattern that names a file of its own for every process: `pattern` itself when it holds %p,
// else the same with ".%p" before the extension of its last component ("/tmp/s.json" ->
// "/tmp/s.%p.json", "/tmp/s" -> "/tmp/s.%p"). What a forked child writes its summary to, so that
// it never replaces its parent's.
std::string per_process_pattern(std::string_view pattern);

}  // namespace cudapool
