// Writes the seed inputs of the fuzzers whose inputs are binary layouts, from the layouts
// themselves: the group ledger (share_ledger), the stats record (share_record) and the CUDA IPC
// wire messages (shim_ipc_wire). `make fuzz-seeds` runs it into tests/fuzz/corpus/, where the
// seeds are committed; run it again after a layout changes.
//
// Each target gets inputs its reader accepts, seed_* (so the fuzzer starts past the checks; some
// hold odd values a reader must take in stride: strings without their NUL, an unknown slot state,
// a record caught mid-write), and inputs it refuses, edge_* (the first thing wrong: a size, a
// version, a name without its NUL, an offset that wraps). The generator checks each verdict, so a
// layout that changed shows as its error. The layout of each input is the one its fuzz target
// reads (tests/fuzz/*.cpp).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shim/group/group_ledger_layout.h"
#include "shim/ipc/ipc_wire.h"
#include "telemetry/share.h"

namespace {

namespace share = cudapool::share;
namespace ipc = cudapool::shim::ipc;

std::string g_root;
int g_failed = 0;

// A seed_* input must be accepted by its reader and an edge_* one refused: a layout that changed
// under the generator shows here, not as a corpus that quietly stopped reaching past the checks.
void expect(const std::string& target, const std::string& name, bool accepted, const std::string& why) {
  const bool want = name.rfind("seed_", 0) == 0;
  if (accepted == want) return;
  std::fprintf(stderr, "make_seeds: %s/%s was %s by its reader%s%s\n", target.c_str(), name.c_str(),
               accepted ? "accepted" : "refused", why.empty() ? "" : ": ", why.c_str());
  ++g_failed;
}

void put(const std::string& target, const std::string& name, const void* data, std::size_t bytes) {
  const std::string dir = g_root + "/" + target;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "make_seeds: cannot create %s: %s\n", dir.c_str(), std::strerror(errno));
    ++g_failed;
    return;
  }
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (bytes > 0 && std::fwrite(data, 1, bytes, f) != bytes) || std::fclose(f) != 0) {
    std::fprintf(stderr, "make_seeds: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    ++g_failed;
  }
}
template <typename T>
void put(const std::string& target, const std::string& name, const T& value) {
  put(target, name, &value, sizeof value);
}
void put(const std::string& target, const std::string& name, const std::vector<unsigned char>& bytes) {
  put(target, name, bytes.data(), bytes.size());
}
template <typename T>
void append(std::vector<unsigned char>* out, const T& value) {
  const auto* p = reinterpret_cast<const unsigned char*>(&value);
  out->insert(out->end(), p, p + sizeof value);
}

// ---- share_ledger: a whole ledger is read as it is (uid from its header); an input shorter
// than a ledger with an odd first byte is laid over a valid ledger from `total` on.

constexpr unsigned kUid = 1000;

