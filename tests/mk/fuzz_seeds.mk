# Seed inputs of the fuzzers that read binary layouts (the group ledger, the stats record, the
# CUDA IPC wire): tests/fuzz/make_seeds.cpp writes them from the layouts themselves. They are
# committed under tests/fuzz/corpus/<target>/; `make fuzz-seeds` writes them again (after a
# layout changed). Plain g++: the generator is no fuzzer.
FUZZ_SEEDS_BIN := $(BUILD)/tests/fuzz_make_seeds
FUZZ_SEEDS_SRCS := tests/fuzz/make_seeds.cpp telemetry/share.cpp shim/group/group_ledger_layout.cpp shim/ipc/ipc_wire.cpp
$(FUZZ_SEEDS_BIN): $(FUZZ_SEEDS_SRCS) telemetry/share.h shim/group/group_ledger_layout.h shim/ipc/ipc_wire.h
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CXX) $(CPPFLAGS) -std=c++20 -O1 $(WARNFLAGS) $(FUZZ_SEEDS_SRCS) -o $@ -pthread
.PHONY: fuzz-seeds
fuzz-seeds: $(FUZZ_SEEDS_BIN)
	$(FUZZ_SEEDS_BIN) tests/fuzz/corpus
