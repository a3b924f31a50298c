// libFuzzer target: the group ledger reader (share::parse_ledger) on arbitrary bytes, as
// `cudapool top` reads a ledger file another process of the user may have written anything into.
// An accepted ledger has this layout's header and names that fit their fields; its live slots
// are at most the slot count, in order; a refusal says why.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "shim/group/group_ledger_layout.h"
#include "telemetry/share.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool::share;
  // The header's uid is taken from the input when it is long enough, so valid headers are
  // reachable; the rest of a short input stays short (a truncated file).
  unsigned uid = 0;
  if (size >= offsetof(Ledger, uid) + sizeof uid) std::memcpy(&uid, data + offsetof(Ledger, uid), sizeof uid);
  // Inputs are usually smaller than a ledger: the bytes given are laid over a valid header, so
  // that the slots get exercised too (and as they are, when the size is already right).
  std::vector<unsigned char> buf;
  if (size == sizeof(Ledger)) {
    buf.assign(data, data + size);
  } else if (size > 0 && (data[0] & 1) != 0 && size < sizeof(Ledger)) {
    auto base = std::make_unique<Ledger>();
    init_ledger(*base, 1000, "GPU-fuzz", "g", 1 << 20);
    buf.assign(reinterpret_cast<unsigned char*>(base.get()),
               reinterpret_cast<unsigned char*>(base.get()) + sizeof(Ledger));
    std::memcpy(buf.data() + offsetof(Ledger, total), data + 1,
                std::min(size - 1, sizeof(Ledger) - offsetof(Ledger, total)));
    uid = 1000;
  } else {
    buf.assign(data, data + size);
  }
  LedgerView v;
  std::string why;
  if (!parse_ledger(buf.data(), buf.size(), uid, &v, &why)) {
    if (why.empty()) {
      std::fprintf(stderr, "refused without a reason\n");
      std::abort();
    }
    return 0;
  }
  if (buf.size() != sizeof(Ledger) || v.budget == 0 || v.group.size() >= kNameBytes || v.gpu.size() >= kNameBytes ||
      v.live.size() > kLedgerSlots) {
    std::fprintf(stderr, "accepted a ledger outside its bounds\n");
    std::abort();
  }
  for (std::size_t i = 0; i < v.live.size(); ++i) {
    if (v.live[i].slot < 0 || v.live[i].slot >= static_cast<int>(kLedgerSlots) ||
        (i > 0 && v.live[i].slot <= v.live[i - 1].slot) || v.live[i].park_why.size() > kNameBytes) {
      std::fprintf(stderr, "slot index out of order or bounds, or a text past its field\n");
      std::abort();
    }
  }
  return 0;
}
