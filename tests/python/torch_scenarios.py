#!/usr/bin/env python3
"""cudapool.torch and the torch.cuda-style functions against the fake driver and a stand-in
PyTorch (tests/python/fake_torch.py), one scenario per process: `torch_scenarios.py NAME`.
tests/python/module_test.py runs them, preloaded or not; each prints "PASS NAME" at its end.
"""
import ctypes
import os
import shutil
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20

# The stand-in PyTorch as the package `torch`, with the stand-in c10 header as its include/, and
# with FAKE_TORCH_PLUGGABLE=1 the stand-in torch/csrc/cuda/CUDAPluggableAllocator.h too.
_tmp = tempfile.mkdtemp(prefix="cudapool-fake-torch-")
os.makedirs(os.path.join(_tmp, "torch"))
shutil.copy(os.path.join(HERE, "fake_torch.py"), os.path.join(_tmp, "torch", "__init__.py"))
shutil.copytree(os.path.join(ROOT, "tests", "support", "fake_c10"), os.path.join(_tmp, "torch", "include"))
if os.environ.get("FAKE_TORCH_PLUGGABLE") == "1":
    shutil.copytree(os.path.join(ROOT, "tests", "support", "fake_torch_cuda"), os.path.join(_tmp, "torch", "include"),
                    dirs_exist_ok=True)
sys.path.insert(0, _tmp)
os.environ["CUDAPOOL_CACHE_DIR"] = os.path.join(_tmp, "cache")

import torch  # noqa: E402  (the stand-in)

import cudapool  # noqa: E402
import cudapool.torch  # noqa: E402


def start_cuda():
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    return cu


def use_and_allocate():
    """use() switches the allocator to the pool's glue; allocations show in the pool's stats, a
    block freed on its stream comes back on it at once."""
    cu = start_cuda()
    preloaded = os.environ.get("LD_PRELOAD", "") != ""
    assert cudapool.is_loaded() == preloaded
    path = cudapool.torch.use(free="stream")
    assert cudapool.torch.in_use() and cudapool.is_loaded()
    assert os.path.samefile(path, os.environ["EXPECT_LIBRARY"]), path
    assert cudapool.torch.use(free="stream") == path  # again: a no-op
    alloc = torch.cuda.current_allocator
    assert alloc is not None
    assert cudapool.torch._state["how"] == ("preloaded" if preloaded else "loaded")
    stream = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(stream), 1) == 0
    base = cudapool.memory_allocated(0)
    p = alloc.malloc(4 * MiB, 0, stream.value)
    assert p
    assert cudapool.memory_allocated(0) == base + 4 * MiB, (base, cudapool.memory_stats(0))
    assert cudapool.memory_allocated("cuda:0") == cudapool.memory_allocated(torch.device("cuda", 0))
    assert cudapool.max_memory_allocated(0) >= base + 4 * MiB
    alloc.release(p)
    assert cudapool.memory_allocated(0) == base
    q = alloc.malloc(4 * MiB, 0, stream.value)
    assert q == p, (hex(p), hex(q))  # same stream: reused at once
    alloc.release(q)
    assert alloc.malloc(0, 0, None) is None  # an empty tensor: no memory, no error
    assert cudapool.memory_stats(0)["num_ooms"] == 0


def free_device():
    """use(free="device") (CUDAPOOL_CONF=free_sync:fenced): while work issued before the free runs,
    a freed tensor's memory waits for its device-wide fence even on its own stream, so the next
    tensor of its size gets other memory."""
    cu = start_cuda()
    try:
        cudapool.torch.use(free="sideways")
    except ValueError as e:
        assert "record_stream" in str(e), e
    else:
        raise AssertionError("a bad free= was accepted")
    cudapool.torch.use(free="device")
    assert cudapool.torch._state["free"] == "device"
    alloc = torch.cuda.current_allocator
    p = alloc.malloc(4 * MiB, 0, None)
    cu.fakecuda_hold_stream(None)  # work issued before the free still runs (the device fence waits)
    alloc.release(p)
    q = alloc.malloc(4 * MiB, 0, None)
    assert q != p, hex(p)
    assert cudapool.memory_stats(0)["pending_bytes"] == 4 * MiB
    cu.fakecuda_release_stream(None)
    alloc.release(q)


