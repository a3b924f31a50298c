// A fake Upstream for tests, tools and benchmarks: hands out host address ranges instead of
// device memory. Header-only so any test binary can use it without linking anything.
//
// * Unbacked (default): addresses come from a private bump counter in a range no real mapping
//   uses; nothing may be dereferenced. Cheap enough for millions of operations and for huge
//   "devices".
// * Backed: every segment is a real anonymous mmap, so tests can write tags into blocks and
//   catch overlapping live blocks; expandable ranges are PROT_NONE reservations whose pages are
//   made readable/writable by map() and dropped by unmap().
// Segments are separated by an unused gap, so a pool that merged across segments would be caught.
// Like the driver, every map() is one physical unit: an unmap or move must cover whole units
// (anything else is a bad call), and a move keeps each unit's size at its new address. An alias
// maps units a second time and leaves the old mapping until unalias(): until then nothing may be
// mapped over the old address (a bad call), which is how a pool that reused it early is caught.
// Failures are injectable (fail_next, capacity); every call is counted. Thread-safe.
#pragma once
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "allocator/types.h"
#include "allocator/upstream.h"

namespace cudapool::testing {

class FakeUpstream : public Upstream {
 public:
  explicit FakeUpstream(std::size_t capacity = 80 * GiB, bool backed = false) : capacity_(capacity), backed_(backed) {}

  ~FakeUpstream() override {
    // Do not leak host memory when a test fails half-way; the pool is gone by now.
    if (!backed_) return;
    for (auto& [base, size] : segments_) ::munmap(reinterpret_cast<void*>(base), size);
    for (auto& [base, r] : reservations_) ::munmap(reinterpret_cast<void*>(base), r.size);
  }

