// The real-driver table (shim/driver.h) against the fake libcuda.so.1: every row of the one list
// of entry points, shim/entry_points.def, has its field, and the field holds exactly what the
// library exports under that name. Linked with shim/driver.o itself, no preload.
#include <dlfcn.h>

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shim/driver.h"

namespace {

using cudapool::shim::RealDriver;

struct Row {
  const char* name;
  void* bound;  // the table's field
};

std::vector<Row> rows_of(const RealDriver& d) {
  return {
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) {#abi, reinterpret_cast<void*>(d.abi)},
#define CUDAPOOL_CALLED(abi, params) {#abi, reinterpret_cast<void*>(d.abi)},
#include "shim/entry_points.def"
  };
}

constexpr std::size_t kListed = 0
#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) +1
#define CUDAPOOL_CALLED(abi, params) +1
#include "shim/entry_points.def"
    ;

// The table holds the library handle and one function pointer per row, nothing else: a field
// added by hand beside the list (and so never bound) changes its size.
static_assert(sizeof(RealDriver) == sizeof(void*) * (1 + kListed),
              "RealDriver has a field that is not a row of shim/entry_points.def");

TEST(ShimDriver, EveryListedEntryPointIsBoundToTheLibrarysOwn) {
  // Loaded first by its path, as a -lcuda program has it: the table must take this copy.
  void* lib = dlopen(CUDAPOOL_FAKECUDA_DIR "/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const RealDriver* d = cudapool::shim::real_driver();
  ASSERT_NE(d, nullptr) << "the fake driver lacks an entry point the pool cannot do without";
  EXPECT_EQ(d->handle, lib);
  const std::vector<Row> rows = rows_of(*d);
  ASSERT_EQ(rows.size(), kListed);
  std::set<std::string> names;
  for (const Row& r : rows) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name << " is listed twice in shim/entry_points.def";
    void* exported = dlsym(lib, r.name);
    ASSERT_NE(exported, nullptr) << "the fake libcuda.so.1 does not export " << r.name
                                 << ": add it to tests/fakecuda/fakecuda.cpp";
    EXPECT_EQ(r.bound, exported) << r.name << " is listed but its field is not bound to the driver's own";
  }
  // The accessors pick the newer form where the driver has both.
  EXPECT_EQ(reinterpret_cast<void*>(d->ipc_open_mem_handle()), dlsym(lib, "cuIpcOpenMemHandle_v2"));
  EXPECT_EQ(reinterpret_cast<void*>(d->device_get_uuid()), dlsym(lib, "cuDeviceGetUuid_v2"));
  EXPECT_TRUE(d->has_vmm());
}

}  // namespace
