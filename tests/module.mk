# tests/: GoogleTest units and interposition tests. Each area adds its own fragment in tests/mk/.
GTEST_LIBS := -lgtest -lgtest_main -pthread
include $(sort $(wildcard tests/mk/*.mk))
