// No thread_local here: the library must stay loadable by dlopen after start (the Python module
// loads it so into a process started without LD_PRELOAD), where only a small surplus of static
// TLS is left. The last few diagnoses are kept with the thread that got them instead.
#include "shim/oom_note.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace cudapool::shim {

namespace {

struct Note {
  long tid = 0;
  unsigned long long seq = 0;
  std::string msg;
};
constexpr int kNotes = 16;

struct Notes {
  std::mutex mu;
  Note notes[kNotes];
  unsigned long long seq = 0;
};

Notes& notes() {
  static auto* n = new Notes;  // leaked: usable at exit, never destroyed
  return *n;
}

long thread_id() { return static_cast<long>(syscall(SYS_gettid)); }

}  // namespace

void note_oom(const std::string& msg) noexcept {
  const long tid = thread_id();
  // try_lock: a fork while another thread held the lock leaves it held in the child, where a
  // diagnosis is then only logged.
  try {
    Notes& n = notes();
    std::unique_lock<std::mutex> lock(n.mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    Note* slot = &n.notes[0];
    for (Note& x : n.notes) {
      if (x.tid == tid) {
        slot = &x;
        break;
      }
      if (x.seq < slot->seq) slot = &x;  // else the oldest
    }
    slot->tid = tid;
    slot->seq = ++n.seq;
    slot->msg = msg;
  } catch (...) {
  }
}

std::string last_oom() noexcept {
  const long tid = thread_id();
  try {
    Notes& n = notes();
    std::unique_lock<std::mutex> lock(n.mu, std::try_to_lock);
    if (!lock.owns_lock()) return {};
    const Note* newest = nullptr;
    for (const Note& x : n.notes) {
      if (x.seq == 0) continue;
      if (x.tid == tid) return x.msg;
      if (newest == nullptr || x.seq > newest->seq) newest = &x;
    }
    return newest != nullptr ? newest->msg : std::string();
  } catch (...) {
    return {};
  }
}

}  // namespace cudapool::shim
