# telemetry/ tests (logging, trace writer/reader, JSON summary, OOM text) and the benches of the
# trace's cost and of reading a summary.
TELEMETRY_TEST_SRCS := $(wildcard tests/unit/telemetry_*.cpp)
TELEMETRY_TEST_BIN := $(BUILD)/tests/telemetry_tests
$(TELEMETRY_TEST_BIN): $(TELEMETRY_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(TELEMETRY_READER_LIB) $(TELEMETRY_LIB) $(CONFIG_LIB) $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) $(GTEST_LIBS)
TEST_BINS += $(if $(TELEMETRY_TEST_SRCS),$(TELEMETRY_TEST_BIN))

TELEMETRY_BENCH_SRCS := $(wildcard tests/bench/telemetry_*.cpp)
TELEMETRY_BENCH_BIN := $(BUILD)/bench/telemetry_bench
$(TELEMETRY_BENCH_BIN): $(TELEMETRY_BENCH_SRCS:%.cpp=$(BUILD)/%.o) $(TELEMETRY_READER_LIB) $(TELEMETRY_LIB) $(CONFIG_LIB) \
    $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) -lbenchmark -pthread
BENCH_BINS += $(if $(TELEMETRY_BENCH_SRCS),$(TELEMETRY_BENCH_BIN))

# Fuzzers (tests/module.mk): the trace reader and the JSON summary reader.
$(BUILD)/fuzz/telemetry_trace: $(addprefix $(FUZZ_OBJ)/,tests/fuzz/telemetry_fuzz_trace.o \
    telemetry/trace_reader.o telemetry/trace_format.o sys/printable.o sys/input_file.o)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@
$(BUILD)/fuzz/telemetry_summary: $(addprefix $(FUZZ_OBJ)/,tests/fuzz/telemetry_fuzz_summary.o \
    telemetry/summary_reader.o telemetry/json_reader.o telemetry/summary.o telemetry/json.o telemetry/logging.o \
    telemetry/spdlog_fmt_impl.o sys/output_file.o sys/input_file.o config/path_pattern.o)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@ -pthread
FUZZ_TARGETS += $(BUILD)/fuzz/telemetry_trace $(BUILD)/fuzz/telemetry_summary
# Warm-start plans (telemetry/warm_plan.cpp): the plan file's parser and the plan a trace gives.
$(BUILD)/fuzz/telemetry_warm_plan: $(addprefix $(FUZZ_OBJ)/,tests/fuzz/telemetry_fuzz_warm_plan.o \
    telemetry/warm_plan.o telemetry/trace_reader.o telemetry/trace_format.o sys/printable.o \
    sys/input_file.o)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@
FUZZ_TARGETS += $(BUILD)/fuzz/telemetry_warm_plan
# The readers of the files processes of one user share (telemetry/share.cpp and the ledger's
# layout, shim/group/group_ledger_layout.cpp): the group ledger and the stats records, as
# `cudapool top` reads them.
$(BUILD)/fuzz/share_%: $(FUZZ_OBJ)/tests/fuzz/share_fuzz_%.o $(FUZZ_OBJ)/telemetry/share.o \
    $(FUZZ_OBJ)/shim/group/group_ledger_layout.o
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@ -pthread
FUZZ_TARGETS += $(BUILD)/fuzz/share_ledger $(BUILD)/fuzz/share_record
# The CUDA IPC wire checks (shim/ipc/ipc_wire.cpp): what an importer and an exporter accept from
# their peer. Here rather than in shim.mk, which is read before this file's fuzzer settings.
$(BUILD)/fuzz/shim_ipc_wire: $(addprefix $(FUZZ_OBJ)/,tests/fuzz/shim_fuzz_ipc_wire.o shim/ipc/ipc_wire.o)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@
FUZZ_TARGETS += $(BUILD)/fuzz/shim_ipc_wire
