// The CUDA IPC exporter's server loop (shim/ipc/ipc_server.h), run in this process on a clock only the
// test moves: a connection that holds nothing is dropped once it has sent no request for the idle
// timeout, one that holds an import open never is; past the cap (or out of descriptors) a
// newcomer takes the place of the connection idle longest that holds nothing, and is refused only
// when every connection holds an import; a message that is not one whole request drops its
// connection at once.
//
// No test waits for time to pass. Each waits, bounded, for the state it asserts: a connection
// counted, a reply, the server's close. `settle` makes sure the server finished a whole round of
// its loop at the current test time (the idle check runs at the end of every round).
#include "shim/ipc/ipc_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace ipc = cudapool::shim::ipc;

std::atomic<std::int64_t> g_now{1'000'000'000};
std::int64_t test_now() { return g_now.load(); }

// The exporter, as the server sees it: an `open` of export 1 is answered ok and held until a
// `release` of it (or the connection's end); any other export is unknown.
class Ops final : public ipc::ServerOps {
 public:
  bool serve(int conn, const ipc::Request& req) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (req.op == ipc::Op::release) {
      if (req.id == 1 && held_.count(conn) != 0 && --held_[conn] == 0) held_.erase(conn);
      return true;
    }
    ipc::Reply rep;
    rep.status = req.id == 1 ? ipc::Status::ok : ipc::Status::unknown;
    if (req.id == 1) ++held_[conn];
    return ipc::send_message(conn, &rep, sizeof rep);
  }
  void closing(int conn) override {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(conn);
  }
  bool holds(int conn) override {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.count(conn) != 0;
  }

 private:
  std::mutex mu_;
  std::map<int, int> held_;
};

