"""A stand-in for the few parts of PyTorch that cudapool.torch uses, with PyTorch's names:
torch._C._cuda_customAllocator, torch.cuda.memory._CUDAAllocator and change_current_allocator
(which refuses once the allocator was initialized, with PyTorch's message), torch.device and a
few torch.cuda queries. tests/python/torch_scenarios.py installs it as the package `torch`, with
tests/support/fake_c10 as its include/ directory. Its allocator calls the function pointers it
was given the way PyTorch's CUDAPluggableAllocator does: alloc(size, device, stream) and, on
release, free(ptr, size, device, stream) with the allocation's own size, device and stream.
"""
import ctypes
import os
import types

__version__ = "0.0-fake"
_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


class OutOfMemoryError(RuntimeError):
    pass


class device:
    def __init__(self, kind, index=None):
        if ":" in kind:
            kind, index = kind.split(":")[0], int(kind.split(":")[1])
        self.type, self.index = kind, index

    def __repr__(self):
        return f"device(type='{self.type}', index={self.index})"


class _PluggableAllocator:
    def __init__(self, alloc_fn, free_fn):
        self.alloc_fn, self.free_fn = _ALLOC(alloc_fn), _FREE(free_fn)
        self.meta = {}

    def malloc(self, size, device_index=0, stream=None):
        p = self.alloc_fn(size, device_index, stream)
        self.meta[p] = (size, device_index, stream)
        return p

    def release(self, p):
        size, device_index, stream = self.meta.pop(p)
        self.free_fn(p, size, device_index, stream)


_C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True,
                           _cuda_customAllocator=lambda a, f: _PluggableAllocator(a, f))


class _CUDAAllocator:
    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


def _change_current_allocator(allocator):
    if cuda._initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    cuda.current_allocator = allocator.allocator()


cuda = types.SimpleNamespace(
    _initialized=False, current_allocator=None,
    is_initialized=lambda: cuda._initialized, device_count=lambda: 2, current_device=lambda: 1,
    memory=types.SimpleNamespace(_CUDAAllocator=_CUDAAllocator, change_current_allocator=_change_current_allocator))
__file__ = os.path.abspath(__file__)
