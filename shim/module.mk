# shim/: libcudapool.so, the LD_PRELOAD library (the only code that talks to CUDA).
