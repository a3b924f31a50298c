"""PyTorch on the pool through PyTorch's pluggable allocator.

    import cudapool.torch
    cudapool.torch.use()        # before the first CUDA tensor

switches the process's CUDA tensors to cudapool's pool (PyTorch's CUDAPluggableAllocator made
the current allocator): PyTorch hands each allocation its stream, so memory freed on a stream is
reused on it at once and by other streams only after an event on it; a tensor that
Tensor.record_stream marked as used on another stream is reused only behind a device-wide fence.
Passing record_stream on needs PyTorch's C++ API (torch/csrc/cuda/CUDAPluggableAllocator.h and
the CUDA headers); where the installed PyTorch lacks them, use() registers through the Python
API, warns, and makes every free device-fenced (free="device"). status() says which. An allocation
the pool cannot serve raises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) whose message
is the pool's diagnosis (also cudapool.last_oom_message()). The allocator registered in C++ is a
class of the glue's own, derived from PyTorch's CUDAPluggableAllocator, that answers from the pool
what PyTorch's class refuses: torch.cuda's memory statistics, reset_peak_memory_stats,
empty_cache, and cuDNN's question of how large a workspace its benchmark mode may try.

With libcudapool.so preloaded (LD_PRELOAD), that copy serves PyTorch too; everything else in the
process (cuBLAS workspaces, NCCL, other libraries' cudaMalloc) keeps going through its hooks
into the same pool: one pool, nothing counted twice. Without it, use() loads the library itself
(`library=`, else $CUDAPOOL_LIBRARY, else the loader's search path): then only PyTorch's tensors
are pooled.

PyTorch does not check a pluggable allocator's answer (a NULL would become a tensor without
memory), so use() compiles a small glue file against the installed PyTorch's headers (a C++
compiler is needed once: $CXX, else c++, g++ or clang++; the result is cached in
$CUDAPOOL_CACHE_DIR, else $XDG_CACHE_HOME/cudapool, else ~/.cache/cudapool) that raises
torch.OutOfMemoryError instead.
"""
import contextlib
import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import cudapool as _cp

import warnings

__all__ = ["use", "in_use", "status", "translate_oom", "TooLateError"]

_state = {}  # what must stay alive while PyTorch uses the allocator: the libraries, the allocator
_GLUE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_glue.cpp")


class TooLateError(RuntimeError):
    """PyTorch's CUDA allocator was already in use when cudapool.torch.use() was called."""


def in_use():
    """True once use() switched this process's PyTorch allocator to the pool."""
    return "allocator" in _state


def status():
    """How use() set PyTorch up: {"in_use": bool, "free": "stream" or "device" (None before use()),
    "record_stream": whether Tensor.record_stream reaches the pool, "registration": "c++" or
    "python", "library": "preloaded" or "loaded", "torch_stats": whether PyTorch's own calls that
    its pluggable-allocator class refuses are answered by the pool (torch.cuda.memory_allocated,
    memory_stats, max_memory_reserved, reset_peak_memory_stats, empty_cache, and the largest
    workspace cuDNN's benchmark mode may try, without which every such convolution fails)}."""
    return {"in_use": in_use(), "free": _state.get("free"), "record_stream": _state.get("record_stream", False),
            "registration": _state.get("registration"), "library": _state.get("how"),
            "torch_stats": _state.get("torch_stats", False)}


def _addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _pool_library(library):
    """(ctypes library, how it was found): the preloaded copy if there is one, else one loaded."""
    scope = ctypes.CDLL(None)
    if hasattr(scope, "cudapool_torch_alloc"):
        return scope, "preloaded"
    if hasattr(scope, "cudapool_api_version"):
        # Loading a newer copy beside it would give the process two pools.
        raise _cp.NotLoadedError("the preloaded libcudapool.so is too old for cudapool.torch (it has no "
                                 "cudapool_torch_alloc): preload a newer build, or none")
    if _cp._loaded is not None:
        return _cp._loaded, "loaded"
    path = library or os.environ.get("CUDAPOOL_LIBRARY") or "libcudapool.so"
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        hint = ("preload it instead (LD_PRELOAD=/path/to/libcudapool.so python3 ...): a library loaded after "
                "start needs room in the static TLS block, which GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 "
                "also gives" if "static TLS" in str(e) else
                "pass cudapool.torch.use(library='/path/to/libcudapool.so'), set CUDAPOOL_LIBRARY, or install it "
                "(make install) where the loader finds it")
        raise _cp.NotLoadedError(f"cannot load {path}: {e}; {hint}") from None
    try:
        lib.cudapool_torch_alloc
    except AttributeError:
        raise _cp.NotLoadedError(f"{path} has no cudapool_torch_alloc: it is an older cudapool; use a newer build") \
            from None
    _cp._adopt(lib)
    return lib, "loaded"


