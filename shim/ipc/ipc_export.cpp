// CUDA IPC, the exporting process: every exported block has a record (which block, what an
// importer needs to map it, who holds it open), and a server thread answers importers on the
// process's Unix socket.
//
// Rules:
// - The server loop (shim/ipc/ipc_server.h) serves only processes of the same user, checks every
//   request before it reaches serve() here, bounds the connections and drops idle ones that hold
//   nothing; it asks this file which connections hold an import (held_by). Nothing sent to an
//   importer ever blocks.
// - A request that needs descriptors the process cannot get right now is answered `busy`, and
//   the importer asks again.
// - A block stays allocated while any importer holds it open. When the program frees it
//   earlier (CUDA calls that undefined behaviour; with a pool it would hand the bytes to the next
//   allocation while another process still writes them) the free is deferred: the block is freed
//   into the pool once the last importer closed it, by the next allocation or free hook of this
//   process. A connection that goes away (the importer exited or crashed) closes everything it held.
// - The server thread never calls CUDA: everything an importer needs (the segment's driver handle,
//   the pages' file descriptors) is taken when the program asks for the handle.
#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "shim/hooks/hooks.h"
#include "shim/ipc/ipc.h"
#include "shim/ipc/ipc_server.h"
#include "shim/ipc/ipc_wire.h"
#include "shim/log.h"

namespace cudapool::shim::ipc {

namespace detail {
std::atomic<int> g_exports{0};
std::atomic<bool> g_frees_ready{false};
}  // namespace detail

namespace {

using detail::g_exports;
using detail::g_frees_ready;

void after_fork_child() noexcept;

struct Record {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  const ContextPool* pool = nullptr;
  Kind kind = Kind::classic;
  CUipcMemHandle segment{};  // classic
  std::uint64_t offset = 0;
  std::vector<CudaUpstream::ExportedUnit> units;  // expandable: descriptors owned by the record
  std::unordered_map<int, int> holders;           // connection -> opens not yet released
  int holds = 0;
  bool freed = false;  // the program freed it while held
  CUipcMemHandle handle{};
};

struct Exporter {
  std::mutex mu;
  std::unordered_map<std::uint64_t, Record> by_id;
  std::unordered_map<std::uintptr_t, std::uint64_t> by_base;
  std::vector<std::pair<const ContextPool*, std::uintptr_t>> ready;  // released after a deferred free
  std::unordered_map<int, int> held_by;  // connection -> opens it holds, over all records (none: absent)
  std::uint64_t nonce = 0;
  std::uint64_t next_id = 1;
  int listen_fd = -1;
};

// Never destroyed: the server thread may still run while the process exits.
std::atomic<Exporter*> g_state{nullptr};
std::mutex g_state_mu;

Exporter& state() {
  Exporter* e = g_state.load(std::memory_order_acquire);
  if (e != nullptr) return *e;
  std::lock_guard<std::mutex> lock(g_state_mu);
  e = g_state.load(std::memory_order_relaxed);
  if (e == nullptr) {
    static std::once_flag fork_handler;
    std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, &after_fork_child); });
    e = new Exporter;
    g_state.store(e, std::memory_order_release);
  }
  return *e;
}

void close_units(Record& r) {
  for (auto& u : r.units) {
    if (u.fd >= 0) ::close(u.fd);
    u.fd = -1;
  }
  r.units.clear();
}

// Under mu: `conn` holds `n` more (or, negative, fewer) opens.
void count_holds(Exporter& e, int conn, int n) {
  const int now = (e.held_by[conn] += n);
  if (now <= 0) e.held_by.erase(conn);
}

// Under mu: the record ends (freed with nobody holding it, or its context went away).
void erase_record(Exporter& e, std::unordered_map<std::uint64_t, Record>::iterator it) {
  for (const auto& [conn, n] : it->second.holders) count_holds(e, conn, -n);
  close_units(it->second);
  auto b = e.by_base.find(it->second.base);
  if (b != e.by_base.end() && b->second == it->first) e.by_base.erase(b);
  e.by_id.erase(it);
  g_exports.fetch_sub(1, std::memory_order_relaxed);
}

