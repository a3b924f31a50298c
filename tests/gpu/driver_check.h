// Shared by the GPU programs that call the driver API themselves (driver_api.cpp,
// fence_costs.cpp, vmm_costs.cu): the check of a driver call, device 0's primary context made
// current, and a microsecond clock.
#pragma once
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

// A driver call that must succeed: otherwise its name, error and place on stderr, exit status 2.
#define CKD(expr)                                                                                         \
  do {                                                                                                    \
    CUresult ck_rc_ = (expr);                                                                             \
    if (ck_rc_ != CUDA_SUCCESS) {                                                                         \
      const char* ck_s_ = nullptr;                                                                        \
      cuGetErrorString(ck_rc_, &ck_s_);                                                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #expr, ck_s_ ? ck_s_ : "?", \
                   static_cast<int>(ck_rc_));                                                             \
      std::exit(2);                                                                                       \
    }                                                                                                     \
  } while (0)

// cuInit, then device 0's primary context retained and made current; its device in *dev.
inline CUcontext use_primary_context(CUdevice* dev) {
  CKD(cuInit(0));
  CKD(cuDeviceGet(dev, 0));
  CUcontext ctx = nullptr;
  CKD(cuDevicePrimaryCtxRetain(&ctx, *dev));
  CKD(cuCtxSetCurrent(ctx));
  return ctx;
}

inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
