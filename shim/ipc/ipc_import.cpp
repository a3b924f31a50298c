// CUDA IPC, the importing process: opening a handle the shim made in another process, closing it,
// and answering queries about the imported block.
//
// One import per (exporting process, export, context), reference counted like CUDA's own
// cuIpcOpenMemHandle: opening it again returns the same pointer, and only the last close unmaps.
// A classic block maps its segment through the driver's legacy IPC (which counts repeated opens
// of one segment itself) and points at the block inside it; an expandable block imports the file
// descriptors of its physical units, maps them into a fresh range of this process and points at
// the block inside that. The connection to an exporter stays open while anything of it is
// imported: the exporter holds those blocks allocated for as long, and lets go of them when the
// connection closes, whether by the last close or by this process's end.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "shim/hooks/hooks.h"
#include "shim/ipc/ipc.h"
#include "shim/ipc/ipc_wire.h"
#include "shim/log.h"
#include "sys/timed_lock.h"

namespace cudapool::shim::ipc {

namespace detail {
std::atomic<int> g_imports{0};
}  // namespace detail

namespace {

using detail::g_imports;

constexpr int kReplyTimeoutMs = 10000;               // an exporter that does not answer in time is treated as gone
constexpr std::chrono::milliseconds kBusyRetry{20};  // between asks while the exporter answers `busy`

// One connection to one exporter. Its exchanges (a request and its reply) take turns on `io`,
// which is held across the wait for the peer; the importer's own mutex never is.
struct Conn {
  int fd = -1;
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;
  int imports = 0;
  int users = 0;        // threads between finding it and the end of their exchange (under mu)
  bool broken = false;  // an exchange on it failed half-way: kept only for the holds of its imports
  std::timed_mutex io;
};

struct Import {
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;
  std::uint64_t id = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr ptr = 0;
  std::size_t size = 0;
  int refs = 0;
  Kind kind = Kind::classic;
  CUdeviceptr segment_base = 0;  // classic: what the driver's open returned
  CUdeviceptr va = 0;            // expandable: the range the units are mapped into
  std::size_t va_bytes = 0;
  std::vector<std::pair<CUmemGenericAllocationHandle, std::size_t>> units;
  Conn* conn = nullptr;
};

// A classic segment mapped through the driver's legacy IPC, shared by the imports of its blocks:
// the driver is asked once per segment and context, and closed with the last of them.
struct SegmentOpen {
  CUipcMemHandle handle{};
  CUcontext ctx = nullptr;
  CUdeviceptr base = 0;
  int refs = 0;
};

struct Importer {
  std::mutex mu;
  std::vector<SegmentOpen> segments;
  std::vector<Conn*> conns;
  std::map<CUdeviceptr, Import*> by_ptr;
};

std::atomic<Importer*> g_state{nullptr};
std::mutex g_state_mu;

void after_fork_child() noexcept;

Importer& state() {
  Importer* s = g_state.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  std::lock_guard<std::mutex> lock(g_state_mu);
  s = g_state.load(std::memory_order_relaxed);
  if (s == nullptr) {
    static std::once_flag fork_handler;
    std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, &after_fork_child); });
    s = new Importer;  // never destroyed: no teardown at exit
    g_state.store(s, std::memory_order_release);
  }
  return *s;
}

unsigned long long u(CUdeviceptr p) { return static_cast<unsigned long long>(p); }

// Under mu.
void drop_conn_if_idle(Importer& s, Conn* c) {
  if (c->imports > 0 || c->users > 0) return;
  ::close(c->fd);
  std::erase(s.conns, c);
  delete c;
}

