// Marks the few symbols libcudapool.so exports (also listed in shim/exports.map).
#pragma once
#define CUDAPOOL_EXPORT extern "C" __attribute__((visibility("default")))
