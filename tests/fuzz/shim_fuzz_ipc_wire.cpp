// libFuzzer target: what a CUDA IPC importer and exporter accept from their peer (shim/ipc/ipc_wire.h)
// on arbitrary bytes: a handle, a reply to `open`, its unit batches, a request. Whatever the
// checks accept must describe a block the importer can map: inside the bytes received for it,
// with no wrap-around, of the size and kind its handle names.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shim/ipc/ipc_wire.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

// The next `n` bytes of the input (zeros once it runs out).
struct Bytes {
  const unsigned char* p;
  std::size_t left;
  void take(void* out, std::size_t n) {
    const std::size_t k = n < left ? n : left;
    std::memset(out, 0, n);
    std::memcpy(out, p, k);
    p += k;
    left -= k;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool::shim::ipc;
  Bytes in{data, size};
  CUipcMemHandle raw{};
  in.take(&raw, sizeof raw);
  Handle h{};
  const bool ours = decode(raw, &h);
  if (ours && (std::memcmp(h.marker, kMarker, sizeof kMarker) != 0 || h.version != kVersion))
    fail("decode accepted bytes without the marker");
  Request req;
  in.take(&req, sizeof req);
  if (check_request(req).empty() && (req.magic != kWireMagic || (req.op != Op::open && req.op != Op::release)))
    fail("check_request accepted a bad request");
  Reply rep;
  in.take(&rep, sizeof rep);
  if (!check_reply(h, rep).empty() || rep.status != Status::ok) return 0;
  if (rep.kind != h.kind || rep.size != h.size || rep.size == 0) fail("reply does not match its handle");
  if (rep.kind == Kind::classic) {
    if (rep.units != 0) fail("classic reply with units");
    std::uint64_t range = 0;
    in.take(&range, sizeof range);
    if (check_inside(rep.offset, rep.size, range).empty() &&
        static_cast<unsigned __int128>(rep.offset) + rep.size > range)
      fail("check_inside accepted a block outside its segment");
    return 0;
  }
  if (rep.kind != Kind::expandable || rep.units == 0 || rep.units > kMaxUnits) fail("bad expandable reply accepted");
  std::vector<std::uint64_t> sizes;
  std::uint64_t total = 0;
  while (sizes.size() < rep.units) {
    if (in.left == 0) return 0;  // the importer's receive would time out
    UnitBatch b;
    in.take(&b, sizeof b);
    std::uint8_t nfds = 0;
    in.take(&nfds, 1);
    const std::size_t before = sizes.size();
    if (!add_units(b, nfds, rep.units - static_cast<std::uint32_t>(sizes.size()), &sizes, &total).empty()) return 0;
    if (sizes.size() - before != nfds || sizes.size() > rep.units) fail("add_units kept a bad batch");
  }
  unsigned __int128 sum = 0;
  for (std::uint64_t n : sizes) {
    if (n == 0) fail("a unit of 0 bytes accepted");
    sum += n;
  }
  if (sum != total || total > kMaxMappedBytes) fail("unit total wrong or too large");
  if (check_inside(rep.offset, rep.size, total).empty() &&
      static_cast<unsigned __int128>(rep.offset) + rep.size > total)
    fail("check_inside accepted a block outside its units");
  return 0;
}
