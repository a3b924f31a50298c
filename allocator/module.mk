# allocator/: the pool core, a static library with no CUDA dependency.
ALLOCATOR_SRCS := $(wildcard allocator/*.cpp)
ALLOCATOR_LIB := $(BUILD)/libcudapool_core.a
$(ALLOCATOR_LIB): $(ALLOCATOR_SRCS:%.cpp=$(BUILD)/%.o)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^  # rm: a deleted source must not linger as a stale member