std::unique_ptr<share::Ledger> ledger() {
  auto l = std::make_unique<share::Ledger>();
  share::init_ledger(*l, kUid, "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "train", std::uint64_t{40} << 30);
  return l;
}
void live(share::Ledger& l, std::uint32_t slot, int pid, std::uint64_t reserved) {
  share::LedgerSlot& s = l.slot[slot];
  s.state.store(share::kSlotLive);
  s.pid.store(pid);
  s.start_time.store(1'000'000 + static_cast<std::uint64_t>(pid));
  s.pid_ns.store(4026531836);
  s.reserved.store(reserved);
  s.cached.store(reserved / 4);
  s.allocated.store(reserved / 2);
  s.heartbeat_ns.store(123'456'789);
  l.total.store(l.total.load() + reserved);
}

// A whole ledger's bytes (or a prefix of them), written and checked as the fuzz target reads them.
void put_ledger(const std::string& name, const share::Ledger& l, std::size_t bytes = sizeof(share::Ledger)) {
  share::LedgerView v;
  std::string why;
  const bool ok = share::parse_ledger(&l, bytes, l.uid, &v, &why);
  expect("share_ledger", name, ok, why);
  put("share_ledger", name, &l, bytes);
}

void ledger_seeds() {
  const std::string t = "share_ledger";
  put_ledger("seed_empty", *ledger());
  {
    auto l = ledger();
    live(*l, 0, 4242, std::uint64_t{3} << 30);
    live(*l, 5, 4243, std::uint64_t{1} << 20);
    live(*l, share::kLedgerSlots - 1, 99999, 4096);
    put_ledger("seed_three_members", *l);
  }
  {
    auto l = ledger();
    for (std::uint32_t i = 0; i < share::kLedgerSlots; ++i) live(*l, i, 1000 + static_cast<int>(i), 1 << 20);
    put_ledger("seed_all_slots_live", *l);
  }
  {
    auto l = std::make_unique<share::Ledger>();
    share::init_ledger(*l, kUid, std::string(share::kNameBytes - 1, 'G'), std::string(share::kNameBytes - 1, 'g'), 1);
    put_ledger("seed_longest_names", *l);
  }
  {
    auto l = ledger();
    std::memset(l->group, 'a', sizeof l->group);  // no NUL in the field
    put_ledger("edge_group_without_nul", *l);
  }
  {
    auto l = ledger();
    l->version = share::kLedgerVersion + 1;
    put_ledger("edge_next_version", *l);
  }
  {
    auto l = ledger();
    l->budget = 0;
    put_ledger("edge_budget_zero", *l);
  }
  {
    auto l = ledger();
    l->slots = share::kLedgerSlots * 2;
    put_ledger("edge_slot_count", *l);
  }
  {
    auto l = ledger();
    live(*l, 3, 77, 1 << 20);
    l->slot[4].state.store(7);  // neither free nor live
    put_ledger("seed_slot_state_unknown", *l);
  }
  {
    // Parking words: one member parked, one that says why not (a text without its NUL), one with
    // codes this reader does not know and times past any clock.
    auto l = ledger();
    live(*l, 0, 501, 0);
    l->slot[0].parking.parked.store(1);
    l->slot[0].parking.parked_bytes.store(std::uint64_t{6} << 30);
    l->slot[0].parking.parkable.store(share::kParkNotNow);
    std::snprintf(l->slot[0].parking.why, sizeof l->slot[0].parking.why, "already parked");
    live(*l, 1, 502, std::uint64_t{2} << 30);
    l->slot[1].parking.parkable.store(share::kParkNotNow);
    std::memset(l->slot[1].parking.why, 'w', sizeof l->slot[1].parking.why);
    std::memset(l->slot[1].parking.refusal, '\x1b', sizeof l->slot[1].parking.refusal);
    live(*l, 2, 503, std::uint64_t{1} << 30);
    l->slot[2].parking.parkable.store(99);
    l->slot[2].park.result.store(77);
    l->slot[2].parking.active_ns.store(~std::uint64_t{0});
    l->slot[2].park.req.store(5);
    l->slot[2].park.ack.store(~std::uint32_t{0});
    put_ledger("seed_parking", *l);
  }
  {
    auto l = ledger();
    live(*l, 1, 88, 1 << 20);
    put_ledger("edge_truncated", *l, sizeof(share::Ledger) / 2);
  }
  {
    // Overlay: byte 0 odd, then the bytes from `total`: a total, the futex word, and slot 0 live.
    std::vector<unsigned char> in{1};
    append(&in, std::uint64_t{5} << 30);
    append(&in, std::uint32_t{3});
    append(&in, std::uint32_t{0});
    append(&in, std::uint32_t{share::kSlotLive});
    append(&in, std::int32_t{31337});
    put(t, "seed_overlay_slot0_live", in);
  }
}

// ---- share_record: a whole record is read as it is (pid from its header); a shorter input with
// an odd first byte is laid over a valid record from `devices` on.

std::unique_ptr<share::ProcRecord> record(std::uint32_t devices) {
  auto r = std::make_unique<share::ProcRecord>();
  r->magic = share::kRecordMagic;
  r->version = share::kRecordVersion;
  r->size = sizeof(share::ProcRecord);
  r->pid = 4242;
  r->devices = devices;
  r->start_time = 1'000'000;
  r->pid_ns = 4026531836;
  r->updated_unix_ns = 1'700'000'000'000'000'000;
  std::snprintf(r->command, sizeof r->command, "python train.py --epochs 3");
  std::snprintf(r->group, sizeof r->group, "train");
  for (std::uint32_t i = 0; i < devices && i < share::kRecordDevices; ++i) {
    share::RecordDevice& d = r->dev[i];
    d.device = static_cast<std::int32_t>(i);
    d.reserved = std::uint64_t{8} << 30;
    d.allocated = std::uint64_t{6} << 30;
    d.cached = d.reserved - d.allocated;
    d.peak_reserved = std::uint64_t{9} << 30;
    d.group_budget = std::uint64_t{40} << 30;
    d.group_reserved = std::uint64_t{20} << 30;
  }
  return r;
}

void put_record(const std::string& name, const share::ProcRecord& r, std::size_t bytes = sizeof(share::ProcRecord)) {
  auto out = std::make_unique<share::ProcRecord>();
  std::string why;
  expect("share_record", name, share::parse_record(&r, bytes, r.pid, out.get(), &why), why);
  put("share_record", name, &r, bytes);
}

void record_seeds() {
  const std::string t = "share_record";
  put_record("seed_no_device", *record(0));
  put_record("seed_two_devices", *record(2));
  put_record("seed_every_device", *record(share::kRecordDevices));
  {
    auto r = record(1);
    std::memset(r->command, 0xff, sizeof r->command);  // not UTF-8, no NUL
    std::memset(r->group, '\x1b', sizeof r->group);    // escape bytes, no NUL
    put_record("seed_strings_without_nul", *r);
  }
  {
    auto r = record(1);  // parked, with its counts; the reason text without its NUL
    r->parked = 1;
    r->parkable = share::kRecordParkNotNow;
    r->parked_bytes = std::uint64_t{6} << 30;
    r->parks = 3;
    r->unparks = 2;
    r->park_bytes_out = std::uint64_t{18} << 30;
    r->park_bytes_in = std::uint64_t{12} << 30;
    r->park_ns = 4'000'000'000;
    r->unpark_ns = 3'000'000'000;
    std::memset(r->park_why, '\x9b', sizeof r->park_why);
    put_record("seed_parked", *r);
  }
  put_record("edge_too_many_devices", *record(share::kRecordDevices + 1));
  {
    auto r = record(1);
    r->version = share::kRecordVersion + 1;
    put_record("edge_next_version", *r);
  }
  {
    auto r = record(1);
    r->size = 16;
    put_record("edge_header_size", *r);
  }
  {
    auto r = record(1);
    r->seq.store(7);  // odd: the owner was writing
    put_record("seed_odd_seq", *r);
  }
  put_record("edge_truncated", *record(2), offsetof(share::ProcRecord, dev));
  {
    std::vector<unsigned char> in{1};
    append(&in, std::uint32_t{2});  // devices
    put(t, "seed_overlay_two_devices", in);
  }
}

// ---- shim_ipc_wire: a handle (64 bytes), a request, a reply; then for a classic block the
// segment's size (8 bytes), for an expandable one unit batches, each followed by its descriptor
// count (1 byte).

ipc::Handle handle(ipc::Kind kind, std::uint64_t size) {
  ipc::Handle h{};
  std::memcpy(h.marker, ipc::kMarker, sizeof h.marker);
  h.version = ipc::kVersion;
  h.kind = kind;
  h.pid = 4242;
  h.uid = kUid;
  h.nonce = 0x0123456789abcdefull;
  h.id = 7;
  h.size = size;
  return h;
}
ipc::Reply reply(ipc::Kind kind, std::uint64_t size, std::uint64_t offset, std::uint32_t units) {
  ipc::Reply r;
  r.status = ipc::Status::ok;
  r.kind = kind;
  r.size = size;
  r.offset = offset;
  r.units = units;
  return r;
}
std::vector<unsigned char> exchange(const ipc::Handle& h, const ipc::Request& req, const ipc::Reply& rep) {
  std::vector<unsigned char> in;
  ipc::CUipcMemHandle raw{};
  ipc::encode(h, &raw);
  append(&in, raw);
  append(&in, req);
  append(&in, rep);
  return in;
}
void batch(std::vector<unsigned char>* in, std::uint32_t count, std::uint64_t unit_bytes, std::uint8_t fds) {
  ipc::UnitBatch b;
  b.count = count;
  for (std::uint32_t i = 0; i < count && i < ipc::kUnitsPerMessage; ++i) b.bytes[i] = unit_bytes;
  append(in, b);
  append(in, fds);
}

// What the importer (and, for the request, the exporter) says of an input laid out as the fuzz
// target reads it: "" when every check passes (a refusal status is a well-formed answer too).
std::string wire_why(const std::vector<unsigned char>& in) {
  std::size_t at = 0;
  auto take = [&](void* out, std::size_t n) {
    std::memset(out, 0, n);
    const std::size_t k = at < in.size() ? std::min(n, in.size() - at) : 0;
    if (k > 0) std::memcpy(out, in.data() + at, k);
    at += n;
    return k == n;
  };
  ipc::CUipcMemHandle raw{};
  ipc::Handle h{};
  take(&raw, sizeof raw);
  if (!ipc::decode(raw, &h)) return "not a handle of the shim";
  ipc::Request req;
  ipc::Reply rep;
  if (!take(&req, sizeof req) || !take(&rep, sizeof rep)) return "cut short";
  if (std::string why = ipc::check_request(req); !why.empty()) return "request: " + why;
  if (std::string why = ipc::check_reply(h, rep); !why.empty()) return why;
  if (rep.status != ipc::Status::ok) return {};
  if (rep.kind == ipc::Kind::classic) {
    std::uint64_t range = 0;
    if (!take(&range, sizeof range)) return "cut short";
    return ipc::check_inside(rep.offset, rep.size, range);
  }
  std::vector<std::uint64_t> sizes;
  std::uint64_t total = 0;
  while (sizes.size() < rep.units) {
    ipc::UnitBatch b;
    std::uint8_t nfds = 0;
    if (!take(&b, sizeof b) || !take(&nfds, 1)) return "cut short";
    if (std::string why = ipc::add_units(b, nfds, rep.units - static_cast<std::uint32_t>(sizes.size()), &sizes, &total);
        !why.empty())
      return why;
  }
  return ipc::check_inside(rep.offset, rep.size, total);
}
void put_wire(const std::string& name, const std::vector<unsigned char>& in) {
  const std::string why = wire_why(in);
  expect("shim_ipc_wire", name, why.empty(), why);
  put("shim_ipc_wire", name, in);
}

void wire_seeds() {
  const std::string t = "shim_ipc_wire";
  constexpr std::uint64_t kMiB = 1 << 20;
  ipc::Request open;
  ipc::Request release;
  release.op = ipc::Op::release;
  {
    auto in = exchange(handle(ipc::Kind::classic, 4096), open, reply(ipc::Kind::classic, 4096, 8192, 0));
    append(&in, std::uint64_t{2 * kMiB});  // the segment: the block lies inside
    put_wire("seed_classic_inside", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::classic, 4096), release, reply(ipc::Kind::classic, 4096, ~0ull - 2047, 0));
    append(&in, std::uint64_t{2 * kMiB});  // offset + size wraps
    put_wire("edge_classic_offset_wraps", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::classic, 4096), open, reply(ipc::Kind::classic, 4096, 2 * kMiB - 4095, 0));
    append(&in, std::uint64_t{2 * kMiB});  // one byte past the segment's end
    put_wire("edge_classic_one_byte_past", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::expandable, 6 * kMiB), open, reply(ipc::Kind::expandable, 6 * kMiB, kMiB, 4));
    batch(&in, 4, 2 * kMiB, 4);  // 8 MiB of units, the block at 1 MiB
    put_wire("seed_expandable_one_batch", in);
  }
  {
    constexpr std::uint32_t units = ipc::kUnitsPerMessage + 2;
    auto in = exchange(handle(ipc::Kind::expandable, 64 * kMiB), open,
                       reply(ipc::Kind::expandable, 64 * kMiB, 0, units));
    batch(&in, ipc::kUnitsPerMessage, 2 * kMiB, static_cast<std::uint8_t>(ipc::kUnitsPerMessage));
    batch(&in, 2, 2 * kMiB, 2);
    put_wire("seed_expandable_two_batches", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::expandable, 4096), open, reply(ipc::Kind::expandable, 4096, 0, 2));
    batch(&in, 2, 2 * kMiB, 1);  // two units, one descriptor
    put_wire("edge_expandable_descriptor_missing", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::expandable, 4096), open, reply(ipc::Kind::expandable, 4096, 0, 2));
    batch(&in, 2, ipc::kMaxMappedBytes - 1, 2);  // the units' total passes any device
    put_wire("edge_expandable_units_overflow", in);
  }
  {
    auto in = exchange(handle(ipc::Kind::classic, 4096), open, reply(ipc::Kind::expandable, 4096, 0, 1));
    put_wire("edge_kind_not_the_handles", in);
  }
  {
    ipc::Reply r = reply(ipc::Kind::classic, 0, 0, 0);
    r.status = ipc::Status::busy;
    put_wire("seed_busy", exchange(handle(ipc::Kind::classic, 4096), open, r));
  }
  {
    ipc::Request bad;
    bad.magic = 0;
    bad.op = static_cast<ipc::Op>(9);
    ipc::Reply r = reply(ipc::Kind::classic, 4096, 0, 0);
    r.status = static_cast<ipc::Status>(42);
    put_wire("edge_unknown_op_and_status", exchange(handle(ipc::Kind::classic, 4096), bad, r));
  }
  {
    std::vector<unsigned char> driver(sizeof(ipc::CUipcMemHandle), 0x5a);  // a driver's own handle: no marker
    put_wire("edge_driver_handle", driver);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (writes CORPUS_DIR/<target>/seed_* and edge_*)\n", argv[0]);
    return 64;
  }
  g_root = argv[1];
  ledger_seeds();
  record_seeds();
  wire_seeds();
  return g_failed == 0 ? 0 : 1;
}
