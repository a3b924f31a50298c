// Internal: allocation-free (in steady state) storage for the pool's small objects.
// * NodeArena + ArenaAllocator: a free list of 64-byte slots that std::set nodes come from, so
//   inserting into / erasing from a free set never calls malloc after warm-up.
// * ObjectPool<T>: the same idea for Block, Segment and Batch objects.
// Neither is thread-safe: the pool uses them under its mutex only. Memory goes back to the
// system when the owning pool is destroyed.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace cudapool::detail {

class NodeArena {
 public:
  static constexpr std::size_t kSlot = 64;

  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() {
    for (void* c : chunks_) ::operator delete(c);
  }

  void* get(std::size_t bytes) {
    if (bytes > kSlot) return ::operator new(bytes);  // never happens for set nodes
    if (free_ == nullptr) refill();
    Slot* s = free_;
    free_ = s->next;
    return s;
  }
  void put(void* p, std::size_t bytes) noexcept {
    if (bytes > kSlot) {
      ::operator delete(p);
      return;
    }
    auto* s = static_cast<Slot*>(p);
    s->next = free_;
    free_ = s;
  }

 private:
  union Slot {
    Slot* next;
    alignas(alignof(std::max_align_t)) unsigned char raw[kSlot];
  };
  void refill() {
    constexpr std::size_t kPerChunk = 512;
    auto* c = static_cast<Slot*>(::operator new(sizeof(Slot) * kPerChunk));
    chunks_.push_back(c);
    for (std::size_t i = 0; i < kPerChunk; ++i) {
      c[i].next = free_;
      free_ = &c[i];
    }
  }
  Slot* free_ = nullptr;
  std::vector<void*> chunks_;
};

template <class T>
struct ArenaAllocator {
  using value_type = T;
  NodeArena* arena;
  explicit ArenaAllocator(NodeArena* a) noexcept : arena(a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& other) noexcept : arena(other.arena) {}
  T* allocate(std::size_t n) { return static_cast<T*>(arena->get(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { arena->put(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const ArenaAllocator<U>& o) const noexcept {
    return arena == o.arena;
  }
};

// T must be trivially destructible in spirit: get() hands out a value-initialized object,
// put() just links it back.
template <class T>
class ObjectPool {
 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;
  ~ObjectPool() {
    for (Slot* c : chunks_) delete[] c;
  }
  T* get() {
    if (free_ == nullptr) refill();
    Slot* s = free_;
    free_ = s->next;
    ++live_;
    return ::new (static_cast<void*>(&s->object)) T{};
  }
  void put(T* p) noexcept {
    p->~T();
    auto* s = reinterpret_cast<Slot*>(p);
    s->next = free_;
    free_ = s;
    --live_;
  }
  std::size_t live() const { return live_; }

 private:
  union Slot {
    Slot* next;
    T object;
    Slot() : next(nullptr) {}
    ~Slot() {}
  };
  void refill() {
    constexpr std::size_t kPerChunk = 256;
    Slot* c = new Slot[kPerChunk];
    chunks_.push_back(c);
    for (std::size_t i = 0; i < kPerChunk; ++i) {
      c[i].next = free_;
      free_ = &c[i];
    }
  }
  Slot* free_ = nullptr;
  std::vector<Slot*> chunks_;
  std::size_t live_ = 0;
};

}  // namespace cudapool::detail
