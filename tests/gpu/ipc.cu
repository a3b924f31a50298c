// CUDA IPC of memory from cudaMalloc across processes, with and without the shim.
//
// The parent allocates four buffers with cudaMalloc (4 KiB twice, so that a pool splits both
// from one segment; 30 MiB; 600 MiB), fills each with its own byte pattern and exports a handle
// for each (cudaIpcGetMemHandle). Children are this program again, fork()ed and exec()ed (a
// forked child of a process that initialized CUDA cannot use CUDA until it execs); they get
// handles as hex on argv and talk to the parent over two pipes. Cases:
//   share       a child opens every handle, checks the range the driver reports for each
//               imported pointer, every byte against the pattern, that distinct handles give
//               distinct memory, that opening one handle twice gives the same pointer and that
//               one close of the two keeps it mapped; then writes a new pattern into each and
//               closes; the parent then finds the new pattern through its own pointers.
//   freed while open (--expect-shim only: undefined behaviour with the real driver)
//               a child opens a 30 MiB block and tells the parent; the parent frees it and
//               allocates and fills six more 30 MiB buffers, none of which may overlap the held
//               block; the child then finds its view unchanged and closes it. The parent
//               allocates 30 MiB once more (it may now get the block back), and a second child's
//               open of the stale handle must fail with cudaErrorInvalidResourceHandle, and so
//               must the handle of a 1 MiB block that was exported and freed with no importer.
//   no shim     (--expect-shim only) a child without LD_PRELOAD opens two of the parent's
//               handles: the real driver's answer to a cudapool handle is printed; any error
//               passes, a mapping fails.
//   exporter gone
//               a child allocates, exports and exits; another child opens the handle. With
//               --expect-shim it must fail with cudaErrorInvalidResourceHandle; without, the
//               driver's answer is printed (INFO).
//   pidfd_getfd whether a child may take a file descriptor from its parent with pidfd_getfd(2)
//               (yama's ptrace_scope decides), printed for information with ptrace_scope.
// --expect-shim also requires every handle to start with the shim's marker "CPOOLIPC".
//
// stdout (children's lines are relayed by the parent, so only the parent writes it):
//   ipc CHECK=NAME ok=0|1 detail=...      one per check
//   ipc INFO=NAME ...                     measurements that pass or fail nothing
//   pidfd_getfd: ok | pidfd_getfd: errno=N (NAME)
//   ptrace_scope: N | ptrace_scope: absent
//   ipc: PASS n=K | ipc: FAIL n=K failed=NAME,NAME...   last line
// Exit status 0 only when every check passed. Diagnostics go to stderr. Bounded to ~28 s: a
// child that does not answer in time is killed and counted as failed.
#include <cuda.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

extern char** environ;

namespace {

constexpr char kMarker[] = "CPOOLIPC";                          // the shim's handles start with these 8 bytes
constexpr double kProgramBudgetS = 28.0;                        // the whole program, children included
constexpr double kChildBudgetS = 15.0;                          // one child, start to exit
constexpr std::size_t kHeldBytes = 30u << 20;                   // the block freed while a child holds it
constexpr int kNewBuffers = 6;                                  // allocated by the parent while it is held
constexpr unsigned kIpcFlags = cudaIpcMemLazyEnablePeerAccess;  // the flag CUDA requires

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
const double g_start = now_s();

// ---------------------------------------------------------------- output
// Check and info lines go to one file descriptor: stdout in the parent, the pipe to the parent
// in a child. write(2) of whole lines keeps them intact and unbuffered across fork/exec.
struct Reporter {
  int fd = STDOUT_FILENO;
  int checks = 0;
  std::vector<std::string> failed;

