// The fake shared cudart (tests/fakecuda/fakecudart.cpp, built as libcudart.so.13): the few
// runtime entry points it defines, with cudart's own names and signatures, and its counter.
#pragma once
#include <cstddef>

using cudaError_t = int;  // cudart's enum; the fake answers only the values below
inline constexpr cudaError_t cudaSuccess = 0;
inline constexpr cudaError_t cudaErrorInvalidValue = 1;
inline constexpr cudaError_t cudaErrorMemoryAllocation = 2;
inline constexpr cudaError_t cudaErrorUnknown = 999;

extern "C" {
cudaError_t cudaMalloc(void** dev_ptr, std::size_t size);
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
// 13000, or the integer in FAKE_CUDART_VERSION (11080: CUDA 11.8's lazy cudaSetDevice).
cudaError_t cudaRuntimeGetVersion(int* version);

// How many times the fake's own cudaMalloc / cudaFree ran in this process ("cudaMalloc",
// "cudaFree"); -1 for any other name. What the shim answered itself never gets here.
long fakecudart_calls(const char* name);
}
