// The exported dlsym. cudart finds the driver with dlopen("libcuda.so.1") + dlsym(handle,
// "cuGetProcAddress_v2"); a lookup on an explicit libcuda handle never sees a preloaded
// definition, so dlsym itself must hand out the wrappers.
//
// RTLD_NEXT is relative to the *caller* (glibc reads the return address). Forwarding it from a
// C function would make the shim the caller and change the answer, so on x86-64 and AArch64 an
// assembly entry jumps (not calls) to the real dlsym for RTLD_NEXT: the caller's return address
// stays on the stack. Every other handle goes to cudapool_dlsym_hooked.
#include <dlfcn.h>

#include <cstring>

#include "shim/driver.h"
#include "shim/hooks/hooks.h"

using cudapool::shim::DlsymFn;

// Sanitizer runtimes look their interceptors up with dlsym(RTLD_NEXT, …) before their own
// initialisation is done, so the code on the dlsym path must not be instrumented (it matters
// only for sanitizer builds of the shim; release builds carry no instrumentation anyway).
#define CUDAPOOL_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

extern "C" {

__attribute__((visibility("hidden"))) void* cudapool_next_dlsym = nullptr;

__attribute__((visibility("hidden"))) CUDAPOOL_NO_SANITIZE void* cudapool_resolve_next_dlsym() {
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  __atomic_store_n(&cudapool_next_dlsym, p, __ATOMIC_RELEASE);
  return p;
}

__attribute__((visibility("hidden"))) CUDAPOOL_NO_SANITIZE void* cudapool_dlsym_hooked(void* handle, const char* name) {
  void* next = __atomic_load_n(&cudapool_next_dlsym, __ATOMIC_ACQUIRE);
  if (next == nullptr) next = cudapool_resolve_next_dlsym();
  if (next == nullptr) return nullptr;
  auto real = reinterpret_cast<DlsymFn>(next);
  void* found = real(handle, name);
  // Exact names only ("cu" prefix first, so cudnn*/cublas* lookups cost one compare).
  if (found == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return found;
  void* wrapper = cudapool::shim::wrapper_for_symbol(name);
  if (wrapper == nullptr || wrapper == found) return found;
  // Substitute only libcuda's own definition: whatever the caller's handle found elsewhere
  // (another interposer, a stub library) is theirs to keep.
  const cudapool::shim::RealDriver* d = cudapool::shim::real_driver();
  if (d == nullptr || real(d->handle, name) != found) return found;
  return wrapper;
}

}  // extern "C"

#if defined(__x86_64__)
asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    cmpq $-1, %rdi
    je 1f
    jmp cudapool_dlsym_hooked
1:
    movq cudapool_next_dlsym(%rip), %rax
    testq %rax, %rax
    jz 2f
    jmp *%rax
2:
    pushq %rdi
    pushq %rsi
    subq $8, %rsp
    call cudapool_resolve_next_dlsym
    addq $8, %rsp
    popq %rsi
    popq %rdi
    jmp *%rax
    .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
asm(R"(
    .text
    .globl dlsym
    .type dlsym, %function
    .p2align 4
dlsym:
    cmn x0, #1
    b.eq 1f
    b cudapool_dlsym_hooked
1:
    adrp x16, cudapool_next_dlsym
    ldr x16, [x16, :lo12:cudapool_next_dlsym]
    cbz x16, 2f
    br x16
2:
    stp x29, x30, [sp, #-32]!
    stp x0, x1, [sp, #16]
    bl cudapool_resolve_next_dlsym
    mov x16, x0
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #32
    br x16
    .size dlsym, .-dlsym
)");
#else
// Other architectures: RTLD_NEXT lookups are answered relative to the shim (documented).
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  if (handle == RTLD_NEXT) return cudapool::shim::real_dlsym()(handle, name);
  return cudapool_dlsym_hooked(handle, name);
}
#endif
