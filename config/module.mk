# config/: policy grammar (CUDAPOOL_CONF), TOML profiles, validation.
CONFIG_SRCS := $(wildcard config/*.cpp) $(SYS_SRCS)
CONFIG_LIB := $(BUILD)/libcudapool_config.a
$(CONFIG_LIB): $(CONFIG_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