// Under mu: one fewer open by `conn`; a block freed meanwhile goes to the pool once nobody holds it.
void release_hold(Exporter& e, std::unordered_map<std::uint64_t, Record>::iterator it, int conn, int n) {
  Record& r = it->second;
  auto h = r.holders.find(conn);
  if (h == r.holders.end()) return;
  n = std::min(n, h->second);
  h->second -= n;
  if (h->second == 0) r.holders.erase(h);
  r.holds -= n;
  count_holds(e, conn, -n);
  if (r.holds == 0 && r.freed) {
    e.ready.emplace_back(r.pool, r.base);
    g_frees_ready.store(true, std::memory_order_release);
    erase_record(e, it);
  }
}

// The connection is about to close: everything it held is released.
void release_connection(Exporter& e, int conn) {
  std::lock_guard<std::mutex> lock(e.mu);
  if (e.held_by.count(conn) == 0) return;
  for (auto it = e.by_id.begin(); it != e.by_id.end();) {
    auto next = std::next(it);
    if (it->second.holders.count(conn) != 0) release_hold(e, it, conn, it->second.holders[conn]);
    it = next;
  }
}

// One checked request from a connection. false: drop the connection (the reply was not sent).
bool serve_request(Exporter& e, int conn, const Request& req) {
  if (req.op == Op::release) {
    std::lock_guard<std::mutex> lock(e.mu);
    auto it = e.by_id.find(req.id);
    if (it != e.by_id.end()) release_hold(e, it, conn, 1);
    return true;
  }
  if (req.op != Op::open) return false;
  Reply rep;
  std::vector<std::size_t> sizes;
  std::vector<int> fds;  // duplicates, sent after the lock is dropped
  {
    std::lock_guard<std::mutex> lock(e.mu);
    auto it = e.by_id.find(req.id);
    if (it == e.by_id.end() || it->second.freed) {
      rep.status = Status::unknown;
    } else {
      Record& r = it->second;
      rep.status = Status::ok;
      rep.kind = r.kind;
      rep.size = r.size;
      rep.offset = r.offset;
      rep.segment = r.segment;
      for (const auto& u : r.units) {
        const int d = ::fcntl(u.fd, F_DUPFD_CLOEXEC, 0);
        if (d < 0) {
          // Out of descriptors (or memory) is passing: the importer asks again until its deadline.
          rep.status = errno == EMFILE || errno == ENFILE || errno == ENOMEM ? Status::busy : Status::error;
          break;
        }
        fds.push_back(d);
        sizes.push_back(u.bytes);
      }
      if (rep.status == Status::ok) {
        rep.units = static_cast<std::uint32_t>(fds.size());
        ++r.holders[conn];
        ++r.holds;
        count_holds(e, conn, 1);
      }
    }
  }
  if (rep.status != Status::ok) {  // a refusal carries no units
    for (int d : fds) ::close(d);
    fds.clear();
  }
  bool ok = send_message(conn, &rep, sizeof rep);
  for (std::size_t i = 0; ok && i < fds.size(); i += kUnitsPerMessage) {
    UnitBatch b;
    b.count = static_cast<std::uint32_t>(std::min<std::size_t>(kUnitsPerMessage, fds.size() - i));
    for (std::uint32_t k = 0; k < b.count; ++k) b.bytes[k] = sizes[i + k];
    ok = send_message(conn, &b, sizeof b, fds.data() + i, static_cast<int>(b.count));
  }
  for (int d : fds) ::close(d);
  if (!ok)
    log_warn("CUDA IPC: could not answer an importer (export {}): {}; dropping its connection", req.id,
             std::strerror(errno));
  return ok;  // a failed send drops the connection, and with it the hold just taken
}

// The exporter's side of the server loop (shim/ipc/ipc_server.h).
class ExporterOps final : public ServerOps {
 public:
  explicit ExporterOps(Exporter& e) : e_(e) {}
  bool serve(int conn, const Request& req) override { return serve_request(e_, conn, req); }
  void closing(int conn) override { release_connection(e_, conn); }
  bool holds(int conn) override {
    std::lock_guard<std::mutex> lock(e_.mu);
    return e_.held_by.count(conn) != 0;
  }

 private:
  Exporter& e_;
};

void server_thread(Exporter* e, int listen_fd) {
  ExporterOps ops(*e);
  Server server(listen_fd, ops);
  server.run();
}

