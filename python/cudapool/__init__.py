"""Python view of cudapool, the caching device-memory pool preloaded in front of CUDA programs.

Pure ctypes over the library's C API (shim/cudapool.h): the functions find libcudapool.so in
the process (preloaded with LD_PRELOAD, or loaded by cudapool.torch.use()) and never load it
themselves. The names and answers follow torch.cuda's memory functions where they apply.
"""
import ctypes
import errno
import json
import os
import pickle
import stat
import sys

__all__ = ["NotLoadedError", "NoPoolError", "is_loaded", "is_active", "memory_stats", "memory_summary", "empty_cache",
           "snapshot", "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
           "reset_peak_memory_stats", "mem_get_info", "memory_snapshot", "last_oom_message", "library_path",
           "ParkError", "park", "unpark", "parked_bytes"]
__version__ = "0.7.0"

_HINT = ("libcudapool.so is not in this process: start Python with "
         "LD_PRELOAD=/path/to/libcudapool.so (for example build/release/libcudapool.so), "
         "run it with `cudapool run -- python3 ...`, or call cudapool.torch.use() first")


class NotLoadedError(RuntimeError):
    """The cudapool library is not in this process (or is too old for the call)."""


class NoPoolError(RuntimeError):
    """The device has no pool yet (CUDA not used there), and the call has no answer without one:
    mem_get_info's free and total memory are the driver's, which it does not start CUDA to ask."""


_lib = None
_loaded = None  # the library loaded by cudapool.torch.use() in a process without LD_PRELOAD


def _declare(scope):
    scope.cudapool_api_version.restype = ctypes.c_int
    scope.cudapool_active.restype = ctypes.c_int
    scope.cudapool_snapshot_json.restype = ctypes.c_size_t
    scope.cudapool_snapshot_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    scope.cudapool_empty_cache.restype = ctypes.c_size_t
    scope.cudapool_empty_cache.argtypes = []
    return scope


def _library():
    """The C API: the process's own symbol scope if it holds it (preloaded), else the copy
    cudapool.torch.use() loaded; else None."""
    global _lib
    if _lib is None:
        scope = ctypes.CDLL(None)
        try:
            scope.cudapool_api_version
        except AttributeError:
            scope = _loaded
            if scope is None:
                return None
        _lib = _declare(scope)
    return _lib


def _adopt(lib):
    """cudapool.torch.use() loaded `lib` (a ctypes.CDLL of libcudapool.so) into this process."""
    global _loaded, _lib
    _loaded = lib
    _lib = None


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
    return buf.value.decode("utf-8", errors="replace")


def is_loaded():
    """True when libcudapool.so is preloaded in this process."""
    return _library() is not None


def is_active():
    """True when the pool serves this process's allocations: the library is preloaded, its policy
    is the native backend, and CUDA has been used."""
    lib = _library()
    return lib is not None and lib.cudapool_active() == 1


def _device_count(lib):
    """The devices this process sees, or None when that cannot be told without starting CUDA."""
    if lib.cudapool_api_version() >= 3:
        fn = lib.cudapool_device_count
        fn.restype = ctypes.c_int
        n = fn()
        if n >= 0:
            return n
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.device_count()
    return None


