// The doors: a wrapper for every CUDAPOOL_DOOR row of shim/entry_points.def, each made by the
// macro below from its row alone: pass the parking door (shim/parking/parking.h), call the real entry
// point, leave the door. With nothing parked the door costs a few loads and stores of the
// thread's own slot; a parked process is restored first, and a restore that cannot get its
// memory back fails the call with the restore's error instead of letting the GPU fault.
#include <climits>

#include "shim/driver.h"
#include "shim/hooks/hooked.h"
#include "shim/parking/parking.h"

namespace {

// Parameter lists with names, from a row's list of types: (A, B) -> (A a0, B a1) and (a0, a1).
#define CUDAPOOL_DOOR_NARGS(...) \
  CUDAPOOL_DOOR_NARGS_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define CUDAPOOL_DOOR_NARGS_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, ...) n
#define CUDAPOOL_DOOR_CAT(a, b) CUDAPOOL_DOOR_CAT_(a, b)
#define CUDAPOOL_DOOR_CAT_(a, b) a##b
#define CUDAPOOL_DOOR_NAMED(...) CUDAPOOL_DOOR_CAT(CUDAPOOL_DOOR_NAMED_, CUDAPOOL_DOOR_NARGS(__VA_ARGS__))(__VA_ARGS__)
#define CUDAPOOL_DOOR_ARGS(...) CUDAPOOL_DOOR_CAT(CUDAPOOL_DOOR_ARGS_, CUDAPOOL_DOOR_NARGS(__VA_ARGS__))
#define CUDAPOOL_DOOR_NAMED_1(t0) t0 a0
#define CUDAPOOL_DOOR_NAMED_2(t0, t1) t0 a0, t1 a1
#define CUDAPOOL_DOOR_NAMED_3(t0, t1, t2) t0 a0, t1 a1, t2 a2
#define CUDAPOOL_DOOR_NAMED_4(t0, t1, t2, t3) t0 a0, t1 a1, t2 a2, t3 a3
#define CUDAPOOL_DOOR_NAMED_5(t0, t1, t2, t3, t4) t0 a0, t1 a1, t2 a2, t3 a3, t4 a4
#define CUDAPOOL_DOOR_NAMED_6(t0, t1, t2, t3, t4, t5) t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5
#define CUDAPOOL_DOOR_NAMED_7(t0, t1, t2, t3, t4, t5, t6) t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5, t6 a6
#define CUDAPOOL_DOOR_NAMED_8(t0, t1, t2, t3, t4, t5, t6, t7) t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5, t6 a6, t7 a7
#define CUDAPOOL_DOOR_NAMED_9(t0, t1, t2, t3, t4, t5, t6, t7, t8) \
  t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5, t6 a6, t7 a7, t8 a8
#define CUDAPOOL_DOOR_NAMED_10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9) \
  t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5, t6 a6, t7 a7, t8 a8, t9 a9
#define CUDAPOOL_DOOR_NAMED_11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10) \
  t0 a0, t1 a1, t2 a2, t3 a3, t4 a4, t5 a5, t6 a6, t7 a7, t8 a8, t9 a9, t10 a10
#define CUDAPOOL_DOOR_ARGS_1 a0
#define CUDAPOOL_DOOR_ARGS_2 a0, a1
#define CUDAPOOL_DOOR_ARGS_3 a0, a1, a2
#define CUDAPOOL_DOOR_ARGS_4 a0, a1, a2, a3
#define CUDAPOOL_DOOR_ARGS_5 a0, a1, a2, a3, a4
#define CUDAPOOL_DOOR_ARGS_6 a0, a1, a2, a3, a4, a5
#define CUDAPOOL_DOOR_ARGS_7 a0, a1, a2, a3, a4, a5, a6
#define CUDAPOOL_DOOR_ARGS_8 a0, a1, a2, a3, a4, a5, a6, a7
#define CUDAPOOL_DOOR_ARGS_9 a0, a1, a2, a3, a4, a5, a6, a7, a8
#define CUDAPOOL_DOOR_ARGS_10 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9
#define CUDAPOOL_DOOR_ARGS_11 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10

using cudapool::shim::real_driver_inline;
using cudapool::shim::RealDriver;
namespace park = cudapool::shim::park;

}  // namespace

// One wrapper per row. Without the driver or without the name in it: what a call of a missing
// entry point would get.
#define CUDAPOOL_DOOR(base, min_version, max_version, flavour, abi, params) \
  CUDAPOOL_EXPORT CUresult abi(CUDAPOOL_DOOR_NAMED params) {                \
    const RealDriver* d = real_driver_inline();                             \
    if (d == nullptr) [[unlikely]]                                          \
      return CUDA_ERROR_NOT_INITIALIZED;                                    \
    if (d->abi == nullptr) [[unlikely]]                                     \
      return CUDA_ERROR_NOT_FOUND;                                          \
    if (const int r = park::door_enter(); r != 0) [[unlikely]]              \
      return r;                                                             \
    const CUresult r = d->abi(CUDAPOOL_DOOR_ARGS params);                   \
    park::door_leave();                                                     \
    return r;                                                               \
  }
#include "shim/entry_points.def"
