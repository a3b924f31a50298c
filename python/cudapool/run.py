"""`python3 -m cudapool.run PROGRAM.py [ARGS...]` (or `-m MODULE [ARGS...]`): runs a PyTorch program
with its CUDA tensors on cudapool's pool, without changing it: cudapool.torch.use() first, then
the program as __main__. The library is the preloaded one, else $CUDAPOOL_LIBRARY, else the
loader's search path (see cudapool.torch)."""
import os
import runpy
import sys


def _fail(message):
    print(f"python3 -m cudapool.run: {message}", file=sys.stderr)
    return 1


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    # What stops it before the program runs is said in one line, not a traceback.
    try:
        import torch  # noqa: F401  (use() needs it; this says so before anything else)
    except (ImportError, OSError) as e:
        return _fail(f"PyTorch cannot be imported in this Python ({e}); install it, or run a program that does not "
                     "use PyTorch under the library with `cudapool run -- python3 PROGRAM.py`")
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        return _fail(f"{argv[0]}: no such file")
    import cudapool.torch
    try:
        cudapool.torch.use()
    except RuntimeError as e:  # NotLoadedError, TooLateError, a glue that cannot be built: their text is the fix
        return _fail(str(e))
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