def _visible_at_most():
    """The most devices CUDA can show this process, from CUDA_VISIBLE_DEVICES: one per entry it
    lists (CUDA stops at the first entry it cannot use, so it may show fewer); None when unset."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len(visible.split(",")) if visible.strip() else 0


def _device(device, lib=None):
    """The device index of `device`: None (the current device), an int, "cuda", "cuda:N" or a
    torch.device (torch is never imported here). ValueError for a device that does not exist."""
    torch = sys.modules.get("torch")
    if device is None:
        index = None
    elif isinstance(device, bool):
        raise TypeError(f"device must be an int, 'cuda:N' or a torch.device, not {device!r}")
    elif isinstance(device, int):
        index = device
    elif isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind != "cuda" or (num and not num.isdigit()):
            raise ValueError(f"device {device!r} is not a CUDA device: give an int, 'cuda' or 'cuda:N'")
        index = int(num) if num else None
    elif getattr(device, "type", None) is not None and hasattr(device, "index"):  # a torch.device
        if device.type != "cuda":
            raise ValueError(f"device {device!r} is not a CUDA device")
        index = device.index
    else:
        raise TypeError(f"device must be an int, 'cuda:N' or a torch.device, not {device!r}")
    if index is None:
        index = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
    if index < 0:
        raise ValueError(f"device {index} does not exist: device indexes start at 0")
    n = _device_count(lib) if lib is not None else None
    if n is not None and index >= n:
        raise ValueError(f"device {index} does not exist: this process sees {n} CUDA device(s)"
                         + (f" (0..{n - 1})" if n else "") + "; CUDA_VISIBLE_DEVICES selects and renumbers them")
    # Before CUDA starts the count is not known (counting would start CUDA, and a process that
    # did cannot use CUDA in children it forks later); CUDA_VISIBLE_DEVICES still bounds it.
    at_most = _visible_at_most() if n is None else None
    if at_most is not None and index >= at_most:
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        raise ValueError(f"device {index} does not exist: CUDA_VISIBLE_DEVICES={visible!r} shows this process at most "
                         f"{at_most} CUDA device(s)" + (f" (0..{at_most - 1})" if at_most else ""))
    return index


def memory_stats(device=None):
    """The pool's counters for `device` under torch.cuda.memory_stats()'s names ({} before the
    device's pool exists)."""
    lib = _need(2)
    index = _device(device, lib)
    fn = lib.cudapool_memory_stats_json
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    return json.loads(_text(fn, index))


def memory_allocated(device=None):
    """Bytes of live allocations from the pool on `device` (torch.cuda.memory_allocated)."""
    return int(memory_stats(device).get("allocated_bytes.all.current", 0))


def max_memory_allocated(device=None):
    """Peak of memory_allocated since start or reset_peak_memory_stats (torch.cuda.max_memory_allocated)."""
    return int(memory_stats(device).get("allocated_bytes.all.peak", 0))


def memory_reserved(device=None):
    """Bytes the pool holds from the device on `device` (torch.cuda.memory_reserved)."""
    return int(memory_stats(device).get("reserved_bytes.all.current", 0))


def max_memory_reserved(device=None):
    """Peak of memory_reserved since start or reset_peak_memory_stats (torch.cuda.max_memory_reserved)."""
    return int(memory_stats(device).get("reserved_bytes.all.peak", 0))


def reset_peak_memory_stats(device=None):
    """Peaks (every *.peak counter) start again from the current values (torch.cuda.reset_peak_memory_stats)."""
    lib = _need(3)
    index = _device(device, lib)
    fn = lib.cudapool_reset_peak_stats
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int]
    fn(index)  # no pool yet: nothing to reset


def mem_get_info(device=None):
    """(free, total) bytes of `device` as the program sees them under the pool, as
    torch.cuda.mem_get_info: the pool's cached memory counts as free, a cap is the total."""
    lib = _need(3)
    index = _device(device, lib)
    fn = lib.cudapool_mem_get_info
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if fn(index, ctypes.byref(free), ctypes.byref(total)) != 0:  # no pool there yet
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.mem_get_info(index)
        raise NoPoolError(f"no pool on device {index} yet (CUDA not used there): its free and total memory are the "
                          "driver's, and this call does not start CUDA to ask; memory_stats() is {} until then")
    return free.value, total.value


def memory_snapshot():
    """The pool's segments as torch.cuda.memory_snapshot() lists them (the whole snapshot, with
    allocator_settings, is snapshot())."""
    return snapshot()["segments"]


