# telemetry/: logging setup (spdlog), the event trace (CSV writer and reader), the JSON summary.
TELEMETRY_SRCS := $(wildcard telemetry/*.cpp)
TELEMETRY_LIB := $(BUILD)/libcudapool_telemetry.a
$(TELEMETRY_LIB): $(TELEMETRY_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