def _compiler():
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c.split()[0]):
            return c.split()
    return None


def _cache_dir():
    base = os.environ.get("CUDAPOOL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "cudapool")
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.stat(base)
    # A library loaded from here runs in this process: only a directory of this user that nobody
    # else may write to.
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(f"refusing the cache directory {base}: it must belong to you and not be writable by "
                           "others (set CUDAPOOL_CACHE_DIR to another one)")
    return base


_PLUGGABLE_H = os.path.join("torch", "csrc", "cuda", "CUDAPluggableAllocator.h")


def _pluggable_flags(torch, include, libdir):
    """Compiler flags for the glue's C++ registration (CUDAPOOL_GLUE_PLUGGABLE): the include and
    library directories torch.utils.cpp_extension uses, the CUDA headers, PyTorch's CUDA libraries."""
    includes, libdirs, cuda_home = [include], [libdir], os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    try:
        from torch.utils import cpp_extension
        includes, libdirs = list(cpp_extension.include_paths()), list(cpp_extension.library_paths())
        cuda_home = cuda_home or cpp_extension.CUDA_HOME
    except Exception:  # a PyTorch without cpp_extension: its own include/ and lib/
        pass
    cuda = [os.path.join(cuda_home, "include")] if cuda_home else []
    for base in sys.path:  # the CUDA headers of the nvidia-* wheels PyTorch depends on
        nv = os.path.join(base or ".", "nvidia")
        if os.path.isdir(nv):
            cuda += sorted(os.path.join(nv, d, "include") for d in os.listdir(nv))
    includes += [d for d in cuda if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))]
    flags = ["-DCUDAPOOL_GLUE_PLUGGABLE"] + [f for d in includes for f in ("-I", d)]
    for d in libdirs:
        flags += ["-L", d, "-Wl,-rpath," + d]
    for name in ("c10", "c10_cuda", "torch_cuda"):
        if any(os.path.exists(os.path.join(d, f"lib{name}.so")) for d in libdirs):
            flags.append("-l" + name)
    return flags


