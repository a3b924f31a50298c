# tests/: GoogleTest units and interposition tests. Each area adds its own binaries here.
GTEST_LIBS := -lgtest -lgtest_main -pthread
