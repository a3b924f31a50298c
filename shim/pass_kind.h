// Why a call went straight to the driver: counted per kind by the runtime (the exit summary
// lists them) and logged the first time (shim/log_audit.cpp).
#pragma once
#include <cstdint>

namespace cudapool::shim {

enum class PassKind : std::uint8_t {
  backend,          // policy backend=passthrough (or on_error=passthrough after a bad policy)
  foreign_pointer,  // a free/query of memory the pool does not own
  capture,          // allocation on a capturing stream / during a global-mode capture
  no_context,       // calling thread has no current context
  exiting,          // the process is exiting: frees of pool memory are leaked, allocations go to the driver
  count_
};
const char* to_string(PassKind k) noexcept;  // shim/runtime.cpp
void log_first_pass(PassKind k) noexcept;    // shim/log_audit.cpp: logs the first of each kind

}  // namespace cudapool::shim