// The connection to the exporter of `h` (opened if needed, its peer's identity checked), with
// one more user. Takes mu only to look up and to insert: the connect itself waits (a bounded
// time) for the peer without it.
CUresult connect_to(Importer& s, const Handle& h, Conn** out) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (Conn* c : s.conns) {
      if (c->pid == h.pid && c->nonce == h.nonce && !c->broken) {
        ++c->users;
        *out = c;
        return CUDA_SUCCESS;
      }
    }
  }
  const int fd = connect_abstract(socket_name(h.uid, h.pid, h.nonce));
  if (fd < 0) {
    const int e = errno;
    log_warn(
        "cuIpcOpenMemHandle: the process that exported this block (pid {}) cannot be reached ({}): {}; returning "
        "CUDA_ERROR_INVALID_HANDLE",
        h.pid, std::strerror(e),
        e == ETIMEDOUT ? "it accepts no connection (stopped, or too busy)"
                       : "it has exited, or runs in another network namespace");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  pid_t pid = 0;
  uid_t uid = 0;
  if (!peer_credentials(fd, &pid, &uid) || static_cast<std::uint32_t>(pid) != h.pid || uid != ::getuid()) {
    ::close(fd);
    log_warn(
        "cuIpcOpenMemHandle: the socket named by the handle is served by pid {} of uid {}; only an exporter "
        "that is pid {} and runs as this process's user (uid {}) is trusted; returning CUDA_ERROR_NOT_PERMITTED",
        static_cast<long>(pid), static_cast<long>(uid), h.pid, static_cast<long>(::getuid()));
    return CUDA_ERROR_NOT_PERMITTED;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  for (Conn* c : s.conns) {  // another thread connected meanwhile: one connection per exporter
    if (c->pid == h.pid && c->nonce == h.nonce && !c->broken) {
      ::close(fd);
      ++c->users;
      *out = c;
      return CUDA_SUCCESS;
    }
  }
  auto* c = new Conn;
  c->fd = fd;
  c->pid = h.pid;
  c->nonce = h.nonce;
  c->users = 1;
  s.conns.push_back(c);
  *out = c;
  return CUDA_SUCCESS;
}

void send_release(Conn* c, std::uint64_t id) {
  Request r;
  r.op = Op::release;
  r.id = id;
  send_message(c->fd, &r, sizeof r);  // a lost release is settled when the connection closes
}

// Unmaps what map_units mapped (any prefix of it).
void unmap_units(const RealDriver& d, Import& im, std::size_t mapped) {
  std::size_t off = 0;
  for (std::size_t i = 0; i < im.units.size(); ++i) {
    if (i < mapped) d.cuMemUnmap(im.va + off, im.units[i].second);
    d.cuMemRelease(im.units[i].first);
    off += im.units[i].second;
  }
  im.units.clear();
  if (im.va != 0) d.cuMemAddressFree(im.va, im.va_bytes);
  im.va = 0;
}

// Expandable, under the connection's io: receives the block's unit descriptors and sizes,
// each message checked (add_units). On failure every descriptor received is closed.
std::string receive_units(Conn* c, const Reply& rep, std::vector<int>* fds, std::vector<std::uint64_t>* sizes) {
  std::uint64_t total = 0;
  while (sizes->size() < rep.units) {
    UnitBatch b;
    std::vector<int> got;
    std::string why;
    if (!recv_message(c->fd, &b, sizeof b, kReplyTimeoutMs, &got))
      why = errno != 0 ? std::strerror(errno) : "no unit message in time";
    else
      why = add_units(b, got.size(), rep.units - static_cast<std::uint32_t>(sizes->size()), sizes, &total);
    if (!why.empty()) {
      for (int f : got) ::close(f);
      for (int f : *fds) ::close(f);
      fds->clear();
      return why;
    }
    fds->insert(fds->end(), got.begin(), got.end());
  }
  if (std::string why = check_inside(rep.offset, rep.size, total); !why.empty()) {
    for (int f : *fds) ::close(f);
    fds->clear();
    return why;
  }
  return {};
}

// Expandable: imports the received units and maps them. Closes every descriptor.
CUresult map_units(const RealDriver& d, const std::vector<int>& fds, const std::vector<std::uint64_t>& sizes,
                   Import& im) {
  CUresult r = !d.has_vmm() || d.cuMemImportFromShareableHandle == nullptr ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    CUmemGenericAllocationHandle h = 0;
    if (r == CUDA_SUCCESS) {
      r = d.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (r == CUDA_SUCCESS) {
        im.units.emplace_back(h, sizes[i]);
        im.va_bytes += sizes[i];
      }
    }
    ::close(fds[i]);  // the imported handle keeps the memory
  }
  CUdevice dev = 0;
  if (r == CUDA_SUCCESS) r = d.cuCtxGetDevice(&dev);
  if (r == CUDA_SUCCESS && im.units.empty()) r = CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS) r = d.cuMemAddressReserve(&im.va, im.va_bytes, 0, 0, 0);
  std::size_t mapped = 0;
  std::size_t off = 0;
  while (r == CUDA_SUCCESS && mapped < im.units.size()) {
    r = d.cuMemMap(im.va + off, im.units[mapped].second, 0, im.units[mapped].first, 0);
    if (r == CUDA_SUCCESS) off += im.units[mapped++].second;
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc a{};
    a.location = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.cuMemSetAccess(im.va, im.va_bytes, &a, 1);
  }
  if (r != CUDA_SUCCESS) unmap_units(d, im, mapped);
  return r;
}

