# tests/run_tests.sh, the runner `make test` uses, checked on stand-in test binaries.
TEST_BINS += tests/runner/run_tests_test.sh
