# Shim tests (no GPU): a fake libcuda.so.1, two test programs that reach it the way cudart and
# -lcuda programs do, and a GoogleTest driver that runs them under LD_PRELOAD=libcudapool.so.
# The fake and the programs are always built uninstrumented (fixed flags below).
FAKECUDA_DIR := $(BUILD)/tests/fakecuda
FAKECUDA_SO := $(FAKECUDA_DIR)/libcuda.so.1
SHIM_APP_CUDART := $(FAKECUDA_DIR)/app_cudart
SHIM_APP_LINKED := $(FAKECUDA_DIR)/app_linked

$(FAKECUDA_SO): tests/fakecuda/fakecuda.cpp tests/fakecuda/fakecuda_doors.cpp shim/entry_points.def \
  tests/fakecuda/fakecuda.h shim/cuda_abi.h
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) -fPIC -shared -Wl,-soname,libcuda.so.1 $< \
	  tests/fakecuda/fakecuda_doors.cpp -o $@ -pthread

$(SHIM_APP_CUDART): tests/fakecuda/app.cpp tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cudapool.h shim/cuda_abi.h
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) $< -o $@ -pthread -ldl

$(SHIM_APP_LINKED): tests/fakecuda/app.cpp tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cudapool.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) -DCUDAPOOL_APP_LINKED $< -o $@ \
	  -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl

SHIM_TEST_BIN := $(BUILD)/tests/shim_tests
SHIM_TEST_SRCS := $(wildcard tests/unit/shim_*.cpp)
# Sanitizer builds: the instrumented shim runs inside the (uninstrumented) test programs with
# the sanitizer runtimes preloaded in front of it.
san_runtime = $(if $(filter address,$(1)),asan,$(if $(filter thread,$(1)),tsan,$(if $(filter undefined,$(1)),ubsan)))
SHIM_SAN_PRELOAD := $(if $(SAN),$(foreach s,$(subst $(comma), ,$(SAN)),$(if $(call san_runtime,$(s)),$(shell $(CXX) -print-file-name=lib$(call san_runtime,$(s)).so))))
$(SHIM_TEST_SRCS:%.cpp=$(BUILD)/%.o): CPPFLAGS += -DCUDAPOOL_SHIM_SO='"$(abspath $(SHIM_SO))"' \
  -DCUDAPOOL_FAKECUDA_DIR='"$(abspath $(FAKECUDA_DIR))"' -DCUDAPOOL_SHIM_EXPORTS='"$(abspath $(SHIM_EXPORTS))"' \
  -DCUDAPOOL_SHIM_HEADER='"$(abspath shim/cudapool.h)"' \
  -DCUDAPOOL_SAN_PRELOAD='"$(strip $(SHIM_SAN_PRELOAD))"'
$(SHIM_TEST_BIN): $(SHIM_TEST_SRCS:%.cpp=$(BUILD)/%.o) | $(SHIM_SO) $(FAKECUDA_SO) $(SHIM_APP_CUDART) $(SHIM_APP_LINKED)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDFLAGS) $(GTEST_LIBS)
TEST_BINS += $(SHIM_TEST_BIN)
# The shim's layers: nothing the runtime is built on includes the runtime or the hooks.
TEST_BINS += tests/shim_layers.sh
# The real-driver table is checked in the test process itself against the fake libcuda.so.1
# (tests/unit/shim_driver_test.cpp), so the tests link shim/driver.o.
$(SHIM_TEST_BIN): $(BUILD)/shim/driver.o
# The SIGBUS guard of the shim's shared mappings is tested in the test process itself
# (tests/unit/shim_sigbus_guard_test.cpp).
$(SHIM_TEST_BIN): $(BUILD)/shim/sigbus_guard.o
$(SHIM_TEST_BIN): LDFLAGS += -ldl

# Expandable segments: a -lcuda program checking the fake driver's VMM accounting,
# run by tests/unit/shim_vmm_test.cpp (part of SHIM_TEST_BIN via the shim_*.cpp wildcard).
SHIM_APP_VMM := $(FAKECUDA_DIR)/vmm_app
$(SHIM_APP_VMM): tests/fakecuda/vmm_app.cpp tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cudapool.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) $< -o $@ -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl
$(SHIM_TEST_BIN): | $(SHIM_APP_VMM)

# Parking: a -lcuda program that parks and launches the fake's test kernel, run by
# tests/unit/shim_park_test.cpp.
SHIM_APP_PARK := $(FAKECUDA_DIR)/park_app
$(SHIM_APP_PARK): tests/fakecuda/park_app.cpp tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cudapool.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) $< -o $@ -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl
$(SHIM_TEST_BIN): | $(SHIM_APP_PARK)

# CUDA IPC between processes: a -lcuda program that exports pooled blocks and runs itself as the
# importing children (tests/unit/shim_ipc_test.cpp runs it); it speaks the shim's wire format
# directly for the foreign-user check, so it links shim/ipc/ipc_wire.cpp.
SHIM_APP_IPC := $(FAKECUDA_DIR)/ipc_app
$(SHIM_APP_IPC): tests/fakecuda/ipc_app.cpp shim/ipc/ipc_wire.cpp shim/ipc/ipc_wire.h tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cudapool.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) tests/fakecuda/ipc_app.cpp shim/ipc/ipc_wire.cpp -o $@ \
	  -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl
$(SHIM_TEST_BIN): | $(SHIM_APP_IPC)
# The exporter's server loop itself runs in the test process, on a clock the test moves
# (tests/unit/shim_ipc_server_test.cpp): shim/ipc/ipc_server.o and the wire helpers; the logger's
# archives are linked at the end of this file.
$(SHIM_TEST_BIN): $(BUILD)/shim/ipc/ipc_server.o $(BUILD)/shim/ipc/ipc_wire.o