def build_glue(torch_module=None, compiler=None, pluggable=None, allocator_class=False):
    """The path of the glue library for the installed PyTorch, compiled once and cached. pluggable:
    with the C++ registration (cudapool_glue_register); None: when PyTorch ships its header.
    allocator_class (with pluggable): with the glue's own allocator class, which answers PyTorch's
    statistics and cuDNN's workspace question from the pool; it uses more of PyTorch's C++ API, so
    a PyTorch it does not compile against is remembered in the cache and not tried again."""
    torch = torch_module or sys.modules["torch"]
    root = os.path.dirname(os.path.abspath(torch.__file__))
    include, libdir = os.path.join(root, "include"), os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(include, "c10", "util", "Exception.h")):
        raise RuntimeError(f"PyTorch's C++ headers are missing ({include}/c10/util/Exception.h): install a PyTorch "
                           "build that ships them (the wheels from pytorch.org do)")
    if pluggable is None:
        pluggable = os.path.isfile(os.path.join(include, _PLUGGABLE_H))
    cxx = compiler.split() if isinstance(compiler, str) else (compiler or _compiler())
    if not cxx:
        raise RuntimeError("cudapool.torch.use() compiles a small glue file once and needs a C++ compiler: install "
                           "one (apt-get install g++) or set CXX")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    with open(_GLUE, "rb") as f:
        source = f.read()
    allocator_class = bool(pluggable and allocator_class)
    key = hashlib.sha256(b"\0".join([source, str(getattr(torch, "__version__", "")).encode(), root.encode(),
                                     " ".join(cxx).encode(), str(abi).encode(), str(pluggable).encode(),
                                     str(allocator_class).encode()]))
    cache = _cache_dir()
    out = os.path.join(cache, f"torch_glue-{key.hexdigest()[:24]}.so")
    failed = out + ".failed"  # the allocator class did not compile against this PyTorch
    if os.path.isfile(out):
        return out
    if allocator_class and os.path.isfile(failed):
        with open(failed, errors="replace") as f:
            raise RuntimeError(f"compiling cudapool's PyTorch glue failed before (remove {failed} to try again):\n"
                               + f.read(4000))
    if pluggable:
        extra = _pluggable_flags(torch, include, libdir)
        if allocator_class:
            extra.append("-DCUDAPOOL_GLUE_ALLOCATOR_CLASS")
    else:
        extra = ["-I", include]
        if os.path.exists(os.path.join(libdir, "libc10.so")):
            extra += ["-L", libdir, "-lc10", "-Wl,-rpath," + libdir]
    errors = []
    for std in ("-std=c++17", "-std=c++20"):
        fd, tmp = tempfile.mkstemp(prefix=".torch_glue-", suffix=".so", dir=cache)
        os.close(fd)
        cmd = cxx + [std, "-O2", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", _GLUE, "-o", tmp] + extra
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            os.unlink(tmp)
            raise RuntimeError(f"cannot run the C++ compiler {cxx[0]}: {e}; install one (apt-get install g++) or set "
                               "CXX") from None
        if r.returncode == 0:
            os.replace(tmp, out)
            return out
        os.unlink(tmp)
        errors.append(" ".join(cmd) + "\n" + r.stdout[-4000:])
    if allocator_class:
        fd, tmp = tempfile.mkstemp(prefix=".torch_glue-", suffix=".failed", dir=cache)
        with os.fdopen(fd, "w") as f:
            f.write(errors[-1][-4000:])
        os.replace(tmp, failed)
    raise RuntimeError("compiling cudapool's PyTorch glue failed:\n" + "\n".join(errors))


def _too_late(e):
    return TooLateError(
        f"cudapool.torch.use() came too late: PyTorch's CUDA allocator is already in use ({e}). Call it before "
        "the first CUDA tensor is made (right after `import torch`, before model.cuda() / .to('cuda')), or run "
        "the whole program under the library instead: PYTORCH_NO_CUDA_MEMORY_CACHING=1 "
        "LD_PRELOAD=/path/to/libcudapool.so python3 ...")


_STATS_FUNCTIONS = ("cudapool_memory_stats_json", "cudapool_reset_peak_stats", "cudapool_mem_get_info",
                    "cudapool_empty_cache")


def _cpp_glue(torch, lib, compiler):
    """(path of the glue with the C++ registration, None), or (None, why it cannot be had). The
    glue has the allocator class where it compiles against this PyTorch."""
    include = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "include")
    if not os.path.isfile(os.path.join(include, _PLUGGABLE_H)):
        return None, f"PyTorch's C++ header {_PLUGGABLE_H} is missing"
    if not hasattr(lib, "cudapool_torch_record_stream"):
        return None, "the preloaded libcudapool.so has no cudapool_torch_record_stream (preload a newer build)"
    if all(hasattr(lib, name) for name in _STATS_FUNCTIONS):
        try:
            return build_glue(torch, compiler, pluggable=True, allocator_class=True), None
        except RuntimeError as e:
            first = str(e).splitlines()[0][:200]
            warnings.warn("cudapool.torch: the glue's allocator class does not compile against this PyTorch, so "
                          "torch.cuda's memory statistics and cuDNN's benchmark mode are not served by the pool "
                          f"(cudapool's own functions are): {first} (remembered: remove the torch_glue-*.so.failed "
                          f"files in {_cache_dir()} to try again)", RuntimeWarning, stacklevel=3)
    try:
        return build_glue(torch, compiler, pluggable=True), None
    except RuntimeError as e:
        last = [line for line in str(e).splitlines() if "error" in line][:1] or [str(e).splitlines()[0]]
        return None, ("compiling the glue against PyTorch's C++ allocator API failed (are the CUDA headers there? "
                      f"set CUDA_HOME): {last[0][:200]}")


