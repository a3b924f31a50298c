// Handle encoding and the Unix-socket plumbing of CUDA IPC (shim/ipc_wire.h).
#include "shim/ipc_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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
  }
  return "?";
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

int connect_abstract(const std::string& name) noexcept {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  const socklen_t len = fill_address(name, &a);
  int r;
  do {
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&a), len);
  } while (r != 0 && errno == EINTR);
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