  // ---- Upstream ----------------------------------------------------------------------------
  UpstreamStatus allocate(std::size_t bytes, void** out) override {
    if (hook_) hook_(bytes);  // outside our lock: lets a test widen races or block
    std::lock_guard<std::mutex> lock(mu_);
    ++allocate_calls_;
    if (fail_next_ > 0) {
      --fail_next_;
      ++failed_calls_;
      return fail_status_;
    }
    if (bytes == 0 || bytes % kMinBlockSize != 0) {
      ++bad_calls_;
      return UpstreamStatus::error;
    }
    if (bytes > capacity_ || held_ + mapped_ + bytes > capacity_) {
      ++failed_calls_;
      return UpstreamStatus::out_of_memory;
    }
    std::uintptr_t base = 0;
    if (backed_) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        ++failed_calls_;
        return UpstreamStatus::out_of_memory;
      }
      base = reinterpret_cast<std::uintptr_t>(p);
    } else {
      base = take_address(bytes);
    }
    segments_[base] = bytes;
    held_ += bytes;
    peak_held_ = std::max(peak_held_, held_);
    *out = reinterpret_cast<void*>(base);
    return UpstreamStatus::ok;
  }

  void release(void* base, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++release_calls_;
    auto it = segments_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == segments_.end() || it->second != bytes) {
      ++bad_calls_;  // unknown base or wrong size: a pool bug; tests assert bad_calls() == 0
      return;
    }
    if (backed_) ::munmap(base, bytes);
    held_ -= bytes;
    segments_.erase(it);
  }

  void mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++mem_info_calls_;
    if (free_bytes) *free_bytes = capacity_ - std::min(capacity_, held_ + mapped_);
    if (total_bytes) *total_bytes = capacity_;
  }

  // ---- Expandable segments (enabled by set_granularity(g) with g > 0) ----------------------
  std::size_t granularity() override {
    std::lock_guard<std::mutex> lock(mu_);
    return granularity_;
  }

  UpstreamStatus reserve(std::size_t bytes, std::size_t page, void** out) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++reserve_calls_;
    if (granularity_ == 0 || bytes == 0 || page == 0 || page % granularity_ != 0 || bytes % page != 0) {
      ++bad_calls_;
      return UpstreamStatus::error;
    }
    std::uintptr_t base = 0;
    if (backed_) {
      void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return UpstreamStatus::out_of_memory;
      base = reinterpret_cast<std::uintptr_t>(p);
    } else {
      base = take_address(bytes);
    }
    reservations_[base] = Reservation{bytes, page, {}, base, {}};
    *out = reinterpret_cast<void*>(base);
    return UpstreamStatus::ok;
  }

  void unreserve(void* base, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reservations_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == reservations_.end() || it->second.size != bytes || !it->second.units.empty() ||
        !it->second.aliases.empty()) {
      ++bad_calls_;  // unknown range, wrong size, or pages still mapped
      return;
    }
    if (backed_) ::munmap(base, bytes);
    reservations_.erase(it);
  }

  UpstreamStatus map(void* addr, std::size_t bytes) override {
    if (hook_) hook_(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++map_calls_;
    if (fail_next_ > 0) {
      --fail_next_;
      ++failed_calls_;
      return fail_status_;
    }
    auto a = reinterpret_cast<std::uintptr_t>(addr);
    Reservation* r = find_reservation(a, bytes);
    if (r == nullptr || !whole_pages(*r, a, bytes)) {
      ++bad_calls_;
      return UpstreamStatus::error;
    }
    if (overlaps_unit(*r, a, bytes) || overlaps_alias(*r, a, bytes)) {
      ++bad_calls_;  // mapping a page twice
      return UpstreamStatus::error;
    }
    if (held_ + mapped_ + bytes > capacity_) {
      ++failed_calls_;
      return UpstreamStatus::out_of_memory;
    }
    r->units[a] = bytes;  // one physical allocation, like cuMemCreate of `bytes`
    pages_mapped_ += bytes / r->page;
    if (backed_) ::mprotect(addr, bytes, PROT_READ | PROT_WRITE);
    mapped_ += bytes;
    peak_held_ = std::max(peak_held_, held_ + mapped_);
    return UpstreamStatus::ok;
  }

  void unmap(void* addr, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++unmap_calls_;
    auto a = reinterpret_cast<std::uintptr_t>(addr);
    Reservation* r = find_reservation(a, bytes);
    if (r == nullptr || !whole_pages(*r, a, bytes)) {
      ++bad_calls_;
      return;
    }
    if (!whole_units(*r, a, bytes)) {
      ++bad_calls_;  // unmapping what is not mapped, or part of a physical allocation
      return;
    }
    r->units.erase(r->units.lower_bound(a), r->units.lower_bound(a + bytes));
    if (backed_) {
      ::madvise(addr, bytes, MADV_DONTNEED);
      ::mprotect(addr, bytes, PROT_NONE);
    }
    mapped_ -= bytes;
  }

  // The pool's recycling path: like the shim, every unit keeps its size at its new address.
  UpstreamStatus move(void* from, void* to, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++move_calls_;
    ++unmap_calls_;  // a move is an unmap and a map of the same memory, and counts as both
    ++map_calls_;
    const auto src = reinterpret_cast<std::uintptr_t>(from), dst = reinterpret_cast<std::uintptr_t>(to);
    Reservation* rs = find_reservation(src, bytes);
    Reservation* rd = find_reservation(dst, bytes);
    if (rs == nullptr || rd == nullptr || !whole_pages(*rs, src, bytes) || !whole_pages(*rd, dst, bytes) ||
        !whole_units(*rs, src, bytes) || overlaps_unit(*rd, dst, bytes) || overlaps_alias(*rd, dst, bytes)) {
      ++bad_calls_;
      return UpstreamStatus::error;
    }
    std::vector<std::pair<std::uintptr_t, std::size_t>> moved(rs->units.lower_bound(src),
                                                              rs->units.lower_bound(src + bytes));
    rs->units.erase(rs->units.lower_bound(src), rs->units.lower_bound(src + bytes));
    for (const auto& [at, size] : moved) rd->units[dst + (at - src)] = size;
    units_moved_ += moved.size();
    if (backed_) {
      ::madvise(from, bytes, MADV_DONTNEED);
      ::mprotect(from, bytes, PROT_NONE);
      ::mprotect(to, bytes, PROT_READ | PROT_WRITE);
    }
    return UpstreamStatus::ok;
  }

  bool can_alias() override {
    std::lock_guard<std::mutex> lock(mu_);
    return granularity_ != 0 && alias_on_;
  }
  UpstreamStatus alias(void* from, void* to, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++alias_calls_;
    ++map_calls_;
    if (!alias_on_) {
      ++bad_calls_;  // the pool asked can_alias() first
      return UpstreamStatus::error;
    }
    if (alias_fail_next_ > 0) {
      --alias_fail_next_;
      ++failed_calls_;
      return UpstreamStatus::error;
    }
    const auto src = reinterpret_cast<std::uintptr_t>(from), dst = reinterpret_cast<std::uintptr_t>(to);
    Reservation* rs = find_reservation(src, bytes);
    Reservation* rd = find_reservation(dst, bytes);
    if (rs == nullptr || rd == nullptr || rs->page != rd->page || !whole_pages(*rs, src, bytes) ||
        !whole_pages(*rd, dst, bytes) || !whole_units(*rs, src, bytes) || overlaps_unit(*rd, dst, bytes) ||
        overlaps_alias(*rd, dst, bytes)) {
      ++bad_calls_;
      return UpstreamStatus::error;
    }
    std::vector<std::pair<std::uintptr_t, std::size_t>> moved(rs->units.lower_bound(src),
                                                              rs->units.lower_bound(src + bytes));
    rs->units.erase(rs->units.lower_bound(src), rs->units.lower_bound(src + bytes));
    for (const auto& [at, size] : moved) {
      rd->units[dst + (at - src)] = size;
      rs->aliases[at] = size;
    }
    if (backed_) ::mprotect(to, bytes, PROT_READ | PROT_WRITE);  // the old address stays accessible
    return UpstreamStatus::ok;
  }
  void unalias(void* addr, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++unalias_calls_;
    ++unmap_calls_;
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    Reservation* r = find_reservation(a, bytes);
    std::uintptr_t at = a;
    if (r != nullptr)
      for (auto it = r->aliases.find(a); it != r->aliases.end() && it->first == at && at < a + bytes; ++it)
        at += it->second;
    if (r == nullptr || at != a + bytes) {
      ++bad_calls_;  // not exactly old mappings left by alias()
      return;
    }
    r->aliases.erase(r->aliases.lower_bound(a), r->aliases.lower_bound(a + bytes));
    if (backed_) {
      ::madvise(addr, bytes, MADV_DONTNEED);
      ::mprotect(addr, bytes, PROT_NONE);
    }
  }

  // ---- Control -----------------------------------------------------------------------------
  // An upstream without aliasing (can_alias() false), like one whose driver cannot map a handle
  // twice; and the next n alias() calls failing.
  void set_alias(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    alias_on_ = on;
  }
  void fail_next_alias(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    alias_fail_next_ = n;
  }
  // The next n allocate()/map() calls fail with `status` (before any capacity check).
  void fail_next(int n, UpstreamStatus status = UpstreamStatus::out_of_memory) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = n;
    fail_status_ = status;
  }
  void set_capacity(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = bytes;
  }
  void set_granularity(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    granularity_ = bytes;
  }
  // Called at the start of allocate()/map() with the size, without the fake's lock held.
  void set_hook(std::function<void(std::size_t)> hook) { hook_ = std::move(hook); }

  // ---- Counters ----------------------------------------------------------------------------
  std::size_t allocate_calls() const { return locked(allocate_calls_); }
  std::size_t release_calls() const { return locked(release_calls_); }
  std::size_t failed_calls() const { return locked(failed_calls_); }
  std::size_t bad_calls() const { return locked(bad_calls_); }
  std::size_t mem_info_calls() const { return locked(mem_info_calls_); }
  std::size_t reserve_calls() const { return locked(reserve_calls_); }
  std::size_t map_calls() const { return locked(map_calls_); }
  std::size_t unmap_calls() const { return locked(unmap_calls_); }
  std::size_t move_calls() const { return locked(move_calls_); }
  std::size_t alias_calls() const { return locked(alias_calls_); }
  std::size_t unalias_calls() const { return locked(unalias_calls_); }
  // Old mappings alias() left and unalias() has not removed yet, in bytes.
  std::size_t aliased_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (const auto& [base, r] : reservations_)
      for (const auto& [at, size] : r.aliases) n += size;
    return n;
  }
  // Whether [p, p+bytes) is still mapped as an old mapping left by alias().
  bool alias_at(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (const auto& [base, r] : reservations_)
      if (r.aliases.count(a) != 0) return true;
    return false;
  }
  // Pages mapped by map() so far, each counted in its range's page.
  std::size_t pages_mapped() const { return locked(pages_mapped_); }
  // Physical units moved so far (each one driver unmap + map), and the sizes of the units mapped
  // now, in address order.
  std::size_t units_moved() const { return locked(units_moved_); }
  std::vector<std::size_t> unit_sizes() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::size_t> out;
    for (const auto& [base, r] : reservations_)
      for (const auto& [at, size] : r.units) out.push_back(size);
    return out;
  }
  // The page size each reservation was made with, by base address order.
  std::vector<std::size_t> reservation_pages() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::size_t> out;
    for (const auto& [base, r] : reservations_) out.push_back(r.page);
    return out;
  }
  std::size_t bytes_held() const { return locked(held_); }      // allocate()d, not released
  std::size_t bytes_mapped() const { return locked(mapped_); }  // map()ped, not unmapped
  std::size_t peak_bytes() const { return locked(peak_held_); }
  std::size_t segments_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return segments_.size();
  }
  std::size_t reservations_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reservations_.size();
  }
  bool holds_segment(const void* base) const {
    std::lock_guard<std::mutex> lock(mu_);
    return segments_.count(reinterpret_cast<std::uintptr_t>(base)) != 0;
  }
  bool backed() const { return backed_; }

 private:
  struct Reservation {
    std::size_t size = 0;
    std::size_t page = 0;                         // the unit promised at reserve()
    std::map<std::uintptr_t, std::size_t> units;  // physical allocations: base -> bytes
    std::uintptr_t base = 0;
    std::map<std::uintptr_t, std::size_t> aliases;  // old mappings left by alias(): base -> bytes
  };
  // The pool's promise at reserve(): whole pages of the range, at page offsets from its base.
  bool whole_pages(const Reservation& r, std::uintptr_t a, std::size_t bytes) const {
    return granularity_ != 0 && bytes != 0 && (a - r.base) % r.page == 0 && bytes % r.page == 0;
  }

  bool overlaps_unit(const Reservation& r, std::uintptr_t a, std::size_t bytes) const {
    auto it = r.units.lower_bound(a);
    if (it != r.units.end() && it->first < a + bytes) return true;
    return it != r.units.begin() && std::prev(it)->first + std::prev(it)->second > a;
  }
  bool overlaps_alias(const Reservation& r, std::uintptr_t a, std::size_t bytes) const {
    auto it = r.aliases.lower_bound(a);
    if (it != r.aliases.end() && it->first < a + bytes) return true;
    return it != r.aliases.begin() && std::prev(it)->first + std::prev(it)->second > a;
  }
  // [a, a+bytes) is exactly a run of whole, adjacent units.
  bool whole_units(const Reservation& r, std::uintptr_t a, std::size_t bytes) const {
    std::uintptr_t at = a;
    for (auto it = r.units.find(a); it != r.units.end() && it->first == at && at < a + bytes; ++it) at += it->second;
    return at == a + bytes;
  }

  std::uintptr_t take_address(std::size_t bytes) {
    constexpr std::size_t kAlign = 2 * MiB;  // like the driver's large-allocation alignment
    std::uintptr_t base = next_;
    next_ += (bytes + kAlign - 1) / kAlign * kAlign + kAlign;  // + one unused gap
    return base;
  }
  Reservation* find_reservation(std::uintptr_t a, std::size_t bytes) {
    auto it = reservations_.upper_bound(a);
    if (it == reservations_.begin()) return nullptr;
    --it;
    if (a + bytes > it->first + it->second.size) return nullptr;
    return &it->second;
  }
  std::size_t locked(const std::size_t& v) const {
    std::lock_guard<std::mutex> lock(mu_);
    return v;
  }

  mutable std::mutex mu_;
  std::size_t capacity_;
  bool backed_;
  std::size_t granularity_ = 0;
  std::size_t pages_mapped_ = 0, units_moved_ = 0;
  std::uintptr_t next_ = std::uintptr_t{1} << 44;  // 16 TiB: no host mapping lives there
  std::map<std::uintptr_t, std::size_t> segments_;
  std::map<std::uintptr_t, Reservation> reservations_;
  std::function<void(std::size_t)> hook_;
  int fail_next_ = 0;
  UpstreamStatus fail_status_ = UpstreamStatus::out_of_memory;
  std::size_t held_ = 0, mapped_ = 0, peak_held_ = 0;
  std::size_t allocate_calls_ = 0, release_calls_ = 0, failed_calls_ = 0, bad_calls_ = 0;
  std::size_t mem_info_calls_ = 0, reserve_calls_ = 0, map_calls_ = 0, unmap_calls_ = 0, move_calls_ = 0;
  std::size_t alias_calls_ = 0, unalias_calls_ = 0;
  bool alias_on_ = true;
  int alias_fail_next_ = 0;
};

}  // namespace cudapool::testing