// Under mu: the socket and the thread, once per process.
bool start_server(Exporter& e) {
  if (e.listen_fd >= 0) return true;
  std::uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) {
    nonce = static_cast<std::uint64_t>(std::time(nullptr)) * 0x9E3779B97F4A7C15ull ^
            static_cast<std::uint64_t>(::getpid()) << 32 ^ reinterpret_cast<std::uintptr_t>(&e);
  }
  const std::string name = socket_name(static_cast<std::uint32_t>(::getuid()), static_cast<std::uint32_t>(::getpid()),
                                       nonce);
  const int fd = listen_abstract(name);
  if (fd < 0) {
    log_warn("CUDA IPC: cannot open this process's socket ({}); pooled memory cannot be shared", std::strerror(errno));
    return false;
  }
  try {
    std::thread(server_thread, &e, fd).detach();
  } catch (...) {
    ::close(fd);
    log_warn("CUDA IPC: cannot start the server thread; pooled memory cannot be shared");
    return false;
  }
  e.nonce = nonce;
  e.listen_fd = fd;
  log_info("CUDA IPC: serving pooled memory to other processes of uid {} on socket @{}", static_cast<long>(::getuid()),
           name.substr(1));
  return true;
}

// Under mu: the live export of the block at `base` of `cp`, or nullptr.
const Record* live_export(Exporter& e, std::uintptr_t base, const ContextPool& cp) {
  auto b = e.by_base.find(base);
  if (b == e.by_base.end()) return nullptr;
  const Record& r = e.by_id.at(b->second);
  return !r.freed && r.pool == &cp ? &r : nullptr;
}

// Expandable: the descriptors of the block's pages, for importers to map.
CUresult take_units(ContextPool& cp, const AddressInfo& info, CUdeviceptr dptr, Record* rec) {
  rec->kind = Kind::expandable;
  const CUresult r = cp.upstream.export_units(info.block_base, info.block_size, &rec->units);
  if (r != CUDA_SUCCESS) {
    log_warn(
        "cuIpcGetMemHandle({:#x}): the pages of this expandable segment cannot be exported (CUDA error {}{}); "
        "returning it",
        static_cast<unsigned long long>(dptr), r,
        r == CUDA_ERROR_NOT_SUPPORTED ? ": the driver refused exportable pages here" : "");
    return r;
  }
  for (const auto& u : rec->units) ::fcntl(u.fd, F_SETFD, FD_CLOEXEC);  // never leak device memory into exec'd children
  rec->offset = info.block_base - rec->units.front().addr;
  return CUDA_SUCCESS;
}

// Classic: the driver's IPC handle of the block's segment.
CUresult take_segment(ContextPool& cp, const AddressInfo& info, Record* rec) {
  rec->kind = Kind::classic;
  const RealDriver& d = cp.upstream.driver();
  if (d.cuIpcGetMemHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  ScopedContext scope(d, cp.ctx);
  const CUresult r = d.cuIpcGetMemHandle(&rec->segment, static_cast<CUdeviceptr>(info.segment_base));
  if (r != CUDA_SUCCESS) return r;  // the driver's own answer (no IPC on this device, ...)
  rec->offset = info.block_base - info.segment_base;
  return CUDA_SUCCESS;
}

// What an importer will need, taken now, on the program's thread.
CUresult take_block(ContextPool& cp, const AddressInfo& info, CUdeviceptr dptr, Record* rec) {
  rec->base = info.block_base;
  rec->size = info.block_size;
  rec->pool = &cp;
  return info.expandable ? take_units(cp, info, dptr, rec) : take_segment(cp, info, rec);
}

// Under mu: `rec` becomes an export with a handle of its own, in *out.
void add_export(Exporter& e, Record rec, CUdeviceptr dptr, CUipcMemHandle* out) {
  Handle h{};
  std::memcpy(h.marker, kMarker, sizeof kMarker);
  h.version = kVersion;
  h.kind = rec.kind;
  h.pid = static_cast<std::uint32_t>(::getpid());
  h.uid = static_cast<std::uint32_t>(::getuid());
  h.nonce = e.nonce;
  h.id = e.next_id++;
  h.size = rec.size;
  encode(h, &rec.handle);
  *out = rec.handle;
  e.by_base[rec.base] = h.id;
  e.by_id.emplace(h.id, std::move(rec));
  g_exports.fetch_add(1, std::memory_order_relaxed);
  log_debug("cuIpcGetMemHandle({:#x}): export {} of a {} block of {} bytes", static_cast<unsigned long long>(dptr),
            h.id, h.kind == Kind::classic ? "classic" : "expandable", h.size);
}

}  // namespace

