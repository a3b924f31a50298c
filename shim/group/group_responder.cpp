// Cooperative release, the answering side (shim/group/group_responder.h).
#include "shim/group/group_responder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "shim/group/group_park.h"
#include "shim/log.h"
#include "shim/parking/parking.h"

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

namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
std::uint64_t mem_available() {
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* at = std::strstr(buf, "MemAvailable:");
  if (at == nullptr) return 0;
  return std::strtoull(at + std::strlen("MemAvailable:"), nullptr, 10) * 1024;  // "MemAvailable:  123 kB"
}

// Why a park of `bytes` would take more host memory than group_park_host_mb lets it; "" when not.
std::string host_room(Member& m, std::uint64_t bytes) {
  const std::int64_t limit = m.park_settings().host_limit;
  if (limit < 0) {
    const std::uint64_t avail = mem_available();
    if (avail != 0 && bytes > avail / 2)
      return mib(bytes) + " to park, more than half of the host's available memory (" + mib(avail) +
             "; group_park_host_mb:auto)";
    return {};
  }
  const std::uint64_t others = m.others_parked_bytes();
  if (others + bytes < others || others + bytes > static_cast<std::uint64_t>(limit))
    return mib(bytes) + " to park, with " + mib(others) + " parked by other members, passes group_park_host_mb (" +
           mib(static_cast<std::uint64_t>(limit)) + ")";
  return {};
}

void answer_park(ProcessPools& pools, Member& m, std::uint32_t req, const Member::ParkAsk& ask) {
  const Member::ParkSettings& s = m.park_settings();
  const std::string asker = "pid " + std::to_string(ask.from);
  if (!s.on) {
    m.park_answered(req, share::kParkDisabled, 0, {});
    return;
  }
  if (m.asking()) {
    m.park_answered(req, share::kParkBusy, 0, "waiting for memory itself");
    log_info("group {}: not parked for {}: this process is waiting for memory itself", m.name(), asker);
    return;
  }
  const std::int64_t active = sample_activity();
  const std::int64_t idle = share::monotonic_ns() - active;
  // A turn (every member works): the park below waits for the call in flight, whatever the idle time.
  if (!ask.turn && s.idle_ns > 0 && idle < s.idle_ns) {
    m.park_answered(req, share::kParkBusy, 0, "its last GPU call was " + std::to_string(idle / 1'000'000) + " ms ago");
    log_info("group {}: not parked for {}: the last GPU call was {} ms ago (group_park_idle_ms {})", m.name(), asker,
             idle / 1'000'000, s.idle_ns / 1'000'000);
    return;
  }
  // What a park would copy: the live bytes of every pool of the process (a park takes them all).
  std::uint64_t live = 0;
  pools.for_each(
      [&](int, DevicePool& pool) { live += static_cast<std::uint64_t>(pool.stats().allocated_bytes[kAll].current); });
  if (std::string full = host_room(m, live); !full.empty()) {
    m.park_answered(req, share::kParkHostFull, 0, "it would hold " + mib(live) + " in host memory");
    log_info("group {}: not parked for {}: {}", m.name(), asker, full);
    return;
  }
  const std::uint64_t before = m.own_reserved();
  const std::string reason = "group " + m.name() + ": " + asker + " needs " + mib(ask.want) + " on device " +
                             std::to_string(m.device());
  std::string why;
  const bool ok = park::park(park::Mode::copy, reason.c_str(), &why);
  const std::uint64_t after = m.own_reserved();
  const std::uint64_t gave = ok && before > after ? before - after : 0;
  if (!ok) {
    m.park_answered(req, share::kParkRefused, 0, why);
    log_info("group {}: not parked for {}: {}", m.name(), asker, why);
    return;
  }
  m.park_answered(req, share::kParkDone, gave, {});
  log_info("group {}: parked for {}{}, which needs {} on device {}: {} given back, {} in host memory", m.name(), asker,
           ask.turn ? " in turn" : "", mib(ask.want), m.device(), mib(gave), mib(park::parked_bytes()));
}

}  // namespace

void respond_parks(ProcessPools& pools, Member& m) {
  std::uint32_t last = m.park_acked();
  // While the process is parked the thread looks every 5 ms whether a call restored it, so the
  // others see it resident (and may park it again) at once, not at the next publication.
  bool shown_parked = false;
  for (;;) {
    const std::uint32_t req = m.wait_park_request(last, shown_parked ? 5'000'000 : 1'000'000'000);
    if (pools.exiting() || m.broken() || m.closed()) return;
    if (park::parked()) {
      shown_parked = true;
    } else if (shown_parked) {
      shown_parked = false;
      publish_parking_of(m);
    }
    if (req == last) continue;
    last = req;
    try {
      answer_park(pools, m, req, m.park_ask());
      shown_parked = park::parked();
    } catch (...) {
      m.park_answered(req, share::kParkRefused, 0, "out of host memory");
    }
  }
}

}  // namespace cudapool::shim::group