// A server on a socket of its own, on its own thread; shut down (every connection closed) at the end.
class Running {
 public:
  explicit Running(ipc::ServerSettings s) {
    static std::atomic<std::uint64_t> serial{0};
    name_ = ipc::socket_name(static_cast<std::uint32_t>(::getuid()), static_cast<std::uint32_t>(::getpid()),
                             0x7e57000000000000ull + serial.fetch_add(1));
    lfd_ = ipc::listen_abstract(name_);
    s.now_ns = &test_now;
    server_ = std::make_unique<ipc::Server>(lfd_, ops_, s);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~Running() {
    ::shutdown(lfd_, SHUT_RDWR);
    thread_.join();
    ::close(lfd_);
    for (int fd : clients_) ::close(fd);
  }
  bool listening() const { return lfd_ >= 0; }
  // Connects the socket `fd` (made by the caller) without waiting for the server to accept it.
  bool connect_raw(int fd) const {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, name_.data(), name_.size());
    return ::connect(fd, reinterpret_cast<const sockaddr*>(&a),
                     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size())) == 0;
  }
  const ipc::Server& server() const { return *server_; }

  // A connection, once the server serves it (bounded).
  int connect(std::size_t expect_connections) {
    const int fd = ipc::connect_abstract(name_, 10000);
    if (fd >= 0) clients_.push_back(fd);
    EXPECT_TRUE(wait_connections(expect_connections)) << server_->connections();
    return fd;
  }
  bool wait_connections(std::size_t n) const {
    for (int i = 0; i < 10000; ++i) {  // 10 s at most
      if (server_->connections() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

 private:
  std::string name_;
  int lfd_ = -1;
  Ops ops_;
  std::unique_ptr<ipc::Server> server_;
  std::thread thread_;
  std::vector<int> clients_;
};

// Sends `open` of export `id` and waits (bounded) for the reply's status.
bool ask(int fd, std::uint64_t id, ipc::Status* status) {
  ipc::Request req;
  req.op = ipc::Op::open;
  req.id = id;
  ipc::Reply rep;
  if (!ipc::send_message(fd, &req, sizeof req) || !ipc::recv_message(fd, &rep, sizeof rep, 10000)) return false;
  *status = rep.status;
  return true;
}
bool alive(int fd) {  // answers a request
  ipc::Status st{};
  return ask(fd, 2, &st) && st == ipc::Status::unknown;
}
void release(int fd) {
  ipc::Request req;
  req.op = ipc::Op::release;
  req.id = 1;
  ASSERT_TRUE(ipc::send_message(fd, &req, sizeof req));
}
// Two exchanges on `fd`: the second request is read in a later round than the first reply was
// sent in, so the round that sent it, idle check included, ran at the current test time.
void settle(int fd) {
  ASSERT_TRUE(alive(fd));
  ASSERT_TRUE(alive(fd));
}
// The server closed `fd` (bounded: a connection still open fails after 10 s).
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return false;
  char b[256];
  return ::recv(fd, b, sizeof b, MSG_DONTWAIT) == 0;
}
// Nothing from the server on `fd`, not even its close, at this moment.
bool untouched(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

TEST(ShimIpcServer, IdleConnectionsThatHoldNothingAreDroppedAfterTheTimeout) {
  Running r({});
  ASSERT_TRUE(r.listening());
  const std::int64_t idle = ipc::kIdleTimeoutNs;
  const int quiet = r.connect(1);  // never says anything
  const int holder = r.connect(2);
  ipc::Status st{};
  ASSERT_TRUE(ask(holder, 1, &st));
  ASSERT_EQ(st, ipc::Status::ok);  // holds export 1 open from now on
  const int asked = r.connect(3);
  ASSERT_TRUE(alive(asked));  // one complete request, then silence
  const int probe = r.connect(4);

  // Just short of the timeout: nobody is dropped.
  g_now += idle - 1;
  settle(probe);
  EXPECT_EQ(r.server().dropped_idle(), 0u);
  EXPECT_TRUE(untouched(quiet));
  EXPECT_TRUE(untouched(asked));

  // At the timeout the two that hold nothing go; the holder stays, however long it is silent.
  g_now += 1;
  settle(probe);
  EXPECT_TRUE(closed_by_server(quiet));
  EXPECT_TRUE(closed_by_server(asked));
  EXPECT_EQ(r.server().dropped_idle(), 2u);
  for (int i = 0; i < 5; ++i) {
    g_now += 10 * idle;
    settle(probe);
  }
  EXPECT_TRUE(untouched(holder));
  EXPECT_TRUE(alive(holder));
  EXPECT_EQ(r.server().connections(), 2u);

  // Once it lets go of its import, its silence counts again.
  release(holder);
  settle(probe);
  g_now += idle;
  settle(probe);
  EXPECT_TRUE(closed_by_server(holder));
  EXPECT_EQ(r.server().dropped_idle(), 3u);
  EXPECT_EQ(r.server().connections(), 1u);
}

TEST(ShimIpcServer, PastTheCapTheConnectionIdleLongestThatHoldsNothingMakesRoom) {
  ipc::ServerSettings s;
  s.max_connections = 4;
  Running r(s);
  ASSERT_TRUE(r.listening());
  ipc::Status st{};
  ++g_now;
  const int holder = r.connect(1);  // idle longest of all, but it holds an import
  ASSERT_TRUE(ask(holder, 1, &st) && st == ipc::Status::ok);
  ++g_now;
  const int first = r.connect(2);
  ++g_now;
  const int second = r.connect(3);
  ++g_now;
  ASSERT_TRUE(alive(second));  // heard from after `third` was accepted: `third` is idle longer now
  const int third = r.connect(4);
  ++g_now;
  ASSERT_TRUE(alive(second));

  ++g_now;
  const int a = r.connect(4);
  EXPECT_TRUE(closed_by_server(first));
  EXPECT_TRUE(alive(a));
  ++g_now;
  const int b = r.connect(4);
  EXPECT_TRUE(closed_by_server(third));
  EXPECT_TRUE(alive(b));
  EXPECT_EQ(r.server().dropped_for_room(), 2u);
  EXPECT_TRUE(untouched(holder));
  EXPECT_TRUE(untouched(second));

  // Every connection holds an import: the newcomer is refused, nobody is dropped.
  for (int fd : {second, a, b}) ASSERT_TRUE(ask(fd, 1, &st) && st == ipc::Status::ok);
  ++g_now;
  const int refused = r.connect(4);
  ipc::Reply rep;
  ASSERT_TRUE(ipc::recv_message(refused, &rep, sizeof rep, 10000));
  EXPECT_EQ(rep.status, ipc::Status::error);
  EXPECT_TRUE(closed_by_server(refused));
  for (int fd : {holder, second, a, b}) EXPECT_TRUE(alive(fd));
  EXPECT_EQ(r.server().dropped_for_room(), 2u);
  EXPECT_EQ(r.server().dropped_idle(), 0u);
}

TEST(ShimIpcServer, AMessageThatIsNotOneWholeRequestDropsItsConnection) {
  Running r({});
  ASSERT_TRUE(r.listening());
  const int probe = r.connect(1);
  const int shorter = r.connect(2);
  const char four[4] = {'C', 'P', 'I', 'P'};
  ASSERT_TRUE(ipc::send_message(shorter, four, sizeof four));
  EXPECT_TRUE(closed_by_server(shorter));
  const int longer = r.connect(2);
  char more[sizeof(ipc::Request) + 1] = {};
  ipc::Request req;
  std::memcpy(more, &req, sizeof req);
  ASSERT_TRUE(ipc::send_message(longer, more, sizeof more));
  EXPECT_TRUE(closed_by_server(longer));
  const int empty = r.connect(2);
  ASSERT_EQ(::send(empty, "", 0, MSG_NOSIGNAL), 0);
  EXPECT_TRUE(closed_by_server(empty));
  const int garbled = r.connect(2);
  req.magic = 0x12345678;
  ASSERT_TRUE(ipc::send_message(garbled, &req, sizeof req));
  EXPECT_TRUE(closed_by_server(garbled));
  EXPECT_TRUE(alive(probe));
  EXPECT_EQ(r.server().connections(), 1u);
}

// Out of descriptors with a connection pending: the connection idle longest that holds nothing
// gives its descriptor to the newcomer, instead of the server pausing while idle peers keep theirs.
TEST(ShimIpcServer, OutOfDescriptorsAnIdleConnectionMakesRoom) {
  if (!std::string(CUDAPOOL_SAN_PRELOAD).empty()) GTEST_SKIP() << "descriptor exhaustion: release builds only";
  Running r({});
  ASSERT_TRUE(r.listening());
  const int idle = r.connect(1);
  const int holder = r.connect(2);
  ipc::Status st{};
  ASSERT_TRUE(ask(holder, 1, &st) && st == ipc::Status::ok);
  // The newcomer's socket exists before the descriptors run out; its connect needs none.
  const int late = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(late, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  for (int f; (f = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(f);
  const int filled_errno = errno;
  const bool connected = r.connect_raw(late);
  bool served = false, idle_closed = false;
  if (connected) {
    served = alive(late);  // accepted with the descriptor the idle connection gave up
    idle_closed = closed_by_server(idle);
  }
  for (int f : filler) ::close(f);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(filled_errno, EMFILE);
  EXPECT_TRUE(connected);
  EXPECT_TRUE(served);
  EXPECT_TRUE(idle_closed);
  EXPECT_TRUE(alive(holder));
  EXPECT_EQ(r.server().dropped_for_room(), 1u);
  ::close(late);
}

}  // namespace