// Under mu: the segment of a classic block, mapped in `ctx` (once per segment and context).
CUresult open_segment(const RealDriver& d, Importer& s, const CUipcMemHandle& seg, CUcontext ctx, unsigned flags,
                      CUdeviceptr* base) {
  for (SegmentOpen& o : s.segments) {
    if (o.ctx == ctx && std::memcmp(o.handle.reserved, seg.reserved, sizeof seg.reserved) == 0) {
      ++o.refs;
      *base = o.base;
      return CUDA_SUCCESS;
    }
  }
  const auto open_mem_handle = d.ipc_open_mem_handle();
  if (open_mem_handle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  SegmentOpen o;
  o.handle = seg;
  o.ctx = ctx;
  o.refs = 1;
  const CUresult r = open_mem_handle(&o.base, seg, flags);
  if (r != CUDA_SUCCESS) return r;
  *base = o.base;
  s.segments.push_back(o);
  return CUDA_SUCCESS;
}

// Under mu, with `ctx` current: one block of the segment at `base` is closed.
CUresult close_segment(const RealDriver& d, Importer& s, CUcontext ctx, CUdeviceptr base) {
  for (auto it = s.segments.begin(); it != s.segments.end(); ++it) {
    if (it->ctx != ctx || it->base != base) continue;
    if (--it->refs > 0) return CUDA_SUCCESS;
    s.segments.erase(it);
    return d.cuIpcCloseMemHandle != nullptr ? d.cuIpcCloseMemHandle(base) : CUDA_SUCCESS;
  }
  return CUDA_SUCCESS;
}

// What an exporter answered to `open`, with the units' descriptors for an expandable block.
struct Answer {
  Reply reply;
  std::vector<int> fds;
  std::vector<std::uint64_t> sizes;
  bool broken = false;  // the exchange was cut or garbled: the connection takes no more requests
};

// Asks the exporter on c for the export h names; "" when it answered properly (which may be a
// refusal), else what went wrong. The exchange holds the connection's io only (other threads keep
// importing, closing and querying meanwhile); every wait on the peer is bounded, and an exporter
// that is short of descriptors (busy) is asked again until the deadline.
std::string ask_open(Conn* c, const Handle& h, Answer* a) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyTimeoutMs);
  if (!lock_until(c->io, deadline)) return "another exchange with it did not end in time";
  Request req;
  req.op = Op::open;
  req.id = h.id;
  std::string why;
  for (;;) {
    errno = 0;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
    if (!send_message(c->fd, &req, sizeof req) ||
        !recv_message(c->fd, &a->reply, sizeof a->reply, static_cast<int>(std::max<std::int64_t>(1, left.count())))) {
      why = errno != 0 ? std::strerror(errno) : "no answer in time";
      a->broken = true;
    } else if (why = check_reply(h, a->reply); !why.empty()) {
      a->broken = true;
    } else if (a->reply.status == Status::busy && std::chrono::steady_clock::now() + kBusyRetry < deadline) {
      std::this_thread::sleep_for(kBusyRetry);
      continue;
    } else if (a->reply.status == Status::ok && a->reply.kind == Kind::expandable) {
      why = receive_units(c, a->reply, &a->fds, &a->sizes);
      a->broken = !why.empty();
    }
    break;
  }
  c->io.unlock();
  return why;
}