  void line(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = std::vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
    for (int i = 0; i < n; ++i)
      if (buf[i] == '\n') buf[i] = ' ';  // one record per line
    buf[n++] = '\n';
    raw(buf, n);
  }
  void raw(const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void count(const std::string& name, bool ok) {
    ++checks;
    if (!ok) failed.push_back(name);
  }
  void check(const std::string& name, bool ok, const char* fmt, ...) __attribute__((format(printf, 4, 5))) {
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    count(name, ok);
    line("ipc CHECK=%s ok=%d detail=%s", name.c_str(), ok ? 1 : 0, detail);
  }
};
Reporter g_rep;

const char* err_name(cudaError_t e) { return cudaGetErrorName(e); }

const char* errno_name(int e) {
  switch (e) {
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EACCES: return "EACCES";
    case EBADF: return "EBADF";
    case ESRCH: return "ESRCH";
    case EINVAL: return "EINVAL";
    case EMFILE: return "EMFILE";
    default: return "other";
  }
}

// ---------------------------------------------------------------- handles as text
std::string to_hex(const cudaIpcMemHandle_t& h) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < sizeof h.reserved; ++i) {
    const auto b = static_cast<unsigned char>(h.reserved[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

bool from_hex(const std::string& s, cudaIpcMemHandle_t* h) {
  if (s.size() != 2 * sizeof h->reserved) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < sizeof h->reserved; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    h->reserved[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

// The handle's first 8 bytes as text, non-printable bytes as '.', for the marker check's detail.
std::string head_text(const cudaIpcMemHandle_t& h) {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    const char c = h.reserved[i];
    s += (c >= 0x21 && c <= 0x7e) ? c : '.';
  }
  return s;
}

bool has_marker(const cudaIpcMemHandle_t& h) { return std::memcmp(h.reserved, kMarker, 8) == 0; }

// Splits "a:b:c" at ':'.
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t c = s.find(':', start);
    out.push_back(s.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) return out;
    start = c + 1;
  }
}

// ---------------------------------------------------------------- device helpers
// Counts the bytes of [p, p+n) that differ from pattern `tag`. False when a CUDA call failed
// (an imported pointer that maps nothing faults here), with the error in *err.
bool count_bad(const void* p, std::size_t n, std::uint32_t tag, unsigned long long* bad, cudaError_t* err) {
  static unsigned long long* counters = nullptr;
  cudaError_t e = cudaSuccess;
  if (!counters) e = cudaMalloc(&counters, 2 * sizeof(unsigned long long));
  if (e == cudaSuccess) e = cudaMemset(counters, 0, 2 * sizeof(unsigned long long));
  if (e == cudaSuccess) {
    check_pattern<<<grid_for(n), 256>>>(static_cast<const std::uint8_t*>(p), n, tag, counters, counters + 1);
    e = cudaGetLastError();
  }
  unsigned long long host[2] = {0, 0};
  if (e == cudaSuccess) e = cudaMemcpy(host, counters, sizeof host, cudaMemcpyDeviceToHost);
  *err = e;
  *bad = host[0];
  return e == cudaSuccess;
}

bool fill(void* p, std::size_t n, std::uint32_t tag) {
  fill_pattern<<<grid_for(n), 256>>>(static_cast<std::uint8_t*>(p), n, tag);
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

// The parent's own buffers: a failure here is no IPC result, the program stops (exit 2).
void must_fill(void* p, std::size_t n, std::uint32_t tag) {
  fill_pattern<<<grid_for(n), 256>>>(static_cast<std::uint8_t*>(p), n, tag);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange through the runtime's entry-point query (no -lcuda: the shim answers it
// the same way it answers a program linked with the driver library).
GetRange range_fn() {
  static GetRange fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<GetRange>(f);
  }();
  return fn;
}

// On a content mismatch: where inside the range the driver reports for p the pattern does start
// (512-byte steps, first 64 bytes compared on the host), relative to p; a pointer that points at
// the start of a larger allocation instead of at the block shows up as a positive offset.
std::string locate_pattern(const void* p, std::size_t n, std::uint32_t tag) {
  GetRange get = range_fn();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!get || get(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return "range unknown";
  if (size > (64u << 20)) return "range too large to search";
  std::vector<std::uint8_t> host(size);
  if (cudaMemcpy(host.data(), reinterpret_cast<void*>(base), size, cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return "range not readable";
  }
  const std::size_t probe = n < 64 ? n : 64;
  for (std::size_t off = 0; off + probe <= size; off += 512) {
    bool match = true;
    for (std::size_t i = 0; i < probe && match; ++i) match = host[off + i] == pattern_byte(tag, i);
    if (match) {
      const long long rel = static_cast<long long>(base + off) -
                            static_cast<long long>(reinterpret_cast<CUdeviceptr>(p));
      return "pattern found at offset " + std::to_string(rel) + " from the pointer";
    }
  }
  return "pattern not found in the range (" + std::to_string(size) + " bytes)";
}

// ---------------------------------------------------------------- children
std::string g_exe;  // this program, as the parent found it

struct Child {
  std::string label;
  pid_t pid = -1;
  int to_child = -1;    // the parent writes commands here
  int from_child = -1;  // the parent reads lines here
  std::string buf;
  double deadline = 0;
  int failures = 0;  // failing checks the child reported
  bool timed_out = false;
};

// Starts `role` as a new process of this program. keep_preload=false removes LD_PRELOAD from
// its environment (the importer without the shim).
Child spawn(const std::string& label, const std::string& role, const std::vector<std::string>& args,
            bool keep_preload = true) {
  Child c;
  c.label = label;
  c.deadline = std::min(g_start + kProgramBudgetS, now_s() + kChildBudgetS);
  int down[2], up[2];
  if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(2);
  }
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the parent has CUDA's threads).
  std::vector<std::string> argv_s = {g_exe, "--child", role, std::to_string(down[0]), std::to_string(up[1])};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (keep_preload || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(2);
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the parent is killed by its timeout
    if (getppid() != parent) _exit(127);
    fcntl(down[0], F_SETFD, 0);  // the two ends the child uses survive exec
    fcntl(up[1], F_SETFD, 0);
    execve(g_exe.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  c.pid = pid;
  c.to_child = down[1];
  c.from_child = up[0];
  return c;
}

// The next raw line from the child; false at EOF or when its deadline passed.
bool read_line(Child& c, std::string* line) {
  for (;;) {
    const std::size_t nl = c.buf.find('\n');
    if (nl != std::string::npos) {
      *line = c.buf.substr(0, nl);
      c.buf.erase(0, nl + 1);
      return true;
    }
    if (c.from_child < 0) {
      if (c.buf.empty()) return false;
      *line = c.buf;
      c.buf.clear();
      return true;
    }
    const int ms = static_cast<int>((c.deadline - now_s()) * 1000);
    if (ms <= 0) {
      c.timed_out = true;
      return false;
    }
    pollfd p{c.from_child, POLLIN, 0};
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // the loop re-checks the deadline
    char tmp[4096];
    const ssize_t n = read(c.from_child, tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(c.from_child);
      c.from_child = -1;
      continue;
    }
    c.buf.append(tmp, static_cast<std::size_t>(n));
  }
}

// The next control message ("@WORD ...", returned without the '@'); check and info lines on the
// way are relayed to stdout and counted. False at EOF or timeout.
bool next_control(Child& c, std::string* msg) {
  std::string line;
  while (read_line(c, &line)) {
    if (!line.empty() && line[0] == '@') {
      *msg = line.substr(1);
      return true;
    }
    if (line.rfind("ipc CHECK=", 0) == 0) {
      const std::size_t sp = line.find(' ', 10);
      const std::string name = line.substr(10, sp == std::string::npos ? std::string::npos : sp - 10);
      const bool ok = sp != std::string::npos && line.compare(sp, 5, " ok=1") == 0;
      g_rep.count(name, ok);
      if (!ok) ++c.failures;
    }
    line += '\n';
    g_rep.raw(line.data(), line.size());
  }
  return false;
}

void send(Child& c, const char* msg) {
  const std::string s = std::string(msg) + "\n";
  if (c.to_child >= 0 && ::write(c.to_child, s.data(), s.size()) != static_cast<ssize_t>(s.size()))
    std::fprintf(stderr, "ipc: could not write to child %s\n", c.label.c_str());
}

// Relays the child's remaining lines, waits for it to exit (kills it at its deadline) and
// checks that it exited by itself with the status its own checks call for.
void finish(Child& c) {
  std::string msg;
  while (next_control(c, &msg)) {
  }
  if (c.to_child >= 0) close(c.to_child);
  c.to_child = -1;
  int status = 0;
  bool reaped = false;
  while (!reaped && now_s() < c.deadline) {
    const pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid)
      reaped = true;
    else if (r < 0 && errno != EINTR)
      break;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!reaped) {
    c.timed_out = true;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  }
  if (c.from_child >= 0) close(c.from_child);
  c.from_child = -1;
  const int want = c.failures ? 1 : 0;
  if (c.timed_out) {
    g_rep.check("exit_" + c.label, false, "no answer within its time: killed");
  } else if (WIFSIGNALED(status)) {
    g_rep.check("exit_" + c.label, false, "killed by signal %d", WTERMSIG(status));
  } else {
    const int rc = WEXITSTATUS(status);
    g_rep.check("exit_" + c.label, rc == want, "rc=%d%s", rc,
                rc == 127 ? " (exec failed)"
                : rc == 2 ? " (a CUDA call failed: see stderr)"
                          : "");
  }
}

// ---------------------------------------------------------------- child roles
// Reads one line from the parent (blocking up to `seconds`).
bool wait_parent(int rfd, std::string* line, double seconds) {
  std::string buf;
  const double end = now_s() + seconds;
  for (;;) {
    const std::size_t nl = buf.find('\n');
    if (nl != std::string::npos) {
      *line = buf.substr(0, nl);
      return true;
    }
    const int ms = static_cast<int>((end - now_s()) * 1000);
    if (ms <= 0) return false;
    pollfd p{rfd, POLLIN, 0};
    const int r = poll(&p, 1, ms);
    if (r <= 0) continue;
    char c;
    const ssize_t n = read(rfd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf += c;
  }
}

struct Item {
  std::string name;
  std::size_t n = 0;
  std::uint32_t tag = 0;
  cudaIpcMemHandle_t h{};
  void* p = nullptr;
};

// "NAME:SIZE:TAG:HEX"
bool parse_item(const std::string& s, Item* it) {
  const auto f = split(s);
  if (f.size() != 4) return false;
  it->name = f[0];
  it->n = std::stoull(f[1]);
  it->tag = static_cast<std::uint32_t>(std::stoul(f[2]));
  return from_hex(f[3], &it->h);
}

std::string item_arg(const std::string& name, std::size_t n, std::uint32_t tag, const cudaIpcMemHandle_t& h) {
  return name + ":" + std::to_string(n) + ":" + std::to_string(tag) + ":" + to_hex(h);
}

// The range and attributes of an imported pointer. strict (the shim): the range is the block,
// base = p and size = n rounded up to at most 512 bytes. Otherwise (the driver may share the
// whole allocation a small block was carved from): the range covers [p, p+n).
void check_range(const Item& it, bool strict) {
  GetRange get = range_fn();
  if (!get) {
    g_rep.check("range_" + it.name, false, "cuMemGetAddressRange not resolvable");
    return;
  }
  const std::size_t rounded = (it.n + 511) / 512 * 512;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(it.p);
  bool ok = true;
  std::string detail;
  for (std::size_t off : {std::size_t{0}, it.n / 2}) {
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult r = get(&base, &size, p + off);
    const bool good = r == CUDA_SUCCESS &&
                      (strict ? base == p && size >= it.n && size <= rounded : base <= p && base + size >= p + it.n);
    ok = ok && good;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s+%zu: rc=%d base=p%+lld size=%zu", detail.empty() ? "" : "; ", off,
                  static_cast<int>(r), static_cast<long long>(base) - static_cast<long long>(p), size);
    detail += buf;
  }
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, static_cast<std::uint8_t*>(it.p) + 1);
  const bool attr_ok = e == cudaSuccess && attr.type == cudaMemoryTypeDevice && attr.device == 0;
  if (e != cudaSuccess) cudaGetLastError();
  g_rep.check("range_" + it.name, ok && attr_ok, "%s; attributes rc=%d type=%d device=%d (want %s)", detail.c_str(),
              static_cast<int>(e), static_cast<int>(attr.type), attr.device,
              strict ? "base=p, size=n..n rounded to 512" : "a range covering the block");
}

bool check_contents(const std::string& check, const Item& it, std::uint32_t tag) {
  unsigned long long bad = 0;
  cudaError_t e = cudaSuccess;
  if (!count_bad(it.p, it.n, tag, &bad, &e)) {
    g_rep.check(check, false, "reading failed: %s", err_name(e));
    return false;
  }
  if (bad) {
    g_rep.check(check, false, "bad=%llu of %zu bytes; %s", bad, it.n, locate_pattern(it.p, it.n, tag).c_str());
    return false;
  }
  g_rep.check(check, true, "bad=0 of %zu bytes", it.n);
  return true;
}

// share: open every handle, check, write tag+100, close.
int role_share(const std::vector<std::string>& args) {
  const bool strict = !args.empty() && args[0] == "strict";
  std::vector<Item> items;
  for (std::size_t i = 1; i < args.size(); ++i) {
    Item it;
    if (!parse_item(args[i], &it)) {
      g_rep.check("share_args", false, "cannot parse '%s'", args[i].c_str());
      return 1;
    }
    items.push_back(it);
  }
  CK(cudaSetDevice(0));
  std::vector<Item*> open;
  for (auto& it : items) {
    const cudaError_t e = cudaIpcOpenMemHandle(&it.p, it.h, kIpcFlags);
    if (e != cudaSuccess) cudaGetLastError();
    g_rep.check("open_" + it.name, e == cudaSuccess, "err=%d (%s) bytes=%zu", static_cast<int>(e), err_name(e), it.n);
    if (e != cudaSuccess) continue;
    open.push_back(&it);
    check_range(it, strict);
    check_contents("read_" + it.name, it, it.tag);
  }
  // Distinct handles must give distinct, non-overlapping memory (two split blocks of one
  // segment must not both open at the segment's start).
  int overlaps = 0;
  for (std::size_t i = 0; i < open.size(); ++i)
    for (std::size_t j = i + 1; j < open.size(); ++j) {
      const auto a = reinterpret_cast<std::uintptr_t>(open[i]->p), b = reinterpret_cast<std::uintptr_t>(open[j]->p);
      if (a < b + open[j]->n && b < a + open[i]->n) ++overlaps;
    }
  g_rep.check("distinct_pointers", overlaps == 0 && open.size() == items.size(), "overlapping pairs=%d of %zu opened",
              overlaps, open.size());
  // CUDA's rule: a second open of a handle in the same process returns the same pointer and
  // counts a reference; each open needs its close, and the first close leaves it mapped.
  if (!open.empty()) {
    Item& it = *open.front();
    void* again = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&again, it.h, kIpcFlags);
    if (e != cudaSuccess) cudaGetLastError();
    g_rep.check("open_twice_same_pointer", e == cudaSuccess && again == it.p, "%s: err=%d (%s) same=%d",
                it.name.c_str(), static_cast<int>(e), err_name(e), again == it.p);
    if (e == cudaSuccess) {
      const cudaError_t ce = cudaIpcCloseMemHandle(again);
      if (ce != cudaSuccess) cudaGetLastError();
      unsigned long long bad = 0;
      cudaError_t re = cudaSuccess;
      const bool read = count_bad(it.p, it.n, it.tag, &bad, &re);
      g_rep.check("close_one_of_two", ce == cudaSuccess && read && bad == 0,
                  "%s: close err=%d (%s); still mapped: read %s, bad=%llu", it.name.c_str(), static_cast<int>(ce),
                  err_name(ce), read ? "ok" : err_name(re), bad);
    }
  }
  for (Item* it : open) {
    const bool wrote = fill(it->p, it->n, it->tag + 100);
    const cudaError_t e = cudaIpcCloseMemHandle(it->p);
    if (e != cudaSuccess) cudaGetLastError();
    g_rep.check("close_" + it->name, wrote && e == cudaSuccess, "wrote tag+100: %s; close err=%d (%s)",
                wrote ? "ok" : "failed", static_cast<int>(e), err_name(e));
  }
  return g_rep.failed.empty() ? 0 : 1;
}

// hold: open, check, tell the parent "@opened", wait for "go", check again, close.
int role_hold(int rfd, const std::vector<std::string>& args) {
  Item it;
  if (args.size() != 1 || !parse_item(args[0], &it)) {
    g_rep.check("hold_args", false, "expected one NAME:SIZE:TAG:HEX");
    return 1;
  }
  CK(cudaSetDevice(0));
  const cudaError_t e = cudaIpcOpenMemHandle(&it.p, it.h, kIpcFlags);
  if (e != cudaSuccess) cudaGetLastError();
  g_rep.check("open_held", e == cudaSuccess, "err=%d (%s)", static_cast<int>(e), err_name(e));
  if (e != cudaSuccess) return 1;
  check_contents("read_held_before_free", it, it.tag);
  g_rep.line("@opened");
  std::string cmd;
  if (!wait_parent(rfd, &cmd, kChildBudgetS) || cmd != "go") {
    g_rep.check("held_parent_answer", false, "no 'go' from the parent");
  } else {
    // The parent has freed the block and allocated and filled more memory since.
    check_contents("freed_view_unchanged", it, it.tag);
  }
  const cudaError_t ce = cudaIpcCloseMemHandle(it.p);
  if (ce != cudaSuccess) cudaGetLastError();
  g_rep.check("close_held", ce == cudaSuccess, "err=%d (%s)", static_cast<int>(ce), err_name(ce));
  return g_rep.failed.empty() ? 0 : 1;
}

// open_fail: each "NAME:EXPECT:HEX" must not open. EXPECT: a cudaError_t number (exactly that
// error), "any" (any error), or "info" (only print the answer).
int role_open_fail(const std::vector<std::string>& args) {
  CK(cudaSetDevice(0));
  for (const auto& a : args) {
    const auto f = split(a);
    cudaIpcMemHandle_t h{};
    if (f.size() != 3 || !from_hex(f[2], &h)) {
      g_rep.check("open_fail_args", false, "cannot parse '%s'", a.c_str());
      continue;
    }
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h, kIpcFlags);
    std::string mapped;
    if (e == cudaSuccess) {
      // Something was mapped: say what, then undo it.
      GetRange get = range_fn();
      CUdeviceptr base = 0;
      size_t size = 0;
      if (get && get(&base, &size, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS)
        mapped = "; mapped " + std::to_string(size) + " bytes";
      else
        mapped = "; mapped, range unknown";
      if (cudaIpcCloseMemHandle(p) != cudaSuccess) cudaGetLastError();
    } else {
      cudaGetLastError();  // IPC errors are not sticky; clear the last-error slot anyway
    }
    const std::string& name = f[0];
    if (f[1] == "info") {
      g_rep.line("ipc INFO=%s err=%d (%s)%s", name.c_str(), static_cast<int>(e), err_name(e), mapped.c_str());
    } else if (f[1] == "any") {
      g_rep.check(name, e != cudaSuccess, "err=%d (%s)%s", static_cast<int>(e), err_name(e), mapped.c_str());
    } else {
      const int want = std::stoi(f[1]);
      g_rep.check(name, static_cast<int>(e) == want, "err=%d (%s) want=%d (%s)%s", static_cast<int>(e), err_name(e),
                  want, err_name(static_cast<cudaError_t>(want)), mapped.c_str());
    }
  }
  return g_rep.failed.empty() ? 0 : 1;
}

// export: allocate SIZE bytes, fill with TAG, send "@handle HEX", exit without freeing.
int role_export(const std::vector<std::string>& args) {
  if (args.size() != 2) return 1;
  const std::size_t n = std::stoull(args[0]);
  const auto tag = static_cast<std::uint32_t>(std::stoul(args[1]));
  CK(cudaSetDevice(0));
  void* p = nullptr;
  CK(cudaMalloc(&p, n));
  if (!fill(p, n, tag)) return 2;
  cudaIpcMemHandle_t h{};
  const cudaError_t e = cudaIpcGetMemHandle(&h, p);
  g_rep.check("export_in_child", e == cudaSuccess, "err=%d (%s)", static_cast<int>(e), err_name(e));
  if (e == cudaSuccess) g_rep.line("@handle %s", to_hex(h).c_str());
  return e == cudaSuccess ? 0 : 1;  // the process ends with the block still allocated
}

// pidfd: take file descriptor FD from process PID with pidfd_getfd(2) and read it.
int role_pidfd(const std::vector<std::string>& args) {
  if (args.size() != 2) return 1;
  const long pid = std::stol(args[0]);
  const long target = std::stol(args[1]);
  constexpr long kPidfdOpen = 434, kPidfdGetfd = 438;  // the same number on every architecture
  const long pidfd = syscall(kPidfdOpen, pid, 0);
  if (pidfd < 0) {
    const int e = errno;
    g_rep.line("pidfd_getfd: errno=%d (%s) at pidfd_open", e, errno_name(e));
    return 0;
  }
  const long fd = syscall(kPidfdGetfd, pidfd, target, 0);
  if (fd < 0) {
    const int e = errno;
    g_rep.line("pidfd_getfd: errno=%d (%s)", e, errno_name(e));
  } else {
    char buf[64] = {};
    const ssize_t n = pread(static_cast<int>(fd), buf, sizeof buf - 1, 0);
    const bool same = n > 0 && std::strcmp(buf, "cudapool-ipc-probe") == 0;
    g_rep.line("pidfd_getfd: ok%s", same ? "" : " (but its contents differ)");
    close(static_cast<int>(fd));
  }
  close(static_cast<int>(pidfd));
  return 0;
}

int child_main(int argc, char** argv) {
  // argv: EXE --child ROLE RFD WFD ARGS...
  if (argc < 5) return 127;
  const std::string role = argv[2];
  const int rfd = std::atoi(argv[3]);
  g_rep.fd = std::atoi(argv[4]);
  const std::vector<std::string> args(argv + 5, argv + argc);
  if (role == "share") return role_share(args);
  if (role == "hold") return role_hold(rfd, args);
  if (role == "open_fail") return role_open_fail(args);
  if (role == "export") return role_export(args);
  if (role == "pidfd") return role_pidfd(args);
  g_rep.check("child_role", false, "unknown role %s", role.c_str());
  return 1;
}

// ---------------------------------------------------------------- the parent
struct Buf {
  const char* name;
  std::size_t n;
  std::uint32_t tag;
  void* p = nullptr;
  cudaIpcMemHandle_t h{};
  bool exported = false;
};

void export_handle(Buf& b, bool strict) {
  const cudaError_t e = cudaIpcGetMemHandle(&b.h, b.p);
  if (e != cudaSuccess) cudaGetLastError();
  b.exported = e == cudaSuccess;
  g_rep.check(std::string("export_") + b.name, b.exported, "err=%d (%s) bytes=%zu", static_cast<int>(e), err_name(e),
              b.n);
  if (strict && b.exported)
    g_rep.check(std::string("marker_") + b.name, has_marker(b.h), "first 8 bytes '%s', want '%s'",
                head_text(b.h).c_str(), kMarker);
}

void check_parent_sees(const Buf& b, std::uint32_t tag) {
  unsigned long long bad = 0;
  cudaError_t e = cudaSuccess;
  const bool read = count_bad(b.p, b.n, tag, &bad, &e);
  g_rep.check(std::string("parent_sees_write_") + b.name, read && bad == 0, "%s bad=%llu of %zu bytes",
              read ? "read ok," : err_name(e), bad, b.n);
}

void print_ptrace_scope() {
  FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int v = -1;
  if (f) {
    if (std::fscanf(f, "%d", &v) != 1) v = -1;
    std::fclose(f);
  }
  if (v >= 0)
    g_rep.line("ptrace_scope: %d", v);
  else
    g_rep.line("ptrace_scope: absent");
}

// Whether a child may take one of the parent's descriptors (a memfd holding a known string).
void pidfd_probe() {
  int fd = static_cast<int>(syscall(SYS_memfd_create, "cudapool-ipc-probe", MFD_CLOEXEC));
  if (fd < 0) {
    g_rep.line("pidfd_getfd: not measured (memfd_create errno=%d)", errno);
    return;
  }
  const char text[] = "cudapool-ipc-probe";
  if (::write(fd, text, sizeof text) != static_cast<ssize_t>(sizeof text)) {
    g_rep.line("pidfd_getfd: not measured (write failed)");
    close(fd);
    return;
  }
  Child c = spawn("pidfd", "pidfd", {std::to_string(getpid()), std::to_string(fd)});
  finish(c);
  close(fd);
}

// Freed while a child holds it (shim only).
void freed_while_open() {
  Buf h{"held", kHeldBytes, 7};
  CK(cudaMalloc(&h.p, h.n));
  must_fill(h.p, h.n, h.tag);
  export_handle(h, true);
  if (!h.exported) {
    CK(cudaFree(h.p));
    return;
  }
  Child c = spawn("hold", "hold", {item_arg("held", h.n, h.tag, h.h)});
  std::string msg;
  const bool opened = next_control(c, &msg) && msg == "opened";
  std::vector<void*> fresh;
  if (opened) {
    CK(cudaFree(h.p));
    const auto held = reinterpret_cast<std::uintptr_t>(h.p);
    int overlapping = 0;
    for (int i = 0; i < kNewBuffers; ++i) {
      void* q = nullptr;
      CK(cudaMalloc(&q, kHeldBytes));
      must_fill(q, kHeldBytes, 8);
      const auto a = reinterpret_cast<std::uintptr_t>(q);
      if (a < held + kHeldBytes && held < a + kHeldBytes) ++overlapping;
      fresh.push_back(q);
    }
    g_rep.check("freed_held_not_reused", overlapping == 0, "%d of %d new 30 MiB buffers overlap the held block",
                overlapping, kNewBuffers);
    send(c, "go");
  } else {
    g_rep.check("hold_opened", false, "the child did not report an open (%s)", msg.c_str());
    CK(cudaFree(h.p));
  }
  finish(c);
  if (!opened) {
    for (void* q : fresh) CK(cudaFree(q));
    return;
  }
  // The importer has closed: the block is the pool's again and may be handed out now. The stale
  // handle must not open it (nor whatever now lives there).
  void* again = nullptr;
  CK(cudaMalloc(&again, kHeldBytes));
  must_fill(again, kHeldBytes, 9);
  g_rep.line("ipc INFO=held_block_reused_after_close same_address=%d", again == h.p);
  // And a block exported and freed with no importer ever: its handle must not open either.
  Buf f{"freed", 1u << 20, 10};
  CK(cudaMalloc(&f.p, f.n));
  must_fill(f.p, f.n, f.tag);
  export_handle(f, true);
  CK(cudaFree(f.p));
  const std::string invalid = std::to_string(static_cast<int>(cudaErrorInvalidResourceHandle));
  std::vector<std::string> refused = {"stale_handle_refused:" + invalid + ":" + to_hex(h.h)};
  if (f.exported) refused.push_back("freed_handle_refused:" + invalid + ":" + to_hex(f.h));
  Child s = spawn("stale", "open_fail", refused);
  finish(s);
  CK(cudaFree(again));
  for (void* q : fresh) CK(cudaFree(q));
}

// A child exports a block and exits; another child opens the handle.
void exporter_gone(bool strict) {
  Child e = spawn("exporter", "export", {std::to_string(1u << 20), "12"});
  std::string msg;
  cudaIpcMemHandle_t h{};
  const bool got = next_control(e, &msg) && msg.rfind("handle ", 0) == 0 && from_hex(msg.substr(7), &h);
  finish(e);
  if (!got) {
    g_rep.check("exporter_handle", false, "no handle from the exporting child");
    return;
  }
  if (strict) g_rep.check("marker_exported_by_child", has_marker(h), "first 8 bytes '%s'", head_text(h).c_str());
  const std::string expect = strict ? std::to_string(static_cast<int>(cudaErrorInvalidResourceHandle))
                                    : std::string("info");
  Child o = spawn("exporter_gone", "open_fail", {"exporter_gone_refused:" + expect + ":" + to_hex(h)});
  finish(o);
}

int parent_main(bool strict) {
  g_rep.line("ipc INFO=mode expect_shim=%d", strict ? 1 : 0);
  print_ptrace_scope();
  pidfd_probe();

  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));  // the context, before the timed part of the children's lives
  Buf bufs[] = {{"a4k", 4096, 1}, {"b4k", 4096, 2}, {"m30", 30u << 20, 3}, {"m600", 600u << 20, 4}};
  for (Buf& b : bufs) CK(cudaMalloc(&b.p, b.n));  // back to back: the two 4 KiB blocks share a segment
  for (Buf& b : bufs) must_fill(b.p, b.n, b.tag);
  std::vector<std::string> items = {strict ? "strict" : "plain"};
  for (Buf& b : bufs) {
    export_handle(b, strict);
    if (b.exported) items.push_back(item_arg(b.name, b.n, b.tag, b.h));
  }
  if (items.size() > 1) {
    Child c = spawn("share", "share", items);
    finish(c);
    for (const Buf& b : bufs)
      if (b.exported) check_parent_sees(b, b.tag + 100);
  }

  if (strict) {
    freed_while_open();
    // The real driver given the shim's handles of a split block and of a whole segment.
    std::vector<std::string> foreign;
    for (const Buf& b : bufs)
      if (b.exported && (b.n == 4096 || b.n == (600u << 20)))
        foreign.push_back(std::string("noshim_importer_") + b.name + ":any:" + to_hex(b.h));
    if (!foreign.empty()) {
      Child c = spawn("noshim", "open_fail", foreign, /*keep_preload=*/false);
      finish(c);
    }
  }
  exporter_gone(strict);

  for (Buf& b : bufs) CK(cudaFree(b.p));
  CK(cudaDeviceSynchronize());
  const double took = now_s() - g_start;
  std::fprintf(stderr, "ipc: %.1f s\n", took);
  if (g_rep.failed.empty()) {
    g_rep.line("ipc: PASS n=%d", g_rep.checks);
    return 0;
  }
  std::string names;
  for (const auto& f : g_rep.failed) names += (names.empty() ? "" : ",") + f;
  g_rep.line("ipc: FAIL n=%d failed=%s", g_rep.checks, names.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--child") == 0) return child_main(argc, argv);
  bool strict = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expect-shim") == 0) {
      strict = true;
    } else {
      std::fprintf(stderr, "usage: %s [--expect-shim]\n", argv[0]);
      return 2;
    }
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    std::perror("readlink /proc/self/exe");
    return 2;
  }
  g_exe.assign(exe, static_cast<std::size_t>(n));
  signal(SIGPIPE, SIG_IGN);  // a dead child's pipe gives EPIPE, not death
  return parent_main(strict);
}
