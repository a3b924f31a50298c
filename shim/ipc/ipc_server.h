// CUDA IPC, the exporter's server loop: accepts importers on the process's socket, checks who
// they are, reads and checks their requests, bounds how many are served at once and how long one
// may stay idle, and hands each request to the exporter (shim/ipc/ipc_export.cpp runs it on a thread
// of its own). No CUDA and no exporter state here: what a request does, and which connections
// hold an import open, the exporter says through ServerOps. The time comes from the clock in
// ServerSettings, so that tests drive it.
//
// Rules (docs/shim.md, "CUDA IPC of pooled memory"):
// - Only processes of this process's uid are served (SO_PEERCRED); others get `refused_uid` and
//   a log line at most every 10 s.
// - A connection that holds no import open and has sent no complete request for idle_ns is
//   dropped. Requests are whole messages (SOCK_SEQPACKET): a message of any other size, or one
//   that fails check_request, drops its connection at once, so no connection waits half-read.
// - At most max_connections are served. A newcomer past the cap (or an accept that fails for
//   lack of descriptors) first drops the connection idle longest among those that hold no
//   import; only when every connection holds one is the newcomer refused (`error`), or, for a
//   failed accept, accepting paused for 100 ms.
// - A connection that holds an import is never dropped by the server: the exporter keeps the
//   block allocated for as long, and its peer may stay silent for hours. It ends when the peer
//   closes it (its last close, or its exit), which releases what it held.
#pragma once
#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shim/ipc/ipc_wire.h"

namespace cudapool::shim::ipc {

inline constexpr std::size_t kMaxConnections = 1024;
inline constexpr std::int64_t kIdleTimeoutNs = 30'000'000'000;  // 30 s
inline constexpr std::int64_t kAcceptPauseNs = 100'000'000;     // after a failed accept

// What the exporter does for its server. Called on the server thread only.
class ServerOps {
 public:
  // One checked request from `conn`; false: drop the connection (a reply could not be sent).
  virtual bool serve(int conn, const Request& req) = 0;
  // `conn` is about to be closed: what it holds is released.
  virtual void closing(int conn) = 0;
  // Whether `conn` holds an import open now.
  virtual bool holds(int conn) = 0;

 protected:
  ~ServerOps() = default;
};

struct ServerSettings {
  std::size_t max_connections = kMaxConnections;
  std::int64_t idle_ns = kIdleTimeoutNs;
  std::int64_t (*now_ns)() = nullptr;  // null: CLOCK_MONOTONIC
};

class Server {
 public:
  Server(int listen_fd, ServerOps& ops, ServerSettings settings = {});
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until the listening socket is shut down (then every connection is closed, its holds
  // released) or poll fails (then connections stay open, their holds kept: nothing is released
  // that an importer may still use).
  void run();

  // For tests and logs: connections served now, and those dropped for idling or for a newcomer.
  std::size_t connections() const noexcept { return connections_.load(std::memory_order_acquire); }
  std::uint64_t dropped_idle() const noexcept { return dropped_idle_.load(std::memory_order_acquire); }
  std::uint64_t dropped_for_room() const noexcept { return dropped_for_room_.load(std::memory_order_acquire); }

 private:
  struct Peer {
    pid_t pid = 0;
    std::int64_t last_ns = 0;  // accepted, or its last complete request
  };
  // A kind of event logged at most every 10 s, each line with the count since the last.
  struct Throttle {
    std::uint64_t total = 0, unlogged = 0;
    std::int64_t last_ns = 0;
    bool logged_before = false;
    bool tick(std::int64_t now, std::uint64_t* since);
  };

  std::int64_t now() const;
  void accept_one(std::int64_t t);
  // accept4 failed with `err`: a connection that holds nothing makes room, or accepting pauses.
  void on_accept_error(std::int64_t t, int err);
  // Whether connection `c` comes from a process of this user (its pid in *pid); else refused.
  bool trusted(int c, std::int64_t t, pid_t* pid);
  // Room for connection `c` from `pid`: at the limit, the connection idle longest that holds
  // nothing is dropped for it; false (refused) when every connection holds an import.
  bool make_room(int c, std::int64_t t, pid_t pid);
  // The connection idle longest among those that hold no import: its index in fds_, or 0.
  std::size_t longest_idle_free();
  void drop(std::size_t i);  // closes fds_[i] after ops_.closing; moves the last one into its place
  void drop_idle(std::int64_t t);
  // Milliseconds poll may wait: until the next connection could pass idle_ns or accepting
  // resumes (-1: nothing to wait for).
  int poll_timeout(std::int64_t t) const;
  void stop();

  ServerOps& ops_;
  ServerSettings settings_;
  std::vector<pollfd> fds_;        // [0]: the listening socket; then one per connection
  std::vector<Peer> peers_;        // peers_[i] is the connection fds_[i + 1]
  std::int64_t paused_until_ = 0;  // accepting resumes then (after a failed accept)
  Throttle refused_, accept_failed_, too_many_, idle_, for_room_, bad_request_;
  std::atomic<std::size_t> connections_{0};
  std::atomic<std::uint64_t> dropped_idle_{0}, dropped_for_room_{0};
};

}  // namespace cudapool::shim::ipc