def mode_python():
    """Without PyTorch's C++ allocator header, record_stream cannot reach the pool: use() registers
    through the Python API, says why in a warning, and makes every free device-fenced."""
    start_cuda()
    assert cudapool.torch.status() == {"in_use": False, "free": None, "record_stream": False, "registration": None,
                                       "library": None, "torch_stats": False}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudapool.torch.use()
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "CUDAPluggableAllocator.h is missing" in msgs[0] and "record_stream" in msgs[0], msgs
    st = cudapool.torch.status()
    assert st["in_use"] and st["free"] == "device" and not st["record_stream"] and st["registration"] == "python", st
    assert not st["torch_stats"], st
    assert torch.cuda.current_allocator is not None


def _stream(cu):
    s = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s), 1) == 0
    return s.value


def mode_cpp():
    """With the header (FAKE_TORCH_PLUGGABLE=1), use() registers in C++ with record_stream wired to
    the pool, and the default free stays stream-ordered: a tensor recorded on a side stream whose
    work still runs is not reused on its own stream behind that work's back; one not recorded is
    (the negative control: what the record prevents)."""
    cu = start_cuda()
    for name, res, args in (("fakecuda_hold_stream", None, [ctypes.c_void_p]),
                            ("fakecuda_release_stream", None, [ctypes.c_void_p]),
                            ("fakecuda_would_wait", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
                            ("fakecuda_ctx_syncs", ctypes.c_long, [])):
        getattr(cu, name).restype, getattr(cu, name).argtypes = res, args
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudapool.torch.use()
    assert not caught, [str(w.message) for w in caught]
    st = cudapool.torch.status()
    assert st["free"] == "stream" and st["record_stream"] and st["registration"] == "c++", st
    assert torch.cuda.current_allocator is None  # not the Python API's registration
    glue = cudapool.torch._state["glue"]
    glue.fake_torch_alloc.restype = ctypes.c_void_p
    glue.fake_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    glue.fake_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    glue.fake_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert glue.fake_torch_has_allocator() == 1
    a, b, n = _stream(cu), _stream(cu), 4 * MiB
    alone = os.environ.get("LD_PRELOAD", "") == ""
    cu.fakecuda_hold_stream(b)
    p = glue.fake_torch_alloc(n, 0, a)
    syncs = cu.fakecuda_ctx_syncs()
    glue.fake_torch_free(p, n, 0, a)
    q = glue.fake_torch_alloc(n, 0, a)
    assert q == p and cu.fakecuda_would_wait(a, b) == 0 and cu.fakecuda_ctx_syncs() == syncs
    assert glue.fake_torch_record_stream(q, b) == 1
    glue.fake_torch_free(q, n, 0, a)
    r = glue.fake_torch_alloc(n, 0, a)
    if alone:
        assert cu.fakecuda_ctx_syncs() == syncs + 1  # the free waited for the device
    else:
        assert r != p or cu.fakecuda_would_wait(a, b) == 1, hex(r)
    cu.fakecuda_release_stream(b)
    glue.fake_torch_free(r, n, 0, a)
    _check_torch_stats(glue)


def _check_torch_stats(glue):
    """The glue's allocator class answers PyTorch's statistics and cuDNN's workspace question
    (cacheInfo) from the pool; PyTorch's own class (and the stand-in) refuse them: -1 here."""
    assert cudapool.torch.status()["torch_stats"], cudapool.torch.status()
    glue.fake_torch_stat.restype = ctypes.c_longlong
    glue.fake_torch_stat.argtypes = [ctypes.c_int, ctypes.c_char_p]
    glue.fake_torch_cache_info.restype = ctypes.c_longlong
    glue.fake_torch_cache_info.argtypes = [ctypes.c_int]
    glue.fake_torch_alloc.restype = ctypes.c_void_p
    glue.fake_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    glue.fake_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    p = glue.fake_torch_alloc(3 * MiB, 0, None)
    assert glue.fake_torch_stat(0, b"allocated_bytes.current") == cudapool.memory_allocated(0) >= 3 * MiB
    assert glue.fake_torch_stat(0, b"reserved_bytes.current") == cudapool.memory_reserved(0) > 0
    free, _total = cudapool.mem_get_info(0)
    assert glue.fake_torch_cache_info(0) == free > 0, (glue.fake_torch_cache_info(0), free)
    glue.fake_torch_free(p, 3 * MiB, 0, None)


def class_fallback():
    """Where the glue's allocator class does not compile against the installed PyTorch, use() warns
    once, registers PyTorch's own class in C++ (record_stream still reaches the pool) and remembers
    the failure: the next process does not compile the class again."""
    start_cuda()
    calls = os.path.join(_tmp, "calls")
    wrapper = os.path.join(_tmp, "cxx")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n"
                f"echo \"$*\" >> {calls}\n"
                "case \"$*\" in *CUDAPOOL_GLUE_ALLOCATOR_CLASS*) echo 'error: no such member' >&2; exit 1;; esac\n"
                "exec c++ \"$@\"\n")
    os.chmod(wrapper, 0o755)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudapool.torch.use(compiler=wrapper)
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "allocator class does not compile" in msgs[0], msgs
    st = cudapool.torch.status()
    assert st["registration"] == "c++" and st["record_stream"] and not st["torch_stats"], st
    glue = cudapool.torch._state["glue"]
    glue.fake_torch_cache_info.restype = ctypes.c_longlong
    glue.fake_torch_cache_info.argtypes = [ctypes.c_int]
    assert glue.fake_torch_cache_info(0) == -1  # PyTorch's class refuses it: the negative control
    with open(calls) as f:
        tried = f.read().splitlines()
    assert sum("CUDAPOOL_GLUE_ALLOCATOR_CLASS" in c for c in tried) == 2, tried  # c++17, then c++20
    try:
        cudapool.torch.build_glue(torch, compiler=wrapper, pluggable=True, allocator_class=True)
    except RuntimeError as e:
        assert "failed before" in str(e) and "no such member" in str(e), e
    else:
        raise AssertionError("the class's failure was not remembered")
    with open(calls) as f:
        assert f.read().splitlines() == tried  # not compiled again


