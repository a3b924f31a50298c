// Marks the few symbols libcudapool.so exports: the wrappers of shim/entry_points.def and the C API
// (the version script made from shim/exports.map.in exports exactly those).
#pragma once
#define CUDAPOOL_EXPORT extern "C" __attribute__((visibility("default")))
