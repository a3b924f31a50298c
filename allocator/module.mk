# allocator/: the pool core, a static library with no CUDA dependency.
ALLOCATOR_SRCS := $(wildcard allocator/*.cpp)
ALLOCATOR_LIB := $(BUILD)/libcudapool_core.a
# initial-exec TLS (the thread caches' lookup is on the hot path): the library is linked into
# executables and into libcudapool.so, which is preloaded, so its thread-locals fit the static
# TLS block and skip __tls_get_addr.
$(ALLOCATOR_SRCS:%.cpp=$(BUILD)/%.o): CXXFLAGS += -ftls-model=initial-exec
$(ALLOCATOR_LIB): $(ALLOCATOR_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^  # rm: a deleted source must not linger as a stale member

# Clang's thread-safety analysis over the pool core (thread_annotations.h): which lock guards
# which member, which functions need it held. Syntax only: nothing is built.
THREAD_SAFETY_CXX ?= clang++
THREAD_SAFETY_FLAGS := -std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety
.PHONY: thread-safety
thread-safety:
	$(call say,TSA,allocator)set -e; for f in $(ALLOCATOR_SRCS); do \
	  $(THREAD_SAFETY_CXX) $(CPPFLAGS) $(THREAD_SAFETY_FLAGS) $$f; done
