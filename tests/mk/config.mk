# Tests of config/ (the policy): one GoogleTest binary, and its libFuzzer targets (clang): the
# CUDAPOOL_CONF grammar, the TOML file, the path patterns and printable().
CONFIG_TEST_SRCS := $(wildcard tests/unit/config_*.cpp)
CONFIG_TEST_BIN := $(BUILD)/tests/config_tests
$(CONFIG_TEST_BIN): $(CONFIG_TEST_SRCS:%.cpp=$(BUILD)/%.o) $(CONFIG_LIB)
	@mkdir -p $(@D)
	$(CXX) $(LDFLAGS) $^ $(GTEST_LIBS) -o $@
TEST_BINS += $(CONFIG_TEST_BIN)

# Fuzzers (tests/module.mk): the CUDAPOOL_CONF grammar, the TOML file, the path patterns.
$(BUILD)/fuzz/fuzz_%: $(FUZZ_OBJ)/tests/fuzz/fuzz_%.o $(CONFIG_SRCS:%.cpp=$(FUZZ_OBJ)/%.o)
	$(call say,LINK,$@)$(FUZZ_CXX) $(FUZZ_LINK_FLAGS) $^ -o $@
FUZZ_TARGETS += $(BUILD)/fuzz/fuzz_conf $(BUILD)/fuzz/fuzz_toml $(BUILD)/fuzz/fuzz_path
