// libFuzzer target: the stats record reader (share::parse_record) on arbitrary bytes, as
// `cudapool top` reads records other processes of the user write. An accepted record has this
// layout's header, the pid its file names and at most kRecordDevices devices; a refusal says why.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "telemetry/share.h"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  using namespace cudapool::share;
  std::vector<unsigned char> buf(data, data + size);
  // A short input is laid over a valid record (after its first byte), so that the checks past
  // the header are reached; an input of the record's size is taken as it is.
  int pid = 4242;
  if (size > 0 && size < sizeof(ProcRecord) && (data[0] & 1) != 0) {
    auto r = std::make_unique<ProcRecord>();
    r->magic = kRecordMagic;
    r->version = kRecordVersion;
    r->size = sizeof(ProcRecord);
    r->pid = pid;
    buf.assign(reinterpret_cast<unsigned char*>(r.get()),
               reinterpret_cast<unsigned char*>(r.get()) + sizeof(ProcRecord));
    std::memcpy(buf.data() + offsetof(ProcRecord, devices), data + 1,
                std::min(size - 1, sizeof(ProcRecord) - offsetof(ProcRecord, devices)));
  } else if (size >= offsetof(ProcRecord, pid) + sizeof pid) {
    std::memcpy(&pid, data + offsetof(ProcRecord, pid), sizeof pid);
  }
  auto out = std::make_unique<ProcRecord>();
  std::string why;
  if (!parse_record(buf.data(), buf.size(), pid, out.get(), &why)) {
    if (why.empty()) {
      std::fprintf(stderr, "refused without a reason\n");
      std::abort();
    }
    return 0;
  }
  if (buf.size() != sizeof(ProcRecord) || out->magic != kRecordMagic || out->version != kRecordVersion ||
      out->pid != pid || out->devices > kRecordDevices) {
    std::fprintf(stderr, "accepted a record outside its bounds\n");
    std::abort();
  }
  return 0;
}
