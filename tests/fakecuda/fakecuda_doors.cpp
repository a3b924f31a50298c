// Every door of shim/entry_points.def (the entry points that can make the GPU touch memory) as a
// weak stub of the fake libcuda.so.1: the shim's driver table binds every row, and the tests check
// that the library exports each. The few the tests use for real (launches, copies, sets; in
// fakecuda.cpp) are strong definitions and replace their stub. A stub answers "not supported".
#define CUDAPOOL_DOOR(base, min_version, max_version, flavour, abi, params) \
  extern "C" __attribute__((weak, visibility("default"))) int abi(...) { return 801; }
#include "shim/entry_points.def"
