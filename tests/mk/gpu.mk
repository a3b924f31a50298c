# tests/gpu/: the real-GPU suite runs on the device machine (bash tests/gpu/run.sh, see
# tests/gpu/README.md). Here, without a GPU, only its plumbing and verdicts are tested, with
# stand-in programs.
TEST_BINS += tests/gpu/selftest.sh
