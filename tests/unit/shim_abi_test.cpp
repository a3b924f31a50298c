// shim/cuda_abi.h declares CUDA driver values by hand (CI has no toolkit). When the real
// cuda.h is on this machine, every value must match it.
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include <gtest/gtest.h>

#include "shim/cuda_abi.h"

namespace {
// Parameter lists of two function pointer types (the shim returns CUresult as int, cuda.h as an
// enum of the same size, so return types are compared by size).
template <typename F>
struct Sig;
template <typename R, typename... A>
struct Sig<R (*)(A...)> {
  using Args = std::tuple<A...>;
  static constexpr std::size_t kRetSize = sizeof(R);
};
template <typename Ours, typename Theirs>
constexpr bool same_abi = std::is_same_v<typename Sig<Ours>::Args, typename Sig<Theirs>::Args>&& Sig<Ours>::kRetSize ==
                          Sig<Theirs>::kRetSize;

// Taken before cuda.h is included: it defines CU_STREAM_LEGACY/PER_THREAD as macros.
const std::uintptr_t kOurLegacy = reinterpret_cast<std::uintptr_t>(cudaabi::CU_STREAM_LEGACY);
const std::uintptr_t kOurPerThread = reinterpret_cast<std::uintptr_t>(cudaabi::CU_STREAM_PER_THREAD);
}  // namespace

#if __has_include(</usr/local/cuda/include/cuda.h>)
#include </usr/local/cuda/include/cuda.h>
#define HAVE_CUDA_H 1
#endif

