// Precompiled by tools/module.mk for the tools files that include CLI11 (header-only, slow to parse).
#include <CLI/CLI.hpp>
