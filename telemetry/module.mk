# telemetry/: logging setup (spdlog), the event trace (CSV writer and reader), the JSON summary.
# Two archives: what libcudapool.so links, and the JSON readers (the JSON parser, the summary
# reader) that only the tools and the tests link, so the shim carries no JSON parser.
TELEMETRY_READER_SRCS := telemetry/json_reader.cpp telemetry/summary_reader.cpp
TELEMETRY_SRCS := $(filter-out $(TELEMETRY_READER_SRCS),$(wildcard telemetry/*.cpp))
TELEMETRY_LIB := $(BUILD)/libcudapool_telemetry.a
TELEMETRY_READER_LIB := $(BUILD)/libcudapool_telemetry_reader.a
$(TELEMETRY_LIB): $(TELEMETRY_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
$(TELEMETRY_READER_LIB): $(TELEMETRY_READER_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
