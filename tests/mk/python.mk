# The Python module (python/cudapool, ctypes only): its tests run python3 with the shim preloaded
# (and, for cudapool.torch, also loaded by the module alone) over the fake driver and a stand-in
# PyTorch (tests/python/run.sh); this wrapper hands the script the build directory.
PYTHON_MODULE_TEST := $(BUILD)/tests/python_module_test.sh
$(PYTHON_MODULE_TEST): tests/python/run.sh tests/python/module_test.py tests/python/torch_scenarios.py \
    tests/python/fake_torch.py $(wildcard python/cudapool/*) python/pyproject.toml python/_build/cudapool_build.py \
    tests/tools/check_snapshot.py LICENSE $(SHIM_SO) $(FAKECUDA_SO)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/python/run.sh %s\n' "$(BUILD)" > $@
	chmod +x $@
# Release builds only: an instrumented shim would need the sanitizer runtime preloaded into
# python3 as well, which then reports the interpreter's own leaks.
TEST_BINS += $(if $(SAN),,$(PYTHON_MODULE_TEST))
