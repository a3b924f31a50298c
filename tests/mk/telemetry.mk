# telemetry/ tests (logging, trace writer/reader, JSON summary, OOM text) and the trace-cost bench.
TELEMETRY_TEST_SRCS := $(wildcard tests/unit/telemetry_*.cpp)
TELEMETRY_TEST_BIN := $(BUILD)/tests/telemetry_tests
$(TELEMETRY_TEST_BIN): $(TELEMETRY_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(TELEMETRY_LIB) $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) $(GTEST_LIBS)
TEST_BINS += $(if $(TELEMETRY_TEST_SRCS),$(TELEMETRY_TEST_BIN))

TELEMETRY_BENCH_SRCS := $(wildcard tests/bench/telemetry_*.cpp)
TELEMETRY_BENCH_BIN := $(BUILD)/bench/telemetry_bench
$(TELEMETRY_BENCH_BIN): $(TELEMETRY_BENCH_SRCS:%.cpp=$(BUILD)/%.o) $(TELEMETRY_LIB) $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) -lbenchmark -pthread
BENCH_BINS += $(if $(TELEMETRY_BENCH_SRCS),$(TELEMETRY_BENCH_BIN))
