// The patterns log_file, trace_file and stats_file may hold, so every process of a job writes its
// own file: %p = process id, %h = host name, %% = a literal %. Any other %x is kept as written.
#pragma once
#include <string>
#include <string_view>

namespace cudapool {

std::string expand_path_pattern(std::string_view pattern, long pid, std::string_view host);
// The same with this process's pid and host name.
std::string expand_path_pattern(std::string_view pattern);

}  // namespace cudapool