// The handle was made by this process, or no context is current: CUDA's own error; else
// CUDA_SUCCESS with the current context in *ctx.
CUresult importing_context(const RealDriver& d, const Handle& h, CUcontext* ctx) {
  if (h.pid == static_cast<std::uint32_t>(::getpid())) {
    log_warn(
        "cuIpcOpenMemHandle: the handle was made by this process (pid {}); CUDA opens handles only in other "
        "processes; returning CUDA_ERROR_INVALID_CONTEXT",
        h.pid);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (d.cuCtxGetCurrent(ctx) != CUDA_SUCCESS || *ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

// Under mu: this process's import of the export `h` names, in `ctx`, or nullptr.
Import* find_open(Importer& s, const Handle& h, CUcontext ctx) {
  for (auto& [p, im] : s.by_ptr)
    if (im->pid == h.pid && im->nonce == h.nonce && im->id == h.id && im->ctx == ctx) return im;
  return nullptr;
}

// Under mu: the import is opened once more (CUDA's reference count); its pointer.
CUdeviceptr open_again(Import* im) {
  ++im->refs;
  return im->ptr;
}

// Under mu: the exchange with the exporter went wrong (`why`); the open fails.
CUresult exchange_failed(Importer& s, Conn* c, const Handle& h, const std::string& why, bool broken) {
  log_warn(
      "cuIpcOpenMemHandle: the exporting process (pid {}) did not answer properly ({}); returning "
      "CUDA_ERROR_INVALID_HANDLE",
      h.pid, why);
  // A half-finished or garbled exchange leaves the connection unusable for requests; it stays
  // open while it holds earlier imports (closing it would let the exporter reuse their bytes).
  if (broken) c->broken = true;
  drop_conn_if_idle(s, c);
  return CUDA_ERROR_INVALID_HANDLE;
}

// Under mu: the exporter refused the open (`status`); the code CUDA would return.
CUresult refused(Importer& s, Conn* c, const Handle& h, Status status) {
  // Still busy at the deadline: the exporter lacks resources, the handle is fine.
  const CUresult code = status == Status::refused_uid ? CUDA_ERROR_NOT_PERMITTED
                        : status == Status::busy      ? CUDA_ERROR_OUT_OF_MEMORY
                                                      : CUDA_ERROR_INVALID_HANDLE;
  log_warn("cuIpcOpenMemHandle: export {} of pid {}: {}; returning {}", h.id, h.pid, to_string(status),
           code == CUDA_ERROR_NOT_PERMITTED   ? "CUDA_ERROR_NOT_PERMITTED"
           : code == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
                                              : "CUDA_ERROR_INVALID_HANDLE");
  drop_conn_if_idle(s, c);
  return code;
}

// Under mu: another thread opened the export meanwhile: one import, the hold this answer took
// goes back to the exporter.
CUdeviceptr join_open(Importer& s, Conn* c, const Handle& h, const Answer& a, Import* im) {
  for (int f : a.fds) ::close(f);
  send_release(c, h.id);
  const CUdeviceptr ptr = open_again(im);
  drop_conn_if_idle(s, c);
  return ptr;
}

// Under mu, classic: the block's segment mapped in `ctx`; the block must lie inside what the
// driver mapped for it (*why says what is wrong when it does not).
CUresult map_classic(const RealDriver& d, Importer& s, const Reply& rep, CUcontext ctx, unsigned flags, Import& im,
                     std::string* why) {
  CUresult r = open_segment(d, s, rep.segment, ctx, flags, &im.segment_base);
  CUdeviceptr seg = 0;
  std::size_t seg_bytes = 0;
  if (r == CUDA_SUCCESS &&
      (d.cuMemGetAddressRange_v2 == nullptr ||
       d.cuMemGetAddressRange_v2(&seg, &seg_bytes, im.segment_base) != CUDA_SUCCESS || seg != im.segment_base)) {
    *why = "the driver does not say how large the segment is";
  } else if (r == CUDA_SUCCESS) {
    *why = check_inside(rep.offset, rep.size, seg_bytes);
  }
  if (r == CUDA_SUCCESS && !why->empty()) {
    close_segment(d, s, ctx, im.segment_base);
    r = CUDA_ERROR_INVALID_HANDLE;
  }
  im.ptr = im.segment_base + rep.offset;
  return r;
}

// Under mu: the block the exporter described mapped into this process, by its kind.
CUresult map_block(const RealDriver& d, Importer& s, const Answer& a, CUcontext ctx, unsigned flags, Import& im,
                   std::string* why) {
  if (a.reply.kind == Kind::classic) return map_classic(d, s, a.reply, ctx, flags, im, why);
  const CUresult r = map_units(d, a.fds, a.sizes, im);
  im.ptr = im.va + a.reply.offset;
  return r;
}

// Under mu: a new import of what the exporter on `c` answered, mapped and recorded (the
// connection stays open for it); on failure the exporter's hold goes back.
CUresult add_import(const RealDriver& d, Importer& s, Conn* c, const Handle& h, const Answer& a, CUcontext ctx,
                    unsigned flags, CUdeviceptr* out) {
  auto* im = new Import;
  im->pid = h.pid;
  im->nonce = h.nonce;
  im->id = h.id;
  im->ctx = ctx;
  im->size = a.reply.size;
  im->kind = a.reply.kind;
  im->conn = c;
  std::string why;
  const CUresult r = map_block(d, s, a, ctx, flags, *im, &why);
  if (r != CUDA_SUCCESS) {
    log_warn("cuIpcOpenMemHandle: mapping export {} of pid {} failed: {}", h.id, h.pid,
             why.empty() ? "CUDA error " + std::to_string(r) : why);
    send_release(c, h.id);
    delete im;
    drop_conn_if_idle(s, c);
    return r;
  }
  im->refs = 1;
  ++c->imports;
  s.by_ptr[im->ptr] = im;
  g_imports.fetch_add(1, std::memory_order_relaxed);
  *out = im->ptr;
  log_debug("cuIpcOpenMemHandle: export {} of pid {} ({} bytes) at {:#x}", h.id, h.pid, im->size, u(im->ptr));
  return CUDA_SUCCESS;
}

}  // namespace

CUresult open(const RealDriver& d, CUdeviceptr* out, const CUipcMemHandle& raw, unsigned flags) noexcept {
  Handle h;
  if (!decode(raw, &h)) return kPassThrough;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx = nullptr;
  if (const CUresult r = importing_context(d, h, &ctx); r != CUDA_SUCCESS) return r;
  Importer& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (Import* im = find_open(s, h, ctx)) {
      *out = open_again(im);
      return CUDA_SUCCESS;
    }
  }
  Conn* c = nullptr;
  if (const CUresult r = connect_to(s, h, &c); r != CUDA_SUCCESS) return r;
  Answer a;
  const std::string why = ask_open(c, h, &a);
  std::lock_guard<std::mutex> lock(s.mu);
  --c->users;
  if (!why.empty()) return exchange_failed(s, c, h, why, a.broken);
  if (a.reply.status != Status::ok) return refused(s, c, h, a.reply.status);
  if (Import* im = find_open(s, h, ctx)) {
    *out = join_open(s, c, h, a, im);
    return CUDA_SUCCESS;
  }
  return add_import(d, s, c, h, a, ctx, flags, out);
}

CUresult close(const RealDriver& d, CUdeviceptr dptr) noexcept {
  if (g_imports.load(std::memory_order_relaxed) == 0) return kPassThrough;
  Importer& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.by_ptr.find(dptr);
  if (it == s.by_ptr.end()) return kPassThrough;
  Import* im = it->second;
  if (--im->refs > 0) return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  {
    ScopedContext scope(d, im->ctx);
    // The exporter may hand these bytes to its next allocation as soon as it hears of the close:
    // this process's work on them must be over first.
    if (d.cuCtxSynchronize != nullptr) r = d.cuCtxSynchronize();
    if (im->kind == Kind::classic) {
      const CUresult c = close_segment(d, s, im->ctx, im->segment_base);
      if (r == CUDA_SUCCESS) r = c;
    } else {
      unmap_units(d, *im, im->units.size());
    }
  }
  send_release(im->conn, im->id);
  --im->conn->imports;
  drop_conn_if_idle(s, im->conn);
  s.by_ptr.erase(it);
  g_imports.fetch_sub(1, std::memory_order_relaxed);
  delete im;
  return r;
}

bool imported_block_slow(CUdeviceptr dptr, CUdeviceptr* base, std::size_t* size) noexcept {
  Importer& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.by_ptr.upper_bound(dptr);
  if (it == s.by_ptr.begin()) return false;
  --it;
  const Import* im = it->second;
  if (dptr >= im->ptr + std::max<std::size_t>(im->size, 1)) return false;
  *base = im->ptr;
  *size = im->size;
  return true;
}

namespace {

// The parent's connections are shared with it: the child must not speak on them (nor close
// them, which would not end the parent's holds anyway). Forget them.
void after_fork_child() noexcept {
  new (&g_state_mu) std::mutex;
  g_state.store(nullptr, std::memory_order_relaxed);
  g_imports.store(0, std::memory_order_relaxed);
}

}  // namespace

}  // namespace cudapool::shim::ipc
