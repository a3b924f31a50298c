// CUDA IPC of pooled memory, the parts both ends share: what a handle made by the shim holds,
// the messages an importer and the exporting process exchange, and the Unix-socket helpers.
//
// A legacy CUDA IPC handle names a whole driver allocation; a pool block is part of one (a split
// block of a segment) or no such allocation at all (pages of an expandable segment). So the shim
// hands out its own handle, recognisable by its marker, naming the exporting process and one
// export of one block. The importer (another process running the shim) asks the exporter over a
// Unix socket for what it needs to map exactly that block: the segment's driver handle and the
// block's offset, or the file descriptors of the block's physical pages. docs/shim.md describes
// the protocol.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shim/cuda_abi.h"

namespace cudapool::shim::ipc {

using cudaabi::CUipcMemHandle;

inline constexpr char kMarker[8] = {'C', 'P', 'O', 'O', 'L', 'I', 'P', 'C'};
inline constexpr std::uint16_t kVersion = 1;

enum class Kind : std::uint8_t { classic = 1, expandable = 2 };

// The 64 bytes of a CUipcMemHandle the shim made.
struct Handle {
  char marker[8];
  std::uint16_t version;
  Kind kind;
  std::uint8_t reserved0;
  std::uint32_t pid;  // the exporting process
  std::uint32_t uid;  // its user (for messages: the exporter checks the importer's own)
  std::uint32_t reserved1;
  std::uint64_t nonce;  // random per exporting process: names its socket
  std::uint64_t id;     // the export, unique within the process (never reused)
  std::uint64_t size;   // the block's size, as asked for
  std::uint64_t reserved2[2];
};
static_assert(sizeof(Handle) == sizeof(CUipcMemHandle), "a handle fills CUipcMemHandle exactly");

void encode(const Handle& h, CUipcMemHandle* out) noexcept;
// false when `in` is not a handle of this shim (any other bytes: the driver's own handles).
bool decode(const CUipcMemHandle& in, Handle* out) noexcept;

// The exporter's socket, in Linux's abstract namespace (nothing on disk to go stale when the
// process dies): "\0cudapool-ipc.<uid>.<pid>.<nonce>". Both ends check the other's credentials.
std::string socket_name(std::uint32_t uid, std::uint32_t pid, std::uint64_t nonce);

// Requests (importer to exporter), one SOCK_SEQPACKET message each.
enum class Op : std::uint32_t { open = 1, release = 2 };
inline constexpr std::uint32_t kWireMagic = 0x43504950;  // "CPIP"
struct Request {
  std::uint32_t magic = kWireMagic;
  Op op = Op::open;
  std::uint64_t id = 0;
};

// Replies to `open` (release has none).
enum class Status : std::int32_t {
  ok = 0,
  unknown = 1,      // no live export with that id: the block was freed, or never exported here
  refused_uid = 2,  // the importer runs as another user
  error = 3,        // the exporter could not serve it (see its log)
  busy = 4,         // the exporter is out of descriptors or memory for now: ask again shortly
};
const char* to_string(Status s) noexcept;
struct Reply {
  std::uint32_t magic = kWireMagic;
  Status status = Status::error;
  Kind kind = Kind::classic;
  std::uint8_t reserved[3] = {};
  std::uint32_t units = 0;   // expandable: unit messages that follow
  std::uint64_t size = 0;    // the block's size
  std::uint64_t offset = 0;  // classic: from the segment's base; expandable: from the first unit's
  CUipcMemHandle segment{};  // classic: the driver's handle of the whole segment
};
// Expandable: the block's physical units in address order, up to kUnitsPerMessage per message,
// each message carrying that many file descriptors (SCM_RIGHTS).
inline constexpr std::uint32_t kUnitsPerMessage = 128;
struct UnitBatch {
  std::uint32_t magic = kWireMagic;
  std::uint32_t count = 0;
  std::uint64_t bytes[kUnitsPerMessage] = {};
};

// What an importer accepts from an exporter (a peer of the same user, but not trusted: it may be
// broken, hostile or another program at that socket). Each returns "" when the message may be
// used, else what is wrong with it, for a log line.
//  * check_reply: the answer to `open` for the export `h` names: a known status and kind, the
//    kind and size the handle names, no units with a classic block, 1..kMaxUnits with an
//    expandable one.
//  * add_units: one batch of an expandable block's units (`nfds` descriptors came with it):
//    its count matches the descriptors, is no more than the `left` units still expected, and
//    every unit's size is non-zero and keeps the running *total within kMaxMappedBytes.
//  * check_inside: the block [offset, offset + size) lies inside the `range` bytes mapped for
//    it (the classic segment, or the expandable units), with no wrap-around.
inline constexpr std::uint32_t kMaxUnits = 1u << 16;
inline constexpr std::uint64_t kMaxMappedBytes = std::uint64_t{1} << 46;  // 64 TiB: no device has more
std::string check_reply(const Handle& h, const Reply& rep);
std::string add_units(const UnitBatch& b, std::size_t nfds, std::uint32_t left, std::vector<std::uint64_t>* sizes,
                      std::uint64_t* total);
std::string check_inside(std::uint64_t offset, std::uint64_t size, std::uint64_t range);
// The requests an exporter serves: the magic and a known op ("" when it may be served).
std::string check_request(const Request& r);

// Socket helpers. Sends never block (a peer that does not read is dropped, not waited for);
// receives wait at most `timeout_ms`; a connect waits at most `timeout_ms` for an exporter whose
// queue of pending connections is full (then fails with ETIMEDOUT). Sockets are non-blocking.
inline constexpr int kConnectTimeoutMs = 3000;
int listen_abstract(const std::string& name) noexcept;  // -1 on failure (errno set)
int connect_abstract(const std::string& name, int timeout_ms = kConnectTimeoutMs) noexcept;  // -1 on failure
bool send_message(int fd, const void* data, std::size_t bytes, const int* fds = nullptr, int nfds = 0) noexcept;
// Exactly `bytes` bytes in one message, and the descriptors that came with it (close-on-exec).
bool recv_message(int fd, void* data, std::size_t bytes, int timeout_ms, std::vector<int>* fds = nullptr) noexcept;
bool peer_credentials(int fd, pid_t* pid, uid_t* uid) noexcept;

}  // namespace cudapool::shim::ipc
