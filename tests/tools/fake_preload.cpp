// Stands in for libcudapool.so in the CLI tests of `run` and `ab`: the dynamic loader must find
// and preload something, and the test checks that it was preloaded (LD_PRELOAD, /proc/self/maps).
extern "C" int cudapool_fake_preload_marker() { return 42; }