CUresult export_block(ContextPool& cp, CUdeviceptr dptr, CUipcMemHandle* out) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const void* p = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(dptr));
  const std::optional<AddressInfo> info = cp.pool.address_info(p);
  if (!info) {
    log_warn("cuIpcGetMemHandle({:#x}): no live block there (freed memory); CUDA_ERROR_INVALID_VALUE",
             static_cast<unsigned long long>(dptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  Exporter& e = state();
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (const Record* r = live_export(e, info->block_base, cp)) {
      *out = r->handle;
      return CUDA_SUCCESS;
    }
  }
  Record rec;
  if (const CUresult r = take_block(cp, *info, dptr, &rec); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(e.mu);
  // Another thread exported it meanwhile: one handle per block.
  if (const Record* r = live_export(e, info->block_base, cp)) {
    close_units(rec);
    *out = r->handle;
    return CUDA_SUCCESS;
  }
  if (!start_server(e)) {
    close_units(rec);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  add_export(e, std::move(rec), dptr, out);
  return CUDA_SUCCESS;
}

FreeVerdict on_free_slow(const void* p) noexcept {
  Exporter& e = state();
  std::lock_guard<std::mutex> lock(e.mu);
  auto b = e.by_base.find(reinterpret_cast<std::uintptr_t>(p));
  if (b == e.by_base.end()) return FreeVerdict::free;
  auto it = e.by_id.find(b->second);
  Record& r = it->second;
  if (r.freed) return FreeVerdict::already_freed;
  if (r.holds > 0) {
    r.freed = true;
    log_info("free of {} while {} importer open(s) still hold it: the pool frees it when the last one closes", p,
             r.holds);
    return FreeVerdict::held;
  }
  erase_record(e, it);
  return FreeVerdict::free;
}

void drain_frees_slow(Runtime& rt) noexcept {
  std::vector<std::pair<const ContextPool*, std::uintptr_t>> ready;
  {
    Exporter& e = state();
    std::lock_guard<std::mutex> lock(e.mu);
    ready.swap(e.ready);
    g_frees_ready.store(false, std::memory_order_relaxed);
  }
  for (auto& [pool, base] : ready) {
    void* p = reinterpret_cast<void*>(base);
    ContextPool* cp = rt.owner_of(p);
    if (cp != pool) continue;  // its context went away meanwhile: nothing left to free
    const FreeStatus s = cp->pool.free(p);
    if (s != FreeStatus::ok) log_warn("CUDA IPC: the deferred free of {} failed: {}", p, to_string(s));
  }
}

void forget_pool(const ContextPool* cp) noexcept {
  Exporter* e = g_state.load(std::memory_order_acquire);
  if (e == nullptr) return;
  std::lock_guard<std::mutex> lock(e->mu);
  for (auto it = e->by_id.begin(); it != e->by_id.end();) {
    auto next = std::next(it);
    if (it->second.pool == cp) erase_record(*e, it);
    it = next;
  }
  std::erase_if(e->ready, [cp](const auto& r) { return r.first == cp; });
}

namespace {

// The parent's socket and pages are not the child's to serve.
void after_fork_child() noexcept {
  Exporter* old = g_state.load(std::memory_order_relaxed);
  if (old == nullptr) return;
  // If no parent thread held the lock at fork the records are whole: close their descriptors
  // (a forked worker must not keep exported pages alive). Otherwise they stay open in this child
  // only, and close on exec.
  if (old->listen_fd >= 0) ::close(old->listen_fd);
  if (old->mu.try_lock()) {
    for (auto& [id, r] : old->by_id) close_units(r);
  }
  new (&g_state_mu) std::mutex;
  g_state.store(nullptr, std::memory_order_relaxed);
  g_exports.store(0, std::memory_order_relaxed);
  g_frees_ready.store(false, std::memory_order_relaxed);
}

}  // namespace

}  // namespace cudapool::shim::ipc
