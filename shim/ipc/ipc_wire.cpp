// Handle encoding and the Unix-socket plumbing of CUDA IPC (shim/ipc/ipc_wire.h).
#include "shim/ipc/ipc_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace cudapool::shim::ipc {

void encode(const Handle& h, CUipcMemHandle* out) noexcept {
  static_assert(sizeof h == sizeof out->reserved);
  std::memcpy(out->reserved, &h, sizeof h);
}

bool decode(const CUipcMemHandle& in, Handle* out) noexcept {
  std::memcpy(out, in.reserved, sizeof *out);
  return std::memcmp(out->marker, kMarker, sizeof kMarker) == 0 && out->version == kVersion;
}

std::string socket_name(std::uint32_t uid, std::uint32_t pid, std::uint64_t nonce) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "cudapool-ipc.%u.%u.%016llx", uid, pid, static_cast<unsigned long long>(nonce));
  return std::string(1, '\0') + buf;
}

const char* to_string(Status s) noexcept {
  switch (s) {
    case Status::ok: return "ok";
    case Status::unknown: return "no such block (freed, or never exported by that process)";
    case Status::refused_uid: return "refused: the importing process runs as another user";
    case Status::error: return "the exporting process could not serve it (see its log)";
    case Status::busy: return "the exporting process stayed out of file descriptors or memory";
  }
  return "?";
}

std::string check_reply(const Handle& h, const Reply& rep) {
  if (rep.magic != kWireMagic) return "not a reply of this protocol (bad magic)";
  switch (rep.status) {
    case Status::ok: break;
    case Status::unknown:
    case Status::refused_uid:
    case Status::error:
    case Status::busy: return {};  // a refusal: nothing in it is used but the status
    default: return "unknown status " + std::to_string(static_cast<std::int32_t>(rep.status));
  }
  if (rep.kind != Kind::classic && rep.kind != Kind::expandable)
    return "unknown kind " + std::to_string(static_cast<unsigned>(rep.kind));
  if (rep.kind != h.kind) return "a block of another kind than the handle names";
  if (rep.size != h.size)
    return "a block of " + std::to_string(rep.size) + " bytes where the handle names " + std::to_string(h.size);
  if (rep.size == 0) return "an empty block";
  if (rep.kind == Kind::classic && rep.units != 0) return "units with a classic block";
  if (rep.kind == Kind::expandable && (rep.units == 0 || rep.units > kMaxUnits))
    return std::to_string(rep.units) + " units (1 to " + std::to_string(kMaxUnits) + " expected)";
  if (rep.kind == Kind::expandable && rep.offset >= kMaxMappedBytes) return "an offset past any unit";
  return {};
}

std::string add_units(const UnitBatch& b, std::size_t nfds, std::uint32_t left, std::vector<std::uint64_t>* sizes,
                      std::uint64_t* total) {
  if (b.magic != kWireMagic) return "not a unit message of this protocol (bad magic)";
  if (b.count == 0 || b.count > kUnitsPerMessage || b.count > left)
    return "a batch of " + std::to_string(b.count) + " units where " + std::to_string(left) + " were due";
  if (nfds != b.count)
    return std::to_string(nfds) + " descriptors with a batch of " + std::to_string(b.count) + " units";
  for (std::uint32_t i = 0; i < b.count; ++i) {
    const std::uint64_t n = b.bytes[i];
    if (n == 0) return "a unit of 0 bytes";
    if (n > kMaxMappedBytes - *total) return "units larger than any device together";
    *total += n;
    sizes->push_back(n);
  }
  return {};
}

std::string check_inside(std::uint64_t offset, std::uint64_t size, std::uint64_t range) {
  if (offset > range || size > range - offset)
    return "the block (offset " + std::to_string(offset) + ", " + std::to_string(size) +
           " bytes) does not lie inside the " + std::to_string(range) + " bytes mapped for it";
  return {};
}

std::string check_request(const Request& r) {
  if (r.magic != kWireMagic) return "bad magic";
  if (r.op != Op::open && r.op != Op::release) return "unknown op " + std::to_string(static_cast<std::uint32_t>(r.op));
  return {};
}

namespace {

socklen_t fill_address(const std::string& name, sockaddr_un* a) noexcept {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const std::size_t n = name.size() < sizeof a->sun_path ? name.size() : sizeof a->sun_path;
  std::memcpy(a->sun_path, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
}

}  // namespace

int listen_abstract(const std::string& name) noexcept {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  const socklen_t len = fill_address(name, &a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 64) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int connect_abstract(const std::string& name, int timeout_ms) noexcept {
  // Non-blocking: a Unix socket whose queue of pending connections is full makes a blocking
  // connect wait for as long as the listener does not accept (forever, for a stopped or hostile
  // one); here it is retried until the deadline.
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  const socklen_t len = fill_address(name, &a);
  timespec t0{};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const auto elapsed_ms = [&t0] {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
  };
  int r;
  for (;;) {
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&a), len);
    if (r == 0 || errno == EISCONN) {
      r = 0;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EINPROGRESS) {  // not what Unix sockets do today; handled all the same
      const long left = timeout_ms - elapsed_ms();
      pollfd p{fd, POLLOUT, 0};
      int soerr = 0;
      socklen_t sl = sizeof soerr;
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) {
        errno = ETIMEDOUT;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) {
        r = 0;
      } else {
        errno = soerr != 0 ? soerr : errno;
      }
      break;
    }
    if (errno != EAGAIN) break;
    const long left = timeout_ms - elapsed_ms();
    if (left <= 0) {
      errno = ETIMEDOUT;
      break;
    }
    timespec nap{0, static_cast<long>(std::min<long>(left, 10)) * 1000000L};
    ::nanosleep(&nap, nullptr);
  }
  if (r != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

bool send_message(int fd, const void* data, std::size_t bytes, const int* fds, int nfds) noexcept {
  iovec iov{const_cast<void*>(data), bytes};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kUnitsPerMessage)];
  if (nfds > 0) {
    if (nfds > static_cast<int>(kUnitsPerMessage)) return false;
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<std::size_t>(nfds));
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<std::size_t>(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<std::size_t>(nfds));
  }
  ssize_t n;
  do {
    n = ::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(bytes);
}

bool recv_message(int fd, void* data, std::size_t bytes, int timeout_ms, std::vector<int>* fds) noexcept {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  iovec iov{data, bytes};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kUnitsPerMessage)];
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  // Descriptors that came along are ours to close, whatever else is wrong with the message.
  std::vector<int> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      got.push_back(f);
    }
  }
  const bool ok = n == static_cast<ssize_t>(bytes) && (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
  if (!ok || fds == nullptr) {
    for (int f : got) ::close(f);
    if (fds != nullptr) fds->clear();
    return ok && got.empty();
  }
  *fds = std::move(got);
  return true;
}

bool peer_credentials(int fd, pid_t* pid, uid_t* uid) noexcept {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0 || len != sizeof c) return false;
  *pid = c.pid;
  *uid = c.uid;
  return true;
}

}  // namespace cudapool::shim::ipc
