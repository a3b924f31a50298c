# tools/: the `cudapool` command (run, ab, replay, tune, report, check) and the sample-trace
# generator. Everything but main.cpp goes into a library so tests/unit/tools_* can link it.
TOOLS_MAINS := tools/main.cpp tools/gen_trace_main.cpp
TOOLS_SRCS := $(filter-out $(TOOLS_MAINS),$(wildcard tools/*.cpp))
TOOLS_LIB := $(BUILD)/libcudapool_tools.a
# Link order: tools use telemetry and config, which use the pool core.
TOOLS_LINK := $(TOOLS_LIB) $(TELEMETRY_LIB) $(CONFIG_LIB) $(ALLOCATOR_LIB)
TOOLS_LDLIBS := -ltomlplusplus
CUDAPOOL_BIN := $(BUILD)/cudapool
GEN_TRACE_BIN := $(BUILD)/cudapool-gen-trace

$(TOOLS_LIB): $(TOOLS_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	ar rcs $@ $^

$(CUDAPOOL_BIN): $(BUILD)/tools/main.o $(TOOLS_LINK)
	$(CXX) $(LDFLAGS) $< $(TOOLS_LINK) $(TOOLS_LDLIBS) -o $@

$(GEN_TRACE_BIN): $(BUILD)/tools/gen_trace_main.o $(TOOLS_LINK)
	$(CXX) $(LDFLAGS) $< $(TOOLS_LINK) $(TOOLS_LDLIBS) -o $@

PROGRAMS += $(CUDAPOOL_BIN) $(GEN_TRACE_BIN)
INSTALL_BINS += $(CUDAPOOL_BIN)
