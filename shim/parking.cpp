// Parking (shim/parking.h).
#include "shim/parking.h"

namespace cudapool::shim::park {

namespace detail {
std::atomic<unsigned> g_closed{0};
std::atomic<bool> g_fence_on_enter{true};
struct Slot {
  std::atomic<unsigned> inside{0};
};
constinit thread_local Slot* tl_slot = nullptr;
Slot& my_slot() noexcept {
  static thread_local Slot s;
  tl_slot = &s;
  return s;
}
std::atomic<unsigned>& inside_word(Slot& s) noexcept { return s.inside; }
int enter_slow(Slot&) noexcept { return 0; }
}  // namespace detail

std::string why_not_parkable() { return "parking is not implemented yet"; }
bool park(Mode, const char*, std::string* why) noexcept {
  if (why != nullptr) *why = "parking is not implemented yet";
  return false;
}
bool unpark(std::string*) noexcept { return true; }
bool parked() noexcept { return false; }
std::uint64_t parked_bytes() noexcept { return 0; }
std::uint64_t activity() noexcept { return 0; }
Counters counters() noexcept { return Counters{0, 0, 0, 0, 0, 0}; }
void set_restore_wait(RestoreWait) noexcept {}
int door_enter() noexcept { return 0; }
void door_leave() noexcept {}

}  // namespace cudapool::shim::park
