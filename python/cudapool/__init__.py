"""Python view of cudapool, the caching device-memory pool preloaded in front of CUDA programs.

Pure ctypes over the library's C API (shim/cudapool.h): the functions find libcudapool.so in
the process (it is preloaded with LD_PRELOAD) and never load it themselves.
"""
import ctypes
import errno
import json
import os
import pickle

__all__ = ["NotLoadedError", "is_loaded", "is_active", "memory_stats", "memory_summary", "empty_cache", "snapshot"]
__version__ = "0.7.0"

_HINT = ("libcudapool.so is not preloaded in this process: start Python with "
         "LD_PRELOAD=/path/to/libcudapool.so (for example build/release/libcudapool.so), "
         "or run it with `cudapool run -- python3 ...`")


class NotLoadedError(RuntimeError):
    """The cudapool library is not in this process (or is too old for the call)."""


_lib = None


def _library():
    """The process's own symbol scope, if it holds the C API; else None."""
    global _lib
    if _lib is None:
        scope = ctypes.CDLL(None)
        try:
            scope.cudapool_api_version
        except AttributeError:
            return None
        scope.cudapool_api_version.restype = ctypes.c_int
        scope.cudapool_active.restype = ctypes.c_int
        scope.cudapool_snapshot_json.restype = ctypes.c_size_t
        scope.cudapool_snapshot_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        scope.cudapool_empty_cache.restype = ctypes.c_size_t
        scope.cudapool_empty_cache.argtypes = []
        _lib = scope
    return _lib


def _need(version=1):
    lib = _library()
    if lib is None:
        raise NotLoadedError(_HINT)
    have = lib.cudapool_api_version()
    if have < version:
        raise NotLoadedError(f"the preloaded libcudapool.so has C API version {have}; this call needs "
                             f"{version} or later: preload a newer build")
    return lib


def _text(fn, *args):
    n = fn(*args, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    fn(*args, buf, n + 1)
    return buf.value.decode("utf-8")


def is_loaded():
    """True when libcudapool.so is preloaded in this process."""
    return _library() is not None


def is_active():
    """True when the pool serves this process's allocations: the library is preloaded, its policy
    is the native backend, and CUDA has been used."""
    lib = _library()
    return lib is not None and lib.cudapool_active() == 1


def memory_stats(device=0):
    """The pool's counters for `device` under torch.cuda.memory_stats()'s names."""
    lib = _need(2)
    fn = lib.cudapool_memory_stats_json
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    return json.loads(_text(fn, int(device)))


def empty_cache():
    """Wait for pending frees and release every fully free segment. Returns the bytes released."""
    return int(_need().cudapool_empty_cache())


def snapshot(path=None):
    """The pool's segments and blocks as PyTorch's memory snapshot dict; with `path`, also pickled
    there (the file torch.cuda.memory._dump_snapshot writes)."""
    lib = _need()
    data = json.loads(_text(lib.cudapool_snapshot_json))
    segments = data["segments"]
    for s in segments:
        s["segment_pool_id"] = (0, 0)
        s["frames"] = []
        for b in s["blocks"]:
            b["frames"] = []
    devices = 1 + max((s["device"] for s in segments), default=0)
    snap = {"segments": segments, "device_traces": [[] for _ in range(devices)], "external_annotations": []}
    if path is not None:
        with _open_output(path) as f:
            pickle.dump(snap, f, protocol=2)
    return snap


def _open_output(path):
    """`path` opened for writing as the library opens its own output files: a symbolic link there
    is refused (never written through), a new file has mode 0600, not inherited by programs run."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(errno.ELOOP, "refusing to write through a symbolic link", path) from None
        raise
    return os.fdopen(fd, "wb")


def _fmt(n):
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:7.0f} {unit}" if unit == "B " else f"{n:7.2f} {unit}"
        n /= 1024.0
    return str(n)


def memory_summary(device=0):
    """A table of the pool's counters in torch.cuda.memory_summary()'s layout."""
    st = memory_stats(device)
    width = 81
    lines = ["=" * width, f"|{'cudapool memory summary, device ' + str(device):^{width - 2}}|", "-" * width]
    if not st:
        lines += [f"|{'no pool on this device yet (CUDA not used there)':^{width - 2}}|", "=" * width]
        return "\n".join(lines) + "\n"
    lines.append(f"| {'Metric':<25}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11} |")
    lines.append("-" * width)
    rows = [("Allocated memory", "allocated_bytes", True), ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True), ("GPU reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True), ("Allocations", "allocation", False),
            ("Active allocs", "active", False), ("GPU reserved segments", "segment", False),
            ("Non-releasable allocs", "inactive_split", False)]
    for title, fam, is_bytes in rows:
        for pool, label in (("all", title), ("large_pool", "  from large pool"), ("small_pool", "  from small pool")):
            vals = [st.get(f"{fam}.{pool}.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
            cells = [_fmt(v) if is_bytes else f"{v:>11}" for v in vals]
            lines.append(f"| {label:<25}| {cells[0]:>11} | {cells[1]:>11} | {cells[2]:>11} | {cells[3]:>11} |")
        lines.append("-" * width)
    for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                "cache_hits", "cache_misses", "fence_waits", "gc_passes", "bad_frees"):
        lines.append(f"| {key:<25}| {st.get(key, 0):>11} |{'':>41}|")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
