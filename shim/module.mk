# shim/: libcudapool.so, the LD_PRELOAD library (the only code that talks to CUDA).
# Hidden by default, exports only what the version script made from shim/exports.map.in and
# shim/entry_points.def lists, libstdc++/libgcc linked in, the pool, config and telemetry archives
# linked in (they are built with -fPIC).
SHIM_SRCS := $(wildcard shim/*.cpp shim/*/*.cpp)
SHIM_OBJS := $(SHIM_SRCS:%.cpp=$(BUILD)/%.o)
SHIM_SO := $(BUILD)/libcudapool.so
SHIM_EXPORTS := $(BUILD)/shim/exports.map
# initial-exec TLS: the shim is loaded at process start (LD_PRELOAD), so its few thread-locals
# can live in the static TLS block and skip __tls_get_addr on the hot path.
$(SHIM_OBJS): CXXFLAGS += -fvisibility=hidden -fvisibility-inlines-hidden -ftls-model=initial-exec
# The version script: shim/exports.map.in with the names of shim/entry_points.def, by the preprocessor.
$(SHIM_EXPORTS): shim/exports.map.in shim/entry_points.def
	@mkdir -p $(@D)
	$(call say,GEN,$@)$(CXX) -E -P -x c -I. $< -o $@
$(SHIM_SO): $(SHIM_OBJS) $(ALLOCATOR_LIB) $(CONFIG_LIB) $(TELEMETRY_LIB) $(SHIM_EXPORTS)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CXX) -shared $(CXXFLAGS) -o $@ $(SHIM_OBJS) \
	  -Wl,--start-group $(TELEMETRY_LIB) $(CONFIG_LIB) $(ALLOCATOR_LIB) -Wl,--end-group \
	  -Wl,--version-script=$(SHIM_EXPORTS) -Wl,--exclude-libs,ALL -Wl,-z,now -Wl,-z,defs \
	  -static-libstdc++ -static-libgcc $(LDFLAGS) -ldl
PROGRAMS += $(SHIM_SO)
# The group ledger's layout and its checked readers (plain POSIX, no CUDA): also linked by the
# tools (`cudapool top`) and the tests that read ledgers.
SHIM_LEDGER_LIB := $(BUILD)/libcudapool_ledger.a
$(SHIM_LEDGER_LIB): $(BUILD)/shim/group/group_ledger_layout.o
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
INSTALL_LIBS += $(SHIM_SO)
INSTALL_HEADERS += shim/cudapool.h
