#include "shim/warm_start/warm_start.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "shim/fences/streams.h"
#include "shim/group/group.h"
#include "shim/log.h"
#include "shim/runtime.h"
#include "telemetry/warm_plan.h"

namespace cudapool::shim {

namespace {

// Free device memory the warm start leaves alone: what the program takes outside the pool (its
// libraries' handles, kernels, other contexts) may not all be there yet when the pool starts.
std::size_t margin_for(std::size_t total) { return std::min<std::size_t>(256 * MiB, total / 16); }

std::string mib(std::size_t bytes) { return std::to_string((bytes + MiB / 2) / MiB); }

// A fraction as a key takes it, rounded up to three decimals (so the suggested value fits).
std::string fraction_up(double f) {
  const auto thousandths = static_cast<long>(std::ceil(f * 1000.0 - 1e-9));
  if (thousandths >= 1000) return "1";
  if (thousandths <= 0) return "0.001";
  std::string digits = std::to_string(thousandths);
  return "0." + std::string(3 - digits.size(), '0') + digits;
}

std::int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The plan, read once per process (every device's pool uses the same file) and kept for the
// process's life: nothing is freed at exit. nullptr when it cannot be used (said once).
// Leaked (usable at exit, never destroyed); made afresh in a forked child, whose copy may have
// been held by a parent thread at the fork.
std::mutex* plan_mutex() {
  static std::mutex* mu = [] {
    auto* m = new std::mutex;
    pthread_atfork(nullptr, nullptr, [] { new (plan_mutex()) std::mutex; });
    return m;
  }();
  return mu;
}

const WarmPlan* shared_plan(const std::string& path) {
  static const WarmPlan* plan = nullptr;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(*plan_mutex());
  if (tried) return plan;
  tried = true;
  auto* p = new WarmPlan;
  std::string error;
  if (!load_warm_plan(path, p, &error)) {
    log_warn(
        "warm_start: {}; no memory is preallocated (make a plan with `cudapool plan TRACE -o PLAN`, or name a "
        "trace written under trace_file)",
        error);
    delete p;
    return nullptr;
  }
  plan = p;
  return plan;
}

struct Prealloc {
  std::size_t bytes = 0;  // reserved by the pool because of it
  AllocStatus failed = AllocStatus::ok;
  Refusal refusal = Refusal::none;  // out_of_memory: who refused
};

const char* who_refused(const Prealloc& p) {
  if (p.failed != AllocStatus::out_of_memory) return "the driver failed";
  switch (p.refusal) {
    case Refusal::limit: return "the pool's cap refused";
    case Refusal::budget: return "the group budget refused";
    default: return "the device refused";
  }
}

// Grows the pool's `kind` by at least `target` reserved bytes with DevicePool::prefill, which
// allocates nothing: the program's statistics, trace and OOM counts see only its own requests.
// `sizes`: classic segments of the large pool, one growth each; otherwise growths of what is
// missing (pages map it at once; the small pool's classic segments come 2 MiB at a time).
void fill_kind(ContextPool& cp, StreamId stream, bool small, std::size_t target, const std::vector<std::size_t>& sizes,
               Prealloc* out) {
  const StatPool k = small ? kSmallPool : kLargePool;
  auto reserved = [&] { return static_cast<std::size_t>(cp.pool.stats().reserved_bytes[k].current); };
  const std::size_t start = reserved();
  const std::size_t goal = start + target;
  auto grow = [&](std::size_t bytes) {
    const AllocResult r = cp.pool.prefill(bytes, small, stream);
    if (r.status == AllocStatus::ok) return true;
    out->failed = r.status;
    out->refusal = r.refusal;
    return false;
  };
  if (!sizes.empty()) {
    for (std::size_t s : sizes)
      if (!grow(s)) break;
  } else {
    const std::size_t most = std::min<std::size_t>(target / kSmallBuffer + 4, 1u << 16);
    for (std::size_t i = 0; i < most && reserved() < goal; ++i) {
      const std::size_t before = reserved();
      if (!grow(goal - before) || reserved() == before) break;  // refused, or nothing left to map
    }
  }
  const std::size_t now = reserved();
  out->bytes += now > start ? now - start : 0;
}

// The plan's segments for device `dev`, largest first (in the plan's order among equals).
std::vector<const WarmSegment*> segments_for(const WarmPlan& plan, int dev) {
  std::vector<const WarmSegment*> segs;
  for (const WarmSegment& s : plan.segments)
    if (s.device == dev) segs.push_back(&s);
  std::stable_sort(segs.begin(), segs.end(),
                   [](const WarmSegment* a, const WarmSegment* b) { return a->bytes > b->bytes; });
  return segs;
}

// What a segment costs in this pool: a classic pool makes a segment of at least 20 MiB for a
// large request (a plan recorded with pages may list smaller runs).
std::size_t cost_of(const WarmSegment& s, bool pages) {
  return s.small || pages ? s.bytes : std::max(s.bytes, segment_size_for(s.bytes));
}

// One bound on what the warm start may reserve: the room it leaves, what it is, how to lift it.
struct Limit {
  std::size_t room;
  std::string what, fix;
};

// Free device memory, less a margin for what the program takes outside the pool.
Limit device_limit(std::size_t free_bytes, std::size_t total) {
  const std::size_t margin = margin_for(total);
  return {free_bytes > margin ? free_bytes - margin : 0,
          "the device's free memory (" + mib(free_bytes) + " MiB, less " + mib(margin) +
              " MiB left for memory outside the pool)",
          "free device memory (other processes on this GPU hold the rest)"};
}

// The pool's cap (max_reserved_mb, or per_process_memory_fraction where it is lower), if any;
// `held`: what the pool holds already, `need`: what the plan asks for.
void add_cap_limit(const PoolOptions& o, std::size_t total, std::size_t held, std::size_t need,
                   std::vector<Limit>* limits) {
  std::size_t cap = o.max_reserved;
  std::string cap_name = "max_reserved_mb:" + (cap == kNoLimit ? std::string("0") : mib(cap));
  if (o.per_process_memory_fraction > 0.0) {
    const auto by_fraction = static_cast<std::size_t>(o.per_process_memory_fraction * static_cast<double>(total));
    if (by_fraction < cap) {
      cap = by_fraction;
      cap_name = "per_process_memory_fraction (" + mib(cap) + " MiB of " + mib(total) + ")";
    }
  }
  if (cap == kNoLimit) return;
  const double frac = total > 0 ? static_cast<double>(held + need) / static_cast<double>(total) : 1.0;
  limits->push_back({cap > held ? cap - held : 0, "the pool's cap " + cap_name,
                     "raise the cap to at least " + mib(held + need) + " MiB (max_reserved_mb:" + mib(held + need) +
                         (frac <= 1.0 ? ", or per_process_memory_fraction:" + fraction_up(frac) : "") + ")"});
}

// The group budget's room, for a member of a group. A member that left its group (budget 0)
// runs under its own caps only.
void add_group_limit(const ContextPool& cp, std::size_t need, std::vector<Limit>* limits) {
  if (cp.member == nullptr || group::budget(*cp.member) == 0) return;
  const std::size_t budget = group::budget(*cp.member), used = group::group_reserved(*cp.member);
  const std::size_t room = budget > used ? budget - used : 0;
  limits->push_back({room,
                     "the group budget's room (" + mib(room) + " MiB of its " + mib(budget) + " MiB; the group holds " +
                         mib(used) + " MiB)",
                     "raise group_budget_mb (or group_budget_fraction) by at least " +
                         mib(need - std::min(need, room)) + " MiB" +
                         (used > 0 ? ", or start this process while the group holds less" : "")});
}

// What bounds the warm start of `cp`: free device memory (less a margin), the pool's cap, the
// group budget's room.
std::vector<Limit> limits_for(ContextPool& cp, std::size_t need) {
  std::size_t free_bytes = 0, total = 0;
  cp.upstream.mem_info(&free_bytes, &total);
  const std::size_t held = static_cast<std::size_t>(cp.pool.stats().reserved_bytes[kAll].current) +
                           cp.pool.external_bytes();
  std::vector<Limit> limits;
  limits.push_back(device_limit(free_bytes, total));
  add_cap_limit(cp.pool.options(), total, held, need, &limits);
  add_group_limit(cp, need, &limits);
  return limits;
}

// The tightest limit that leaves less room than `need`, or nullptr when the plan fits whole.
const Limit* binding_limit(const std::vector<Limit>& limits, std::size_t need) {
  const Limit* binding = nullptr;
  for (const Limit& l : limits)
    if (l.room < need && (binding == nullptr || l.room < binding->room)) binding = &l;
  return binding;
}

// The segments chosen: whole ones in the plan's order, as many as fit in what is allowed.
struct Choice {
  std::size_t small_target = 0, large_target = 0;
  std::vector<std::size_t> large_sizes;  // classic segments, for a pool without pages
  std::size_t chosen = 0;
};

Choice choose(const std::vector<const WarmSegment*>& segs, bool pages, std::size_t allowed) {
  Choice out;
  for (const WarmSegment* s : segs) {
    const std::size_t c = cost_of(*s, pages);
    if (out.chosen + c > allowed) continue;
    out.chosen += c;
    if (s->small) {
      out.small_target += c;
    } else {
      out.large_target += c;
      out.large_sizes.push_back(s->bytes);
    }
  }
  return out;
}

// Reserves what was chosen, small pool first, and says how it went.
void preallocate(ContextPool& cp, StreamId stream, const Choice& c, bool pages, const std::string& path) {
  const int dev = cp.device;
  const std::int64_t t0 = mono_ns();
  Prealloc pre;
  if (c.small_target > 0) fill_kind(cp, stream, true, c.small_target, {}, &pre);
  if (c.large_target > 0 && pre.failed == AllocStatus::ok)
    fill_kind(cp, stream, false, c.large_target, pages ? std::vector<std::size_t>{} : c.large_sizes, &pre);
  const double ms = static_cast<double>(mono_ns() - t0) / 1e6;
  if (pre.failed != AllocStatus::ok)
    log_warn(
        "warm_start: device {}: {} memory ({}) after {} MiB of the plan's {} MiB; the program grows the pool "
        "for the rest as usual",
        dev, who_refused(pre), to_string(pre.failed), mib(pre.bytes), mib(c.chosen));
  else
    log_info("warm_start: device {}: {} MiB preallocated ({} MiB small pool, {} MiB large pool) from {} in {:.1f} ms",
             dev, mib(pre.bytes), mib(c.small_target), mib(c.large_target), path, ms);
}

void run(Runtime& rt, ContextPool& cp, StreamId stream, const WarmPlan& plan) {
  const std::string& path = rt.policy().warm_start;
  const int dev = cp.device;
  const std::vector<const WarmSegment*> segs = segments_for(plan, dev);
  if (segs.empty()) {
    log_info("warm_start: {} has no segment for device {}; nothing preallocated", path, dev);
    return;
  }
  const bool pages = cp.pool.options().expandable_segments && cp.upstream.granularity() != 0;
  std::size_t need = 0;
  for (const WarmSegment* s : segs) need += cost_of(*s, pages);
  const std::vector<Limit> limits = limits_for(cp, need);
  const Limit* binding = binding_limit(limits, need);
  const std::size_t allowed = binding != nullptr ? binding->room : need;
  const Choice choice = choose(segs, pages, allowed);
  if (binding != nullptr)
    log_warn(
        "warm_start: the plan {} holds {} MiB of segments for device {}, {} MiB more than fits {}; preallocating "
        "{} MiB of it. To preallocate all of it: {}",
        path, mib(need), dev, mib(need - allowed), binding->what, mib(choice.chosen), binding->fix);
  if (choice.chosen == 0) return;
  preallocate(cp, stream, choice, pages, path);
}

}  // namespace

void warm_start(Runtime& rt, ContextPool& cp, StreamId stream) noexcept {
  // An allocation the driver would refuse now (a capture is open) leaves it to a later one.
  if (any_capture_active() || Runtime::exiting()) return;
  if (!cp.warm_pending.exchange(false, std::memory_order_acq_rel)) return;
  try {
    const WarmPlan* plan = shared_plan(rt.policy().warm_start);
    if (plan != nullptr) run(rt, cp, stream, *plan);
  } catch (...) {
    // Out of host memory while planning: the program runs without the warm start.
  }
}

}  // namespace cudapool::shim
