// The CUDA IPC exporter's server loop (shim/ipc/ipc_server.h).
#include "shim/ipc/ipc_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "shim/log.h"

namespace cudapool::shim::ipc {

namespace {

constexpr std::int64_t kLogEveryNs = 10'000'000'000;

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double seconds(std::int64_t ns) { return static_cast<double>(ns) / 1e9; }

// A refusal sent unasked right after the accept, then the connection is closed.
void refuse_with(int c, Status status) {
  Reply r;
  r.status = status;
  send_message(c, &r, sizeof r);
  ::close(c);
}

}  // namespace

bool Server::Throttle::tick(std::int64_t now, std::uint64_t* since) {
  ++total;
  ++unlogged;
  if (logged_before && now - last_ns < kLogEveryNs) return false;
  logged_before = true;
  last_ns = now;
  *since = unlogged;
  unlogged = 0;
  return true;
}

Server::Server(int listen_fd, ServerOps& ops, ServerSettings settings)
    : ops_(ops), settings_(settings), fds_{{listen_fd, POLLIN, 0}} {
  if (settings_.max_connections == 0) settings_.max_connections = 1;
}

std::int64_t Server::now() const { return settings_.now_ns != nullptr ? settings_.now_ns() : monotonic_ns(); }

void Server::run() {
  for (;;) {
    const std::int64_t before = now();
    if (paused_until_ != 0 && before >= paused_until_) {
      paused_until_ = 0;
      fds_[0].events = POLLIN;
    }
    const int n = ::poll(fds_.data(), fds_.size(), poll_timeout(before));
    if (n < 0) {
      if (errno == EINTR) continue;
      log_warn("CUDA IPC: the server stopped: poll failed: {}", std::strerror(errno));
      return;
    }
    const std::int64_t t = now();
    const short listening = fds_[0].revents;
    fds_[0].revents = 0;
    if ((listening & (POLLERR | POLLNVAL | POLLHUP)) != 0) {
      stop();  // the socket was shut down
      return;
    }
    if ((listening & POLLIN) != 0) accept_one(t);
    for (std::size_t i = 1; i < fds_.size();) {
      const short ev = fds_[i].revents;
      fds_[i].revents = 0;
      bool keep = true;
      if ((ev & POLLIN) != 0) {
        Request req;
        // Nothing (the peer closed it) or a message that is not one whole request: dropped.
        if (!recv_message(fds_[i].fd, &req, sizeof req, 0)) {
          keep = false;
        } else if (const std::string why = check_request(req); !why.empty()) {
          keep = false;
          std::uint64_t since = 0;
          if (bad_request_.tick(t, &since))
            log_warn(
                "CUDA IPC: dropped the connection of pid {}: it sent no request of this protocol ({}; {} such "
                "connections dropped since the last such line)",
                static_cast<long>(peers_[i - 1].pid), why, since);
        } else {
          keep = ops_.serve(fds_[i].fd, req);
          peers_[i - 1].last_ns = t;
        }
      } else if ((ev & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
        keep = false;
      }
      if (keep)
        ++i;
      else
        drop(i);
    }
    drop_idle(t);
  }
}

void Server::accept_one(std::int64_t t) {
  const int c = ::accept4(fds_[0].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) {
    on_accept_error(t, errno);
    return;
  }
  pid_t pid = 0;
  if (!trusted(c, t, &pid) || !make_room(c, t, pid)) return;
  fds_.push_back({c, POLLIN, 0});
  peers_.push_back({pid, t});
  connections_.store(peers_.size(), std::memory_order_release);
}

void Server::on_accept_error(std::int64_t t, int err) {
  if (err == EAGAIN || err == EINTR || err == ECONNABORTED) return;
  std::uint64_t since = 0;
  if (err == EMFILE || err == ENFILE) {
    // An idle connection's descriptor serves the newcomer better; the pending connection is
    // accepted on the next round (poll reports it again).
    if (const std::size_t i = longest_idle_free(); i != 0) {
      if (for_room_.tick(t, &since))
        log_warn(
            "CUDA IPC: out of file descriptors with an importer waiting: dropped the connection of pid {}, idle "
            "{:.1f} s and holding nothing, to accept it ({} dropped so since the last such line)",
            static_cast<long>(peers_[i - 1].pid), seconds(t - peers_[i - 1].last_ns), since);
      drop(i);
      dropped_for_room_.fetch_add(1, std::memory_order_release);
      return;
    }
  }
  // Out of descriptors or memory: the pending connection stays pending and poll would report
  // it again at once. Stop listening for a while (connections keep being served).
  if (accept_failed_.tick(t, &since))
    log_warn("CUDA IPC: cannot accept an importer's connection: {}; pausing for 100 ms ({} failed accepts)",
             std::strerror(err), since);
  fds_[0].events = 0;
  paused_until_ = t + kAcceptPauseNs;
}

bool Server::trusted(int c, std::int64_t t, pid_t* pid) {
  uid_t uid = 0;
  std::uint64_t since = 0;
  if (peer_credentials(c, pid, &uid) && uid == ::getuid()) return true;
  if (refused_.tick(t, &since))
    log_warn(
        "CUDA IPC: refused a connection from pid {} (uid {}): only processes of uid {} may open this process's "
        "memory ({} refused since the last such line, {} in all; logged at most every 10 s)",
        static_cast<long>(*pid), static_cast<long>(uid), static_cast<long>(::getuid()), since, refused_.total);
  refuse_with(c, Status::refused_uid);
  return false;
}

bool Server::make_room(int c, std::int64_t t, pid_t pid) {
  if (peers_.size() < settings_.max_connections) return true;
  std::uint64_t since = 0;
  const std::size_t i = longest_idle_free();
  if (i == 0) {
    if (too_many_.tick(t, &since))
      log_warn(
          "CUDA IPC: refused a connection from pid {}: {} importers are connected already, each holding memory "
          "of this process open ({} refused since the last such line)",
          static_cast<long>(pid), peers_.size(), since);
    refuse_with(c, Status::error);
    return false;
  }
  if (for_room_.tick(t, &since))
    log_warn(
        "CUDA IPC: {} importers are connected already: dropped the connection of pid {}, idle {:.1f} s and "
        "holding nothing, for one from pid {} ({} dropped so since the last such line)",
        peers_.size(), static_cast<long>(peers_[i - 1].pid), seconds(t - peers_[i - 1].last_ns), static_cast<long>(pid),
        since);
  drop(i);
  dropped_for_room_.fetch_add(1, std::memory_order_release);
  return true;
}

std::size_t Server::longest_idle_free() {
  std::size_t best = 0;
  for (std::size_t i = 1; i < fds_.size(); ++i) {
    if (best != 0 && peers_[i - 1].last_ns >= peers_[best - 1].last_ns) continue;
    if (!ops_.holds(fds_[i].fd)) best = i;
  }
  return best;
}

void Server::drop(std::size_t i) {
  const int fd = fds_[i].fd;
  ops_.closing(fd);
  ::close(fd);
  fds_[i] = fds_.back();
  fds_.pop_back();
  peers_[i - 1] = peers_.back();
  peers_.pop_back();
  connections_.store(peers_.size(), std::memory_order_release);
}

void Server::drop_idle(std::int64_t t) {
  for (std::size_t i = 1; i < fds_.size();) {
    Peer& p = peers_[i - 1];
    if (t - p.last_ns < settings_.idle_ns) {
      ++i;
    } else if (ops_.holds(fds_[i].fd)) {
      p.last_ns = t;  // holding an import, it may stay silent: looked at again after another idle_ns
      ++i;
    } else {
      std::uint64_t since = 0;
      if (idle_.tick(t, &since))
        log_info(
            "CUDA IPC: dropped the connection of pid {}: it held nothing and sent no request for {:.1f} s ({} "
            "dropped so since the last such line)",
            static_cast<long>(p.pid), seconds(t - p.last_ns), since);
      drop(i);
      dropped_idle_.fetch_add(1, std::memory_order_release);
    }
  }
}

int Server::poll_timeout(std::int64_t t) const {
  std::int64_t wait = -1;
  if (paused_until_ != 0) wait = paused_until_ > t ? paused_until_ - t : 0;
  if (!peers_.empty()) {
    std::int64_t oldest = peers_[0].last_ns;
    for (const Peer& p : peers_) oldest = p.last_ns < oldest ? p.last_ns : oldest;
    const std::int64_t idle = t - oldest;
    const std::int64_t left = idle >= settings_.idle_ns ? 0 : settings_.idle_ns - idle;
    wait = wait < 0 || left < wait ? left : wait;
  }
  if (wait < 0) return -1;
  const std::int64_t ms = wait / 1'000'000 + (wait % 1'000'000 != 0 ? 1 : 0);
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

void Server::stop() {
  for (std::size_t i = 1; i < fds_.size(); ++i) {
    ops_.closing(fds_[i].fd);
    ::close(fds_[i].fd);
  }
  fds_.resize(1);
  peers_.clear();
  connections_.store(0, std::memory_order_release);
}

}  // namespace cudapool::shim::ipc
