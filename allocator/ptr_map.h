// Internal: block start address -> value, open addressing with linear probing and
// backward-shift deletion (no tombstones, so lookups stay short under churn). Insert and erase
// never allocate except when the table doubles at half load, which is rare and amortized.
// Keys are block addresses (multiples of 512, never 0); 0 marks an empty slot.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cudapool::detail {

template <class V>
class PtrMap {
 public:
  PtrMap() { resize(1024); }

  std::size_t size() const { return size_; }

  V find(std::uintptr_t key) const {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return V{};
    }
  }

  // Precondition: key != 0 and not present.
  void insert(std::uintptr_t key, V value) {
    if ((size_ + 1) * 2 > slots_.size()) resize(slots_.size() * 2);
    place(key, value);
    ++size_;
  }

  // Removes and returns the value for key, or V{} if absent.
  V take(std::uintptr_t key) {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return V{};
    }
    V value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      const bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return value;
  }

  void clear() {
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    V value{};
  };
  std::size_t home(std::uintptr_t key) const {
    // Low 9 bits are always zero (512 B granularity); Fibonacci hashing mixes the rest.
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void place(std::uintptr_t key, V value) {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = Slot{key, value};
  }
  void resize(std::size_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    for (const Slot& s : old)
      if (s.key != 0) place(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace cudapool::detail
