# Host cost per cudaMalloc/cudaFree pair on the fake driver (tests/bench/host_cost.sh): the
# program it runs under each policy; `make bench` prints the table, `make test` runs the gate
# against tests/bench/host_cost_baseline.tsv. Release builds only: under a sanitizer the times
# and the shim's driver calls are not the ones the baseline holds.
HOST_COST_APP := $(BUILD)/bench/host_cost_app
$(HOST_COST_APP): tests/bench/host_cost_app.cpp tests/fakecuda/test_app.h shim/cuda_abi.h
	@mkdir -p $(@D)
	$(call say,CXX,$<)$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) $< -o $@ -pthread -ldl

HOST_COST_DEPS := tests/bench/host_cost.sh tests/bench/host_cost.py tests/bench/host_cost_baseline.tsv \
  $(HOST_COST_APP) $(SHIM_SO) $(FAKECUDA_SO)
HOST_COST_BENCH := $(BUILD)/bench/host_cost.sh
$(HOST_COST_BENCH): $(HOST_COST_DEPS)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/bench/host_cost.sh --build %s "$$@"\n' "$(BUILD)" > $@
	chmod +x $@
HOST_COST_TEST := $(BUILD)/tests/host_cost_test.sh
$(HOST_COST_TEST): $(HOST_COST_DEPS)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/bench/host_cost.sh --build %s --check\n' "$(BUILD)" > $@
	chmod +x $@
BENCH_BINS += $(if $(SAN),,$(HOST_COST_BENCH))
TEST_BINS += $(if $(SAN),,$(HOST_COST_TEST))