def old_preloaded():
    """A preloaded libcudapool.so without the PyTorch entry points: use() refuses rather than load
    a second copy (two pools in one process)."""
    try:
        cudapool.torch.use()
    except cudapool.NotLoadedError as e:
        assert "too old" in str(e), e
    else:
        raise AssertionError("use() loaded a second copy beside the preloaded one")
    assert not cudapool.torch.in_use()


def translate_oom():
    """translate_oom(): the LD_PRELOAD path's RuntimeError("CUDA error: out of memory") becomes
    torch.OutOfMemoryError with the pool's diagnosis; other errors pass unchanged."""
    cu = start_cuda()
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(128 * MiB)) == 2  # over the cap
    try:
        with cudapool.torch.translate_oom():
            raise RuntimeError("CUDA error: out of memory")
    except torch.OutOfMemoryError as e:
        assert str(e).startswith("CUDA out of memory. Tried to allocate 128.00 MiB"), e
        assert isinstance(e.__cause__, RuntimeError)
    else:
        raise AssertionError("not translated")

    @cudapool.torch.translate_oom()
    def other():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    try:
        other()
    except torch.OutOfMemoryError:
        raise AssertionError("a non-OOM error was translated")
    except RuntimeError as e:
        assert "illegal memory access" in str(e)


def too_late():
    """Once PyTorch's allocator was initialised, use() says so and how to fix it."""
    torch.cuda._initialized = True
    try:
        cudapool.torch.use()
    except cudapool.torch.TooLateError as e:
        msg = str(e)
        assert "too late" in msg and "before the first CUDA tensor" in msg and "LD_PRELOAD" in msg, msg
        assert "Can't swap an already initialized allocator" in msg, msg
    else:
        raise AssertionError("use() did not refuse")
    assert not cudapool.torch.in_use()


def oom_message():
    """An allocation over the cap (CUDAPOOL_CONF=max_reserved_mb:64): the entry point answers
    NULL, and the diagnosis is cudapool.last_oom_message()."""
    start_cuda()
    cudapool.torch.use()
    assert cudapool.last_oom_message() == ""
    lib = cudapool._library()
    fn = lib.cudapool_torch_alloc
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    assert fn(128 * MiB, 0, None) is None
    msg = cudapool.last_oom_message()
    assert msg.startswith("CUDA out of memory. Tried to allocate 128.00 MiB"), msg
    assert "limit is 64.00 MiB" in msg, msg
    assert cudapool.memory_stats(0)["num_ooms"] == 1
    free, total = cudapool.mem_get_info(0)
    assert total == 64 * MiB and 0 < free <= total, (free, total)


