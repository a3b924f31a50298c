// The last out-of-memory diagnosis, kept for cudapool_last_oom_message(): the pluggable
// allocator's callers (the Python module's PyTorch glue) put it into the exception they raise.
#pragma once
#include <cstddef>
#include <string>

namespace cudapool::shim {

// Keeps `msg` as the calling thread's and the process's last diagnosis. Never throws.
void note_oom(const std::string& msg) noexcept;
// The calling thread's last diagnosis if it has one, else the process's (empty: none yet).
std::string last_oom() noexcept;

}  // namespace cudapool::shim