# Processes sharing one GPU (group budget, cooperative release, `cudapool top`): a -lcuda program
# run several times at once by tests/unit/shim_share_test.cpp; it reads the group ledger itself,
# so it links telemetry/share.cpp and the ledger's layout, and so do the tests.
SHIM_APP_SHARE := $(FAKECUDA_DIR)/share_app
SHIM_SHARE_SRCS := telemetry/share.cpp shim/group/group_ledger_layout.cpp
$(SHIM_APP_SHARE): tests/fakecuda/share_app.cpp $(SHIM_SHARE_SRCS) telemetry/share.h shim/group/group_ledger_layout.h tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) tests/fakecuda/share_app.cpp $(SHIM_SHARE_SRCS) -o $@ \
	  -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl
$(SHIM_TEST_BIN): $(SHIM_SHARE_SRCS:%.cpp=$(BUILD)/%.o) | $(SHIM_APP_SHARE) $(CUDAPOOL_BIN)
$(SHIM_TEST_SRCS:%.cpp=$(BUILD)/%.o): CPPFLAGS += -DCUDAPOOL_BIN_PATH='"$(abspath $(CUDAPOOL_BIN))"'

# PyTorch's pluggable-allocator entry points and the Python module's PyTorch glue (built in with
# stand-in c10 and CUDAPluggableAllocator headers): a -lcuda program run by
# tests/unit/shim_torch_test.cpp, preloaded or with the library loaded by dlopen alone.
SHIM_APP_TORCH := $(FAKECUDA_DIR)/torch_app
$(SHIM_APP_TORCH): tests/fakecuda/torch_app.cpp python/cudapool/_torch_glue.cpp tests/support/fake_c10/c10/util/Exception.h \
  tests/support/fake_torch_cuda/torch/csrc/cuda/CUDAPluggableAllocator.h tests/fakecuda/fakecuda.h tests/fakecuda/test_app.h \
  shim/cudapool.h shim/cuda_abi.h $(FAKECUDA_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -Itests/support/fake_c10 -Itests/support/fake_torch_cuda -DCUDAPOOL_GLUE_PLUGGABLE -DCUDAPOOL_GLUE_ALLOCATOR_CLASS -std=c++20 -O2 -g $(WARNFLAGS) tests/fakecuda/torch_app.cpp \
	  python/cudapool/_torch_glue.cpp -o $@ -L$(FAKECUDA_DIR) -l:libcuda.so.1 -pthread -ldl
$(SHIM_TEST_BIN): | $(SHIM_APP_TORCH)

# cudart's cudaMalloc / cudaFree answered by the shim itself: a fake shared cudart
# (libcudart.so.13) that reaches the fake driver as the real one does, the scenarios in a library
# linked against it (as PyTorch's and CuPy's libraries are), and a program that links no cudart
# and loads that library with dlopen, globally or locally; tests/unit/shim_runtime_api_test.cpp
# runs it.
FAKECUDART_SO := $(FAKECUDA_DIR)/libcudart.so.13
SHIM_CUDART_APP_LIB := $(FAKECUDA_DIR)/libcudart_app.so
SHIM_CUDART_APP := $(FAKECUDA_DIR)/cudart_app
$(FAKECUDART_SO): tests/fakecuda/fakecudart.cpp tests/fakecuda/fakecudart.h shim/cuda_abi.h
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) -fPIC -shared -Wl,-soname,libcudart.so.13 $< -o $@ -pthread -ldl
$(SHIM_CUDART_APP_LIB): tests/fakecuda/cudart_app.cpp tests/fakecuda/fakecudart.h tests/fakecuda/test_app.h shim/cuda_abi.h $(FAKECUDART_SO)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) -fPIC -shared $< -o $@ \
	  -L$(FAKECUDA_DIR) -l:libcudart.so.13 '-Wl,-rpath,$$ORIGIN' -pthread -ldl
$(SHIM_CUDART_APP): tests/fakecuda/cudart_app.cpp tests/fakecuda/test_app.h shim/cuda_abi.h
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) -std=c++20 -O2 -g $(WARNFLAGS) -DCUDART_APP_LAUNCHER $< -o $@ -pthread -ldl
$(SHIM_TEST_BIN): | $(FAKECUDART_SO) $(SHIM_CUDART_APP_LIB) $(SHIM_CUDART_APP)
# The host-cost benchmark's mix_cudart scenario loads the fake cudart (tests/mk/host_cost.mk).
$(HOST_COST_BENCH) $(HOST_COST_TEST): $(FAKECUDART_SO)

# Archives the test objects above need (the logger, for shim/ipc/ipc_server.o): after every object,
# so that the linker takes from them only what no object defines.
$(SHIM_TEST_BIN): $(TELEMETRY_LIB) $(CONFIG_LIB)

# The fence layer's parts in the test process, on the fake driver (tests/unit/shim_fences_test.cpp):
# their objects, the upstream's for ScopedContext (with the rest of it), the capture bookkeeping,
# and the pool's archive for its clock.
SHIM_FENCE_OBJS := $(addprefix $(BUILD)/shim/fences/,cuda_fences.o context_wide_fences.o event_pool.o \
  fence_context.o fence_record.o fence_recorder.o fence_sequence.o fence_streams.o fence_sweeps.o gpu_ordering.o \
  streams.o) $(addprefix $(BUILD)/shim/upstream/,cuda_upstream.o cuda_upstream_vmm.o cuda_upstream_park.o \
  park_store.o) $(BUILD)/shim/scoped_context.o
$(SHIM_TEST_BIN): $(SHIM_FENCE_OBJS) $(ALLOCATOR_LIB)
