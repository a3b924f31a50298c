# tests/: GoogleTest units and interposition tests. Each area adds its own fragment in tests/mk/.
GTEST_LIBS := -lgtest -lgtest_main -pthread

# libFuzzer targets (clang). Every fuzzer's sources, the project's included, are built once with
# the sanitizers in one object tree, $(FUZZ_OBJ), whichever area's fragment names them. -g1:
# line tables are all a sanitizer report needs, at a fraction of full debug info's compile time.
FUZZ_CXX ?= clang++
FUZZ_FLAGS := -std=c++20 -O1 -g1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
  -fno-sanitize-recover=all $(CPPFLAGS)
FUZZ_LINK_FLAGS := -fsanitize=fuzzer,address,undefined
FUZZ_OBJ := $(BUILD)/fuzz/obj
$(FUZZ_OBJ)/%.o: %.cpp
	@mkdir -p $(@D)
	$(call say,FUZZCXX,$<)$(FUZZ_CXX) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@

include $(sort $(wildcard tests/mk/*.mk))
