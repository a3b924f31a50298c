# tools/: the `cudapool` command (run, ab, replay, tune, report, check) and the sample-trace
# generator. Everything but main.cpp goes into a library so tests/unit/tools_* can link it.
TOOLS_MAINS := tools/main.cpp tools/gen_trace_main.cpp tools/gen_docs_main.cpp
TOOLS_SRCS := $(filter-out $(TOOLS_MAINS),$(wildcard tools/*.cpp))
TOOLS_LIB := $(BUILD)/libcudapool_tools.a
# Link order: tools use the group ledger's layout and telemetry (its readers too) and config,
# which use the pool core.
TOOLS_LINK := $(TOOLS_LIB) $(SHIM_LEDGER_LIB) $(TELEMETRY_READER_LIB) $(TELEMETRY_LIB) $(CONFIG_LIB) $(ALLOCATOR_LIB)
TOOLS_LDLIBS := -ltomlplusplus -lz
CUDAPOOL_BIN := $(BUILD)/cudapool
GEN_TRACE_BIN := $(BUILD)/cudapool-gen-trace
GEN_DOCS_BIN := $(BUILD)/cudapool-gen-docs

$(TOOLS_LIB): $(TOOLS_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(CUDAPOOL_BIN): $(BUILD)/tools/main.o $(TOOLS_LINK)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS) $< $(TOOLS_LINK) $(TOOLS_LDLIBS) -o $@

$(GEN_TRACE_BIN): $(BUILD)/tools/gen_trace_main.o $(TOOLS_LINK)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS) $< $(TOOLS_LINK) $(TOOLS_LDLIBS) -o $@

# `make docs`: the policy-key tables of README.md and docs/policy.md, from config/keys.def, and
# the fidelity table of tests/traces/README.md, from the replays of the shipped traces, and
# README.md's results table, from docs/results.tsv
# (built with the programs, so it always compiles; not installed).
$(GEN_DOCS_BIN): $(BUILD)/tools/gen_docs_main.o $(CONFIG_LIB) $(ALLOCATOR_LIB)
	$(call say,LINK,$@)$(CXX) $(LDFLAGS) $< $(CONFIG_LIB) $(ALLOCATOR_LIB) $(TOOLS_LDLIBS) -o $@
.PHONY: docs
docs: $(GEN_DOCS_BIN) $(CUDAPOOL_BIN)
	$(GEN_DOCS_BIN) .
	bash tests/traces/fidelity.sh --write $(CUDAPOOL_BIN)
	python3 scripts/results_table.py

# CLI11 is header-only and costs ~6 s per file that includes it; the files that do include it
# first, so they all read one precompiled copy (GCC finds CLI/CLI.hpp.gch before CLI/CLI.hpp in
# $(BUILD)/pch). Built with the same flags as the files that use it; clang ignores it.
TOOLS_PCH := $(BUILD)/pch/CLI/CLI.hpp.gch
TOOLS_CLI_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(shell grep -l 'include <CLI/CLI.hpp>' tools/*.cpp))
$(TOOLS_PCH): tools/cli11_pch.h
	@mkdir -p $(@D)
	$(call say,PCH,CLI/CLI.hpp)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -x c++-header $< -o $@
$(TOOLS_CLI_OBJS): $(TOOLS_PCH)
$(TOOLS_CLI_OBJS): CPPFLAGS += -I$(BUILD)/pch

PROGRAMS += $(CUDAPOOL_BIN) $(GEN_TRACE_BIN) $(GEN_DOCS_BIN)
INSTALL_BINS += $(CUDAPOOL_BIN) $(GEN_TRACE_BIN)

# The demo on the sample traces (no GPU needed): `make demo` builds the programs, then runs this.
TOOLS_DEMO_DIR := $(BUILD)/demo
.PHONY: tools-demo
# The sample traces the project ships (the tools read the gzipped ones as they are); the demo
# first checks that each replays within 3 % of its recorded peak reserved. A trace the pool no
# longer reproduces fails the demo: record it again (tests/tools/gpu_capture.sh) or drop it.
TOOLS_SAMPLE_TRACES := $(sort $(wildcard tests/traces/*.csv tests/traces/*.csv.gz))
tools-demo: $(CUDAPOOL_BIN)
	@mkdir -p $(TOOLS_DEMO_DIR)
	@echo; echo "== cudapool replay --check: does a replay reproduce each sample trace's recorded peak?"
	@set -e; failed=0; \
	for t in $(TOOLS_SAMPLE_TRACES); do \
	  printf '%s: ' $$t; $(CUDAPOOL_BIN) replay --check --quiet $$t 2>/dev/null || failed=1; done; \
	if [ $$failed = 0 ]; then echo "every shipped trace replays within 3 % of its recorded peak (or records none to compare)"; \
	else echo "a shipped trace is NOT within 3 % (above)"; exit 1; fi
	@echo; echo "== cudapool replay: a training trace under two policies (simulated 16 GiB device)"
	$(CUDAPOOL_BIN) replay tests/traces/train.csv --conf "" --conf "max_split_size_mb:256"
	@echo; echo "== cudapool replay --sweep: one key, several values, on a serving trace"
	$(CUDAPOOL_BIN) replay tests/traces/serve.csv --sweep "roundup_power2_divisions=2,4,8" --quiet
	@echo; echo "== cudapool ab: A/B with repeated runs (replay stands in for the GPU program)"
	$(CUDAPOOL_BIN) ab --no-preload --hide-output --a "" --b "max_split_size_mb:256" -n 3 -- \
	  $(CUDAPOOL_BIN) replay --quiet tests/traces/train.csv
	@echo; echo "== cudapool tune: search the policy space on the serving trace"
	$(CUDAPOOL_BIN) tune tests/traces/serve.csv --top 8
	@echo; echo "== cudapool report: terminal summary, HTML page, Perfetto trace"
	$(CUDAPOOL_BIN) report tests/traces/train.csv -o $(TOOLS_DEMO_DIR)/train.html --perfetto $(TOOLS_DEMO_DIR)/train.perfetto.json
