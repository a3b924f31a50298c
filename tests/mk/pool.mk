# Pool core tests and benchmarks (allocator/, tests/support/ fakes).
POOL_TEST_SRCS := $(wildcard tests/unit/pool_*.cpp)
POOL_TEST_BIN := $(BUILD)/tests/pool_tests
$(POOL_TEST_BIN): $(POOL_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) $(GTEST_LIBS)
TEST_BINS += $(if $(POOL_TEST_SRCS),$(POOL_TEST_BIN))

POOL_BENCH_SRCS := $(wildcard tests/bench/pool_*.cpp)
POOL_BENCH_BIN := $(BUILD)/bench/pool_bench
$(POOL_BENCH_BIN): $(POOL_BENCH_SRCS:%.cpp=$(BUILD)/%.o) $(ALLOCATOR_LIB)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) -lbenchmark -pthread
BENCH_BINS += $(if $(POOL_BENCH_SRCS),$(POOL_BENCH_BIN))
