"""`python3 -m cudapool.run PROGRAM.py [ARGS...]` (or `-m MODULE [ARGS...]`): runs a PyTorch program
with its CUDA tensors on cudapool's pool, without changing it: cudapool.torch.use() first, then
the program as __main__. The library is the preloaded one, else $CUDAPOOL_LIBRARY, else the
loader's search path (see cudapool.torch)."""
import runpy
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import cudapool.torch
    cudapool.torch.use()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
