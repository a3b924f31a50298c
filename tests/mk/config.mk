# Tests of config/ (the policy): one GoogleTest binary, and its libFuzzer targets (clang): the
# CUDAPOOL_CONF grammar, the TOML file, the path patterns and printable().
CONFIG_TEST_SRCS := $(wildcard tests/unit/config_*.cpp)
CONFIG_TEST_BIN := $(BUILD)/tests/config_tests
$(CONFIG_TEST_BIN): $(CONFIG_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(CONFIG_LIB)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) $^ $(GTEST_LIBS) -o $@
TEST_BINS += $(CONFIG_TEST_BIN)

# Fuzzers build config/*.cpp again with clang and the sanitizers, in their own object tree.
FUZZ_CXX ?= clang++
FUZZ_FLAGS := -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
              -fno-sanitize-recover=all $(CPPFLAGS)
FUZZ_OBJ := $(BUILD)/fuzz/obj
$(FUZZ_OBJ)/%.o: %.cpp
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/fuzz/fuzz_%: $(FUZZ_OBJ)/tests/fuzz/fuzz_%.o $(CONFIG_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
	$(FUZZ_CXX) -fsanitize=fuzzer,address,undefined $^ -o $@
FUZZ_TARGETS += $(BUILD)/fuzz/fuzz_conf $(BUILD)/fuzz/fuzz_toml $(BUILD)/fuzz/fuzz_path
