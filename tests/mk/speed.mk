# The speed sweep (tests/speed_sweep.sh): the pool tests and the fake-driver tests again with the
# pool's clock frozen and racing, so that a test that depends on how fast the machine is fails on
# every machine. Release builds only: it checks timing assumptions, which the sanitizers do not
# change.
SPEED_SWEEP_TEST := $(BUILD)/tests/speed_sweep.sh
$(SPEED_SWEEP_TEST): tests/speed_sweep.sh $(POOL_TEST_BIN) $(SHIM_TEST_BIN)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/speed_sweep.sh --quick %s\n' "$(BUILD)" > $@
	chmod +x $@
TEST_BINS += $(if $(SAN),,$(SPEED_SWEEP_TEST))