namespace {

TEST(ShimAbi, ValuesMatchCudaH) {
#ifndef HAVE_CUDA_H
  GTEST_SKIP() << "no /usr/local/cuda/include/cuda.h on this machine";
#else
  namespace a = cudaabi;
  static_assert(CUDA_VERSION >= 12000, "compared against CUDA 12+ headers");
  static_assert(a::CUDA_SUCCESS == ::CUDA_SUCCESS);
  static_assert(a::CUDA_ERROR_INVALID_VALUE == ::CUDA_ERROR_INVALID_VALUE);
  static_assert(a::CUDA_ERROR_OUT_OF_MEMORY == ::CUDA_ERROR_OUT_OF_MEMORY);
  static_assert(a::CUDA_ERROR_NOT_INITIALIZED == ::CUDA_ERROR_NOT_INITIALIZED);
  static_assert(a::CUDA_ERROR_INVALID_CONTEXT == ::CUDA_ERROR_INVALID_CONTEXT);
  static_assert(a::CUDA_ERROR_INVALID_HANDLE == ::CUDA_ERROR_INVALID_HANDLE);
  static_assert(a::CUDA_ERROR_NOT_FOUND == ::CUDA_ERROR_NOT_FOUND);
  static_assert(a::CUDA_ERROR_NOT_PERMITTED == ::CUDA_ERROR_NOT_PERMITTED);
  static_assert(a::kIpcHandleSize == CU_IPC_HANDLE_SIZE && sizeof(a::CUipcMemHandle) == sizeof(::CUipcMemHandle));
  {  // the handle is our own struct of the same size, passed by value
    using Ours = Sig<a::PFN_cuIpcOpenMemHandle_v2>::Args;
    using Theirs = Sig<decltype(&::cuIpcOpenMemHandle_v2)>::Args;
    static_assert(std::tuple_size_v<Ours> == 3 && std::tuple_size_v<Theirs> == 3);
    static_assert(sizeof(std::tuple_element_t<0, Ours>) == sizeof(std::tuple_element_t<0, Theirs>));
    static_assert(sizeof(std::tuple_element_t<1, Ours>) == sizeof(std::tuple_element_t<1, Theirs>));
    static_assert(std::is_same_v<std::tuple_element_t<2, Ours>, std::tuple_element_t<2, Theirs> >);
  }
  static_assert(same_abi<a::PFN_cuIpcCloseMemHandle, decltype(&::cuIpcCloseMemHandle)>);
  static_assert(a::CUDA_ERROR_NOT_READY == ::CUDA_ERROR_NOT_READY);
  static_assert(a::CUDA_ERROR_CONTEXT_IS_DESTROYED == ::CUDA_ERROR_CONTEXT_IS_DESTROYED);
  static_assert(a::CUDA_ERROR_NOT_SUPPORTED == ::CUDA_ERROR_NOT_SUPPORTED);
  static_assert(a::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED == ::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  static_assert(a::CU_STREAM_NON_BLOCKING == ::CU_STREAM_NON_BLOCKING);
  static_assert(a::CU_EVENT_DISABLE_TIMING == ::CU_EVENT_DISABLE_TIMING);
  static_assert(a::CU_GET_PROC_ADDRESS_DEFAULT == ::CU_GET_PROC_ADDRESS_DEFAULT);
  static_assert(a::CU_GET_PROC_ADDRESS_LEGACY_STREAM == ::CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  static_assert(a::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM == ::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  static_assert(a::CU_GET_PROC_ADDRESS_SUCCESS == ::CU_GET_PROC_ADDRESS_SUCCESS);
  static_assert(a::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND == ::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  static_assert(a::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT == ::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  static_assert(a::CU_STREAM_CAPTURE_STATUS_NONE == ::CU_STREAM_CAPTURE_STATUS_NONE);
  static_assert(a::CU_STREAM_CAPTURE_STATUS_ACTIVE == ::CU_STREAM_CAPTURE_STATUS_ACTIVE);
  static_assert(a::CU_STREAM_CAPTURE_STATUS_INVALIDATED == ::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  static_assert(a::CU_STREAM_CAPTURE_MODE_GLOBAL == ::CU_STREAM_CAPTURE_MODE_GLOBAL);
  static_assert(a::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL == ::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  static_assert(a::CU_STREAM_CAPTURE_MODE_RELAXED == ::CU_STREAM_CAPTURE_MODE_RELAXED);
  static_assert(a::CU_POINTER_ATTRIBUTE_CONTEXT == ::CU_POINTER_ATTRIBUTE_CONTEXT);
  static_assert(a::CU_POINTER_ATTRIBUTE_MEMORY_TYPE == ::CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
  static_assert(a::CU_POINTER_ATTRIBUTE_DEVICE_POINTER == ::CU_POINTER_ATTRIBUTE_DEVICE_POINTER);
  static_assert(a::CU_POINTER_ATTRIBUTE_IS_MANAGED == ::CU_POINTER_ATTRIBUTE_IS_MANAGED);
  static_assert(a::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == ::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
  static_assert(a::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ==
                ::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE);
  static_assert(a::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR == ::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
  static_assert(a::CU_POINTER_ATTRIBUTE_RANGE_SIZE == ::CU_POINTER_ATTRIBUTE_RANGE_SIZE);
  static_assert(a::CU_POINTER_ATTRIBUTE_MAPPED == ::CU_POINTER_ATTRIBUTE_MAPPED);
  static_assert(a::CU_MEMORYTYPE_DEVICE == ::CU_MEMORYTYPE_DEVICE);
  static_assert(a::kIpcHandleSize == CU_IPC_HANDLE_SIZE);
  static_assert(sizeof(a::CUipcMemHandle) == sizeof(::CUipcMemHandle));
  static_assert(std::is_same_v<a::CUdeviceptr, ::CUdeviceptr>);
  static_assert(std::is_same_v<a::CUdevice, ::CUdevice>);
  static_assert(std::is_same_v<a::cuuint64_t, ::cuuint64_t>);
  // Enum parameters are passed as int by the shim: same size and sign.
  static_assert(sizeof(::CUresult) == sizeof(a::CUresult));
  static_assert(sizeof(::CUpointer_attribute) == sizeof(a::CUpointer_attribute));
  static_assert(sizeof(::CUstreamCaptureMode) == sizeof(a::CUstreamCaptureMode));
  static_assert(sizeof(::CUstreamCaptureStatus) == sizeof(a::CUstreamCaptureStatus));
  static_assert(sizeof(::CUdriverProcAddressQueryResult) == sizeof(a::CUdriverProcAddressQueryResult));
  // Signatures without enum parameters must be exactly the header's.
  static_assert(same_abi<a::PFN_cuMemAlloc_v2, decltype(&::cuMemAlloc_v2)>);
  static_assert(same_abi<a::PFN_cuMemFree_v2, decltype(&::cuMemFree_v2)>);
  static_assert(same_abi<a::PFN_cuMemAllocPitch_v2, decltype(&::cuMemAllocPitch_v2)>);
  static_assert(same_abi<a::PFN_cuMemGetInfo_v2, decltype(&::cuMemGetInfo_v2)>);
  static_assert(same_abi<a::PFN_cuMemGetAddressRange_v2, decltype(&::cuMemGetAddressRange_v2)>);
  static_assert(same_abi<a::PFN_cuDevicePrimaryCtxReset_v2, decltype(&::cuDevicePrimaryCtxReset_v2)>);
  static_assert(same_abi<a::PFN_cuDevicePrimaryCtxRelease_v2, decltype(&::cuDevicePrimaryCtxRelease_v2)>);
  static_assert(same_abi<a::PFN_cuDevicePrimaryCtxGetState, decltype(&::cuDevicePrimaryCtxGetState)>);
  // VMM (expandable segments): values, struct layouts, signatures.
  static_assert(a::CU_MEM_ALLOCATION_TYPE_PINNED == ::CU_MEM_ALLOCATION_TYPE_PINNED);
  static_assert(a::CU_MEM_HANDLE_TYPE_NONE == ::CU_MEM_HANDLE_TYPE_NONE);
  static_assert(a::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == ::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  static_assert(sizeof(::CUmemAllocationHandleType) == sizeof(int));
  static_assert(sizeof(::CUmemRangeHandleType) == sizeof(a::CUmemRangeHandleType));
  static_assert(a::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == ::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);
  static_assert(a::CU_MEM_LOCATION_TYPE_DEVICE == ::CU_MEM_LOCATION_TYPE_DEVICE);
  static_assert(a::CU_MEM_ACCESS_FLAGS_PROT_READWRITE == ::CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  static_assert(a::CU_MEM_ALLOC_GRANULARITY_MINIMUM == ::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  static_assert(a::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED == ::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  static_assert(std::is_same_v<a::CUmemGenericAllocationHandle, ::CUmemGenericAllocationHandle>);
  static_assert(sizeof(::CUmemAllocationType) == sizeof(int) && sizeof(::CUmemLocationType) == sizeof(int));
  static_assert(sizeof(::CUmemAccess_flags) == sizeof(int) &&
                sizeof(::CUmemAllocationGranularity_flags) == sizeof(int));
  static_assert(sizeof(a::CUmemLocation) == sizeof(::CUmemLocation));
  static_assert(offsetof(a::CUmemLocation, id) == offsetof(::CUmemLocation, id));
  static_assert(sizeof(a::CUmemAllocationProp) == sizeof(::CUmemAllocationProp));
  static_assert(offsetof(a::CUmemAllocationProp, requestedHandleTypes) ==
                offsetof(::CUmemAllocationProp, requestedHandleTypes));
  static_assert(offsetof(a::CUmemAllocationProp, location) == offsetof(::CUmemAllocationProp, location));
  static_assert(offsetof(a::CUmemAllocationProp, win32HandleMetaData) ==
                offsetof(::CUmemAllocationProp, win32HandleMetaData));
  static_assert(offsetof(a::CUmemAllocationProp, allocFlags) == offsetof(::CUmemAllocationProp, allocFlags));
  static_assert(sizeof(a::CUmemAccessDesc) == sizeof(::CUmemAccessDesc));
  static_assert(offsetof(a::CUmemAccessDesc, flags) == offsetof(::CUmemAccessDesc, flags));
  static_assert(same_abi<a::PFN_cuMemAddressReserve, decltype(&::cuMemAddressReserve)>);
  static_assert(same_abi<a::PFN_cuMemAddressFree, decltype(&::cuMemAddressFree)>);
  static_assert(same_abi<a::PFN_cuMemRelease, decltype(&::cuMemRelease)>);
  static_assert(std::is_same_v<std::tuple_element_t<0, Sig<decltype(&::cuMemExportToShareableHandle)>::Args>, void*>);
  static_assert(std::is_same_v<std::tuple_element_t<1, Sig<decltype(&::cuMemImportFromShareableHandle)>::Args>, void*>);
  static_assert(same_abi<a::PFN_cuMemMap, decltype(&::cuMemMap)>);
  static_assert(same_abi<a::PFN_cuMemUnmap, decltype(&::cuMemUnmap)>);
  static_assert(same_abi<a::PFN_cuCtxSynchronize, decltype(&::cuCtxSynchronize)>);
  EXPECT_EQ(kOurLegacy, reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY));
  EXPECT_EQ(kOurPerThread, reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD));
#endif
}

}  // namespace
