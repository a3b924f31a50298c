# tests/gpu/: the real-GPU suite runs on the device machine (bash tests/gpu/run.sh, see
# tests/gpu/README.md). Here, without a GPU, only its plumbing and verdicts are tested, with
# stand-in programs: scripts and mocks only, nothing of the build, so the sanitizer builds skip it.
TEST_BINS += $(if $(SAN),,tests/gpu/selftest.sh)