def devices_and_parity():
    """Devices as int, "cuda", "cuda:N" or torch.device; one that does not exist is a ValueError;
    the torch.cuda-style functions read the pool's counters."""
    start_cuda()
    cudapool.torch.use()
    alloc = torch.cuda.current_allocator
    for bad in (7, "cuda:7", torch.device("cuda", 2), -1):
        try:
            cudapool.memory_stats(bad)
        except ValueError as e:
            assert "does not exist" in str(e), e
        else:
            raise AssertionError(f"{bad!r} accepted")
    for bad in ("cpu", torch.device("cpu"), "cuda:x"):
        try:
            cudapool.memory_allocated(bad)
        except ValueError as e:
            assert "not a CUDA device" in str(e), e
        else:
            raise AssertionError(f"{bad!r} accepted")
    try:
        cudapool.memory_reserved(True)
    except TypeError:
        pass
    else:
        raise AssertionError("True accepted as a device")
    assert cudapool.memory_stats(1) == {}  # exists, no pool there
    a = alloc.malloc(40 * MiB, 0, None)
    b = alloc.malloc(10 * MiB, 0, None)
    st = cudapool.memory_stats("cuda")  # the current device: 0 while PyTorch has not started CUDA
    assert cudapool.memory_allocated() == st["allocated_bytes.all.current"] == 50 * MiB
    assert cudapool.memory_reserved(0) == st["reserved_bytes.all.current"] >= 50 * MiB
    alloc.release(a)
    assert cudapool.memory_allocated(0) == 10 * MiB
    assert cudapool.max_memory_allocated(0) == 50 * MiB
    peak_reserved = cudapool.max_memory_reserved(0)
    assert peak_reserved >= 50 * MiB
    cudapool.empty_cache()
    assert cudapool.memory_reserved(0) < peak_reserved
    cudapool.reset_peak_memory_stats(0)
    assert cudapool.max_memory_allocated(0) == 10 * MiB
    assert cudapool.max_memory_reserved(0) == cudapool.memory_reserved(0)
    free, total = cudapool.mem_get_info(torch.device("cuda", 0))
    assert 0 < free <= total, (free, total)
    segs = cudapool.memory_snapshot()
    assert segs == cudapool.snapshot()["segments"] and segs
    assert any(blk["address"] == b for s in segs for blk in s["blocks"])
    assert "Allocated memory" in cudapool.memory_summary("cuda:0")
    try:
        cudapool.mem_get_info(1)
    except cudapool.NoPoolError as e:
        assert "no pool on device 1" in str(e), e
    else:
        raise AssertionError("mem_get_info(1) without a pool there")
    alloc.release(b)


def glue_is_cached():
    """The glue is compiled once per PyTorch and compiler, then loaded from the cache."""
    path = cudapool.torch.build_glue(torch)
    assert os.path.isfile(path) and os.path.dirname(path) == os.environ["CUDAPOOL_CACHE_DIR"]
    mtime = os.stat(path).st_mtime_ns
    assert cudapool.torch.build_glue(torch) == path and os.stat(path).st_mtime_ns == mtime
    assert os.stat(os.environ["CUDAPOOL_CACHE_DIR"]).st_mode & 0o077 == 0
    try:
        cudapool.torch.build_glue(torch, compiler=["/nonexistent/c++"])
    except RuntimeError as e:
        assert "C++ compiler" in str(e) or "cannot run" in str(e), e
    else:
        # a cached result for that compiler cannot exist: the key includes the compiler
        raise AssertionError("a missing compiler was not reported")
    os.chmod(os.environ["CUDAPOOL_CACHE_DIR"], 0o777)
    try:
        cudapool.torch.build_glue(torch)
    except RuntimeError as e:
        assert "refusing the cache directory" in str(e), e
    else:
        raise AssertionError("a world-writable cache directory was used")


def run_module():
    """python3 -m cudapool.run PROGRAM ARGS: the program runs as __main__ with its arguments,
    after use()."""
    start_cuda()
    import runpy
    prog = os.path.join(_tmp, "prog.py")
    with open(prog, "w") as f:
        f.write("import sys, cudapool, cudapool.torch, torch\n"
                "assert __name__ == '__main__' and sys.argv[1:] == ['--steps', '3'], sys.argv\n"
                "assert cudapool.torch.in_use()\n"
                "p = torch.cuda.current_allocator.malloc(1 << 20, 0, None)\n"
                "assert cudapool.memory_allocated(0) == 1 << 20\n"
                "print('program ran')\n")
    sys.argv = ["-m", prog, "--steps", "3"]
    runpy.run_module("cudapool.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    name = sys.argv[1]
    try:
        try:
            globals()[name]()
        except SystemExit as e:  # cudapool.run ends with sys.exit(main())
            if e.code not in (0, None):
                raise
    finally:
        shutil.rmtree(_tmp, ignore_errors=True)
    print("PASS " + name)
