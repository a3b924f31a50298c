// The declarations of every hooked entry point's wrapper, made from shim/entry_points.def. The
// hooks_*.cpp files that define them include this, so a definition whose signature differs from
// the list's does not compile.
#pragma once
#include <cstddef>

#include "shim/cuda_abi.h"
#include "shim/export.h"

using namespace cudaabi;

#define CUDAPOOL_HOOK(base, min_version, max_version, flavour, abi, params) CUDAPOOL_EXPORT CUresult abi params;
#include "shim/entry_points.def"
