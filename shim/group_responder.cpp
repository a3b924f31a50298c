// Cooperative release, the answering side (shim/group_responder.h).
#include "shim/group_responder.h"

#include <cstdint>

#include "shim/log.h"

namespace cudapool::shim::group {

void respond(ProcessPools& pools, Member& m) {
  // Requests made before this thread started are answered at once.
  std::uint32_t last = m.acked();
  // Giving back waits for the pool's fences under its lock when idle memory is not enough: a
  // request that finds no more idle memory than an answer that gave nothing left (a waiter asks
  // again every 10 ms) is answered without it.
  std::size_t left_idle = 0;
  bool gave_nothing = false;
  for (;;) {
    const std::uint32_t req = m.wait_request(last, 1'000'000'000);
    if (pools.exiting() || m.broken() || m.closed()) return;
    if (req == last) continue;
    std::size_t idle = 0, freed = 0;
    pools.for_each([&](int device, DevicePool& pool) {
      if (device == m.device()) idle += pool.cached_bytes();
    });
    const std::uint64_t want = m.take_want();
    if (idle != 0 && (!gave_nothing || idle > left_idle)) {
      idle = 0;
      pools.for_each([&](int device, DevicePool& pool) {
        if (device != m.device()) return;
        if (want == 0)
          freed += pool.empty_cache();
        else if (freed < want)
          freed += pool.release_idle(want - freed);
        idle += pool.cached_bytes();
      });
    }
    left_idle = idle;
    gave_nothing = freed == 0;
    last = req;
    m.answered(req, freed);
    if (freed != 0) log_info("group {}: gave back {} of idle cached memory on request", m.name(), mib(freed));
  }
}

}  // namespace cudapool::shim::group