def last_oom_message():
    """The pool's diagnosis of the last allocation it could not serve (this thread's, else the
    process's): requested size, device capacity and free memory, reserved, allocated and cached
    bytes, the cap. "" when there was none."""
    lib = _need(3)
    fn = lib.cudapool_last_oom_message
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _text(fn)


def library_path():
    """The libcudapool.so file this process uses."""
    lib = _need(3)
    fn = lib.cudapool_library_path
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _text(fn)


def empty_cache():
    """Wait for pending frees and release every fully free segment. Returns the bytes released."""
    return int(_need().cudapool_empty_cache())


class ParkError(RuntimeError):
    """cudapool could not park this process, or could not restore it (the message says why)."""


def _park_why(lib):
    fn = lib.cudapool_park_why
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _text(fn)


def park(discard=False):
    """Give this process's device memory back while it idles: calls in flight finish, the devices
    drain, the live pages' bytes go to host memory (with discard=True they are dropped: the pages
    come back with any contents, for a cache the program rebuilds) and the pages are released.
    Addresses stay valid: the next launch, copy or allocation restores them first (or unpark()).
    Raises ParkError when the process cannot be parked now (a CUDA IPC export, peer access, a
    graph capture in progress, no expandable-segment memory)."""
    lib = _need(4)
    fn = lib.cudapool_park
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int]
    if fn(1 if discard else 0) != 0:
        raise ParkError("not parked: " + _park_why(lib))


def unpark():
    """Restore the parked memory now (the next GPU call would anyway). Raises ParkError when the
    memory could not be had back (the group budget or the device had no room)."""
    lib = _need(4)
    fn = lib.cudapool_unpark
    fn.restype = ctypes.c_int
    fn.argtypes = []
    if fn() != 0:
        raise ParkError("not restored: " + _park_why(lib))


def parked_bytes():
    """The bytes the process has parked (0 when it is not parked)."""
    lib = _need(4)
    fn = lib.cudapool_parked
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    n = ctypes.c_size_t()
    fn(ctypes.byref(n))
    return n.value


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
    snap = {"segments": segments, "device_traces": [[] for _ in range(devices)], "external_annotations": [],
            "allocator_settings": data.get("allocator_settings", {})}
    if path is not None:
        with _open_output(path) as f:
            pickle.dump(snap, f, protocol=2)
    return snap


def _open_output(path):
    """`path` opened for writing as the library opens its own output files (sys/output_file.h):
    a symbolic link there is refused (never written through), so is anything that is not a
    regular file (a FIFO would block the open: it is opened without blocking, then refused) and an
    existing file of another user; a new file has mode 0600, not inherited by programs run."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(4):  # the file may be removed between the two opens: then it is created again
        created = True
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            created = False
            try:
                fd = os.open(path, flags)  # not truncated before it is known to be this user's
            except FileNotFoundError:
                continue
            except OSError as e:
                if e.errno == errno.ELOOP and os.path.islink(path):
                    raise OSError(errno.ELOOP, "refusing to write through a symbolic link", path) from None
                if e.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a device, a directory
                    raise OSError(errno.EINVAL, _not_regular(os.lstat(path).st_mode), path) from None
                raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, _not_regular(st.st_mode), path)
            if not created and st.st_uid != os.geteuid():
                raise PermissionError(errno.EPERM, "owned by uid %d, not by this process's user (uid %d): remove it or "
                                      "choose another path" % (st.st_uid, os.geteuid()), path)
            if not created:
                os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "wb")
    raise OSError(errno.ENOENT, "it was removed each time it was opened; try again", path)


def _not_regular(mode):
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    kind = next((name for test, name in kinds if test(mode)), "an unknown kind of file")
    return "not a regular file (%s): give the path of a regular file" % kind


def _fmt(n):
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:7.0f} {unit}" if unit == "B " else f"{n:7.2f} {unit}"
        n /= 1024.0
    return str(n)


def memory_summary(device=None):
    """A table of the pool's counters in torch.cuda.memory_summary()'s layout."""
    lib = _need(2)
    device = _device(device, lib)
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
