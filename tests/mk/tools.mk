# Tests of tools/ (the `cudapool` command): one GoogleTest binary for the pieces, and a scripted
# CLI test that runs the built command on the sample traces and on broken inputs.
TOOLS_TEST_SRCS := $(wildcard tests/unit/tools_*.cpp)
TOOLS_TEST_BIN := $(BUILD)/tests/tools_tests
$(TOOLS_TEST_BIN): $(TOOLS_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(TOOLS_LINK)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) $(TOOLS_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(TOOLS_LINK) $(TOOLS_LDLIBS) $(GTEST_LIBS) -o $@
TEST_BINS += $(if $(TOOLS_TEST_SRCS),$(TOOLS_TEST_BIN))

# A do-nothing preload library: `run`/`ab` tests need a library to preload without a GPU. Built
# without sanitizers even in SAN builds: it is preloaded into plain programs (sh), where an
# instrumented library would stop the loader ("ASan runtime does not come first").
TOOLS_FAKE_PRELOAD := $(BUILD)/tests/tools/libfake_preload.so
$(TOOLS_FAKE_PRELOAD): tests/tools/fake_preload.cpp
	@mkdir -p $(@D)
	$(CXX) -std=c++20 -O2 $(WARNFLAGS) -fPIC -shared $< -o $@

# The CLI test is a script; this wrapper hands it the build directory (release or sanitizer).
TOOLS_CLI_TEST := $(BUILD)/tests/tools_cli_test.sh
# It also records traces with the shim under the fake driver (tests/mk/shim.mk).
$(TOOLS_CLI_TEST): tests/tools/cli_test.sh $(CUDAPOOL_BIN) $(GEN_TRACE_BIN) $(TOOLS_FAKE_PRELOAD) $(SHIM_SO) \
    $(FAKECUDA_SO) $(SHIM_APP_CUDART)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nCUDAPOOL_SAN_PRELOAD="%s" exec bash tests/tools/cli_test.sh %s\n' \
	  "$(strip $(SHIM_SAN_PRELOAD))" "$(BUILD)" > $@
	chmod +x $@
TEST_BINS += $(TOOLS_CLI_TEST)

# The fidelity table of tests/traces/README.md matches the replays of the shipped traces (release
# build only: the same replays as cli_test.sh, which the sanitizer builds run already).
TOOLS_FIDELITY_TEST := $(BUILD)/tests/traces_fidelity.sh
$(TOOLS_FIDELITY_TEST): tests/traces/fidelity.sh $(CUDAPOOL_BIN)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/traces/fidelity.sh --check %s\n' "$(CUDAPOOL_BIN)" > $@
	chmod +x $@
TEST_BINS += $(if $(SAN),,$(TOOLS_FIDELITY_TEST))

# Hostile and careless inputs (a FIFO or another user's file at a path the programs open, …):
# a script of labelled rows, each attempt under a timeout, on the fake driver. A few seconds.
TOOLS_HOSTILE_TEST := $(BUILD)/tests/hostile_inputs.sh
$(TOOLS_HOSTILE_TEST): tests/tools/hostile_inputs.sh $(CUDAPOOL_BIN) $(SHIM_SO) $(FAKECUDA_SO) $(SHIM_APP_CUDART) \
    $(SHIM_APP_IPC) $(SHIM_APP_SHARE)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nCUDAPOOL_SAN_PRELOAD="%s" exec bash tests/tools/hostile_inputs.sh %s\n' \
	  "$(strip $(SHIM_SAN_PRELOAD))" "$(BUILD)" > $@
	chmod +x $@
TEST_BINS += $(TOOLS_HOSTILE_TEST)

# make install / uninstall into a scratch DESTDIR (the same build: SAN is handed on).
TOOLS_INSTALL_TEST := $(BUILD)/tests/install_test.sh
$(TOOLS_INSTALL_TEST): tests/tools/install_test.sh $(PROGRAMS)
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/tools/install_test.sh "%s"\n' "$(SAN)" > $@
	chmod +x $@
TEST_BINS += $(TOOLS_INSTALL_TEST)

# README.md's results table against docs/results.tsv (scripts/results_table.py): python3 only,
# so the same in release and sanitizer builds.
TOOLS_RESULTS_TABLE_TEST := $(BUILD)/tests/results_table_test.sh
$(TOOLS_RESULTS_TABLE_TEST): tests/tools/results_table_test.sh scripts/results_table.py
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/tools/results_table_test.sh\n' > $@
	chmod +x $@
TEST_BINS += $(TOOLS_RESULTS_TABLE_TEST)

# docs/design.md's backquoted paths (`dir/file.ext`) all exist: bash only.
TOOLS_DESIGN_PATHS_TEST := $(BUILD)/tests/design_paths_test.sh
$(TOOLS_DESIGN_PATHS_TEST): tests/tools/design_paths_test.sh docs/design.md
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/tools/design_paths_test.sh\n' > $@
	chmod +x $@
TEST_BINS += $(TOOLS_DESIGN_PATHS_TEST)

# scripts/long_functions.py (function bodies over 60 lines) on its fixture, a 61-line and a 60-line
# function, then on the product's folders (no function over 60 lines): python3 only.
TOOLS_LONG_FUNCTIONS_TEST := $(BUILD)/tests/long_functions_test.sh
$(TOOLS_LONG_FUNCTIONS_TEST): tests/tools/long_functions_test.sh scripts/long_functions.py \
    tests/tools/fixtures/long_functions/sample.cpp
	@mkdir -p $(@D)
	printf '#!/usr/bin/env bash\nexec bash tests/tools/long_functions_test.sh\n' > $@
	chmod +x $@
TEST_BINS += $(TOOLS_LONG_FUNCTIONS_TEST)

# Fuzzers (tests/module.mk): replay, report and tune run on whole traces in memory (bounded work
# per input: tests/fuzz/tools_fuzz_input.h), with tools/ (but its command-line files), telemetry/,
# config/ and the pool core in the fuzzers' object tree, as archives so that each target links
# only what it uses.
TOOLS_FUZZ_SRCS := $(filter-out tools/cmd_% tools/cli_io.cpp,$(TOOLS_SRCS))
TOOLS_FUZZ_LIBS := $(BUILD)/fuzz/libtools.a $(BUILD)/fuzz/libtelemetry.a $(BUILD)/fuzz/libconfig.a \
  $(BUILD)/fuzz/libcore.a
$(BUILD)/fuzz/libtools.a: $(TOOLS_FUZZ_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
TOOLS_FUZZ_TELEMETRY_SRCS := $(TELEMETRY_SRCS) $(TELEMETRY_READER_SRCS)
$(BUILD)/fuzz/libtelemetry.a: $(TOOLS_FUZZ_TELEMETRY_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
$(BUILD)/fuzz/libconfig.a: $(CONFIG_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
$(BUILD)/fuzz/libcore.a: $(ALLOCATOR_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
$(TOOLS_FUZZ_LIBS):
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/fuzz/tools_replay $(BUILD)/fuzz/tools_report $(BUILD)/fuzz/tools_tune: $(BUILD)/fuzz/tools_%: \
    $(FUZZ_OBJ)/tests/fuzz/tools_fuzz_%.o $(TOOLS_FUZZ_LIBS)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@ $(TOOLS_LDLIBS) -pthread
FUZZ_TARGETS += $(BUILD)/fuzz/tools_replay $(BUILD)/fuzz/tools_report $(BUILD)/fuzz/tools_tune
# Compressed traces (tools/gzip_input.cpp): zlib and the trace reader on gzip input.
$(BUILD)/fuzz/tools_gzip: $(FUZZ_OBJ)/tests/fuzz/tools_fuzz_gzip.o $(TOOLS_FUZZ_LIBS)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@ $(TOOLS_LDLIBS) -pthread
FUZZ_TARGETS += $(BUILD)/fuzz/tools_gzip