def use(library=None, compiler=None, free=None):
    """Switch this process's PyTorch CUDA allocations to cudapool's pool. Call it before the first
    CUDA tensor; calling it again is a no-op. Returns the path of the libcudapool.so in use.

    free: "stream" ($CUDAPOOL_TORCH_FREE when not given) reuses a freed tensor's memory at once on
    its stream, on other streams after an event on it: PyTorch's rule; a tensor marked with
    Tensor.record_stream waits for a device-wide fence instead. "device" reuses every tensor's
    memory only behind a device-wide fence (the policy's free_sync, as for cudaFree); without
    LD_PRELOAD each such free waits for the device. The default is "stream" when record_stream can
    reach the pool (PyTorch's C++ allocator API compiled into the glue), else "device", with a
    warning saying why. status() tells which mode is active."""
    if in_use():
        return _cp.library_path()
    free = free or os.environ.get("CUDAPOOL_TORCH_FREE") or None
    if free not in (None, "stream", "device"):
        raise ValueError(f"free={free!r}: use 'stream' (PyTorch's stream-ordered reuse) or 'device' (reuse behind "
                         "a device-wide fence, for programs that rely on Tensor.record_stream)")
    try:
        import torch
    except ImportError:
        raise RuntimeError("cudapool.torch.use() needs PyTorch (import torch failed)") from None
    lib, how = _pool_library(library)
    path, why = _cpp_glue(torch, lib, compiler)
    if path is None:
        path = build_glue(torch, compiler, pluggable=False)
        if free is None:
            free = "device"
            warnings.warn(f"cudapool.torch: {why}, so Tensor.record_stream cannot reach the pool: every free waits for "
                          "a device-wide fence (free='device'; pass free='stream' if no tensor is used on a stream "
                          "other than its own)", RuntimeWarning, stacklevel=2)
    free = free or "stream"
    glue = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    glue.cudapool_glue_init.restype = ctypes.c_int
    glue.cudapool_glue_init.argtypes = [ctypes.c_void_p] * 3
    free_fn = "cudapool_torch_free" if free == "stream" else "cudapool_torch_free_device"
    if glue.cudapool_glue_init(_addr(lib, "cudapool_torch_alloc"), _addr(lib, free_fn),
                               _addr(lib, "cudapool_last_oom_message")) != 0:
        raise RuntimeError("cudapool's PyTorch glue refused the library's entry points")
    torch_stats = False
    if why is None and hasattr(glue, "cudapool_glue_init_stats"):
        glue.cudapool_glue_init_stats.restype = ctypes.c_int
        glue.cudapool_glue_init_stats.argtypes = [ctypes.c_void_p] * 4
        torch_stats = glue.cudapool_glue_init_stats(*(_addr(lib, name) for name in _STATS_FUNCTIONS)) == 0
    if why is None:
        glue.cudapool_glue_register.restype = ctypes.c_int
        glue.cudapool_glue_register.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        err = ctypes.create_string_buffer(2048)
        rc = glue.cudapool_glue_register(_addr(lib, "cudapool_torch_record_stream"), err, len(err))
        msg = err.value.decode(errors="replace")
        if rc == 1:
            raise _too_late(msg) from None
        if rc != 0:
            raise RuntimeError(f"registering cudapool's allocator with PyTorch failed: {msg}")
        allocator = None  # PyTorch and the glue hold it
    else:
        raw = torch._C._cuda_customAllocator(_addr(glue, "cudapool_glue_alloc"), _addr(glue, "cudapool_glue_free"))
        allocator = torch.cuda.memory._CUDAAllocator(raw)
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise _too_late(e) from None
    _state.update(lib=lib, glue=glue, allocator=allocator, how=how, free=free, record_stream=why is None,
                  registration="c++" if why is None else "python", torch_stats=torch_stats)
    return _cp.library_path()


@contextlib.contextmanager
def translate_oom():
    """For the LD_PRELOAD path (PYTORCH_NO_CUDA_MEMORY_CACHING=1), where PyTorch reports the pool's
    out-of-memory answer to cudaMalloc as a plain RuntimeError ("CUDA error: out of memory"):
    inside `with cudapool.torch.translate_oom():` (or on a function it decorates) such an error
    is raised again as torch.OutOfMemoryError with the pool's diagnosis as its message, so code
    that catches torch.OutOfMemoryError (batch-size finders, retrying servers) sees it."""
    import torch
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        if "out of memory" not in str(e):
            raise
        msg = _cp.last_oom_message() if _cp.is_loaded() else ""
        raise torch.OutOfMemoryError(msg or str(e)) from e
