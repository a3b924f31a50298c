#!/usr/bin/env python3
"""Tests of the Python module (python/cudapool) against the shim and the fake driver.

Run by tests/python/run.sh BUILD_DIR, which starts this file with libcudapool.so preloaded, the
fake libcuda.so.1 on the library path and python/ on PYTHONPATH. Allocations go through ctypes
calls to the driver API, which the shim serves from its pool.
"""
import ctypes
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import unittest

import cudapool

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Driver:
    """Just enough of the driver API, called the way a -lcuda program calls it."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        for name in ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemFree_v2"):
            getattr(self.cu, name).restype = ctypes.c_int
        self.check(self.cu.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self.check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise AssertionError(f"{what} returned {rc}")

    def alloc(self, n):
        p = ctypes.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc_v2")
        return p.value

    def free(self, p):
        self.check(self.cu.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree_v2")


class NotPreloaded(unittest.TestCase):
    def test_clear_behaviour_without_the_library(self):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        code = (
            "import cudapool\n"
            "assert cudapool.is_loaded() is False and cudapool.is_active() is False\n"
            "for f in (cudapool.memory_stats, cudapool.memory_summary, cudapool.empty_cache, cudapool.snapshot):\n"
            "    try:\n"
            "        f()\n"
            "    except cudapool.NotLoadedError as e:\n"
            "        assert 'LD_PRELOAD' in str(e), e\n"
            "    else:\n"
            "        raise AssertionError(f.__name__ + ' did not raise')\n"
            "print('not-preloaded ok')\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("not-preloaded ok", r.stdout)


def run_fresh(code, **env):
    """`code` in a fresh python3 with the same environment (the shim preloaded) plus `env`."""
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=120)


class BeforeCuda(unittest.TestCase):
    """What python/README.md promises before CUDA is used in the process."""

    def test_a_device_ruled_out_by_cuda_visible_devices_is_a_value_error(self):
        # No driver on the library path, as on a machine without a GPU (a real driver answers no
        # device count before cuInit either; the fake one would): the count is unknown, and
        # CUDA_VISIBLE_DEVICES alone bounds it.
        no_driver = {"LD_LIBRARY_PATH": ""}
        code = ("import cudapool\n"
                "for bad in ('cuda:3', 2, -1):\n"
                "    try:\n"
                "        cudapool.memory_allocated(bad)\n"
                "    except ValueError as e:\n"
                "        assert 'does not exist' in str(e), e\n"
                "    else:\n"
                "        raise AssertionError(f'{bad!r} accepted before CUDA')\n"
                "assert not cudapool.is_active()\n"
                "print('ok')\n")
        r = run_fresh(code.replace("'cuda:3', 2, -1", "'cuda:3', 1, -1"), CUDA_VISIBLE_DEVICES="0", **no_driver)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = run_fresh(code.replace("'cuda:3', 2, -1", "'cuda:0', 0"), CUDA_VISIBLE_DEVICES="", **no_driver)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # no device visible: none exists
        # Without it nothing tells, and a device without a pool answers as an empty pool.
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(no_driver)
        r = subprocess.run([sys.executable, "-c", "import cudapool; print(cudapool.memory_allocated('cuda:3'))"],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "0"), r.stdout + r.stderr)
        # With the driver's count known, it decides (here the fake driver's two devices).
        r = run_fresh(code)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_without_a_pool_the_calls_answer_for_an_empty_pool(self):
        code = ("import cudapool\n"
                "assert cudapool.memory_stats(0) == {} and cudapool.memory_allocated(0) == 0\n"
                "assert cudapool.max_memory_reserved('cuda:0') == 0\n"
                "cudapool.reset_peak_memory_stats(0)\n"
                "assert 'no pool on this device' in cudapool.memory_summary(0)\n"
                "try:\n"
                "    cudapool.mem_get_info(0)\n"
                "except cudapool.NoPoolError as e:\n"
                "    assert isinstance(e, RuntimeError) and 'no pool on device 0' in str(e), e\n"
                "else:\n"
                "    raise AssertionError('mem_get_info answered without a pool')\n"
                "assert not cudapool.is_active()\n"
                "print('ok')\n")
        r = run_fresh(code)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_run_without_torch_says_so_in_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "torch"))
            with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
                f.write("raise ImportError(\"No module named 'torch'\")\n")
            prog = os.path.join(tmp, "prog.py")
            with open(prog, "w") as f:
                f.write("print('program ran')\n")
            env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
            r = subprocess.run([sys.executable, "-m", "cudapool.run", prog], env=env, capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertNotIn("Traceback", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("python3 -m cudapool.run: PyTorch cannot be imported", r.stderr)
            self.assertNotIn("program ran", r.stdout)


class Preloaded(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert cudapool.is_loaded(), "run through tests/python/run.sh (the shim must be preloaded)"
        cls.before_cuda_active = cudapool.is_active()
        cls.before_cuda_stats = cudapool.memory_stats()
        cls.drv = Driver()

    def test_1_before_cuda(self):
        self.assertFalse(self.before_cuda_active)  # no pool until CUDA is used
        self.assertEqual(self.before_cuda_stats, {})
        self.assertIn("no pool on this device", cudapool.memory_summary(1))

    def test_2_stats_follow_allocations(self):
        d = self.drv
        base = cudapool.memory_stats()
        small = d.alloc(1000)
        self.assertTrue(cudapool.is_active())
        st = cudapool.memory_stats()
        for key in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "num_alloc_retries", "num_ooms",
                    "allocation.small_pool.current", "segment.all.current", "active_bytes.all.peak",
                    "requested_bytes.all.current", "inactive_split_bytes.all.current", "num_device_alloc"):
            self.assertIn(key, st)
        b0 = base.get("allocated_bytes.all.current", 0)
        self.assertEqual(st["allocated_bytes.all.current"] - b0, 1024)  # 1000 rounded to 512 B steps
        self.assertEqual(st["requested_bytes.all.current"] - base.get("requested_bytes.all.current", 0), 1000)
        self.assertEqual(st["allocation.small_pool.current"] - base.get("allocation.small_pool.current", 0), 1)
        big = d.alloc(30 * MiB)
        st2 = cudapool.memory_stats()
        self.assertEqual(st2["allocated_bytes.large_pool.current"] - st["allocated_bytes.large_pool.current"], 30 * MiB)
        self.assertGreaterEqual(st2["reserved_bytes.large_pool.current"], 30 * MiB)
        self.assertEqual(st2["num_ooms"], 0)
        # The summary shows those numbers.
        text = cudapool.memory_summary()
        self.assertIn("Allocated memory", text)
        self.assertIn("30.00 MiB", text)

        # Snapshot: both blocks where the pool put them, in PyTorch's shape.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "live.pickle")
            snap = cudapool.snapshot(path)
            with open(path, "rb") as f:
                self.assertEqual(pickle.load(f), snap)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "tests/tools/check_snapshot.py"), path],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(os.stat(path).st_mode & 0o077, 0)  # the owner's only
            # A symbolic link at the path is refused, and its target left as it was.
            victim = os.path.join(tmp, "victim")
            with open(victim, "w") as f:
                f.write("kept\n")
            link = os.path.join(tmp, "link.pickle")
            os.symlink(victim, link)
            with self.assertRaises(OSError) as cm:
                cudapool.snapshot(link)
            self.assertIn("refusing to write through a symbolic link", str(cm.exception))
            with open(victim) as f:
                self.assertEqual(f.read(), "kept\n")
            # A FIFO there would block the open for ever: refused at once (an alarm turns a
            # blocked open into a failure of this test instead of a hang).
            fifo = os.path.join(tmp, "f.pickle")
            os.mkfifo(fifo)

            class Blocked(Exception):
                pass

            def blocked(signum, frame):
                raise Blocked("cudapool.snapshot blocked in open")

            previous = signal.signal(signal.SIGALRM, blocked)
            signal.alarm(30)
            try:
                with self.assertRaises(OSError) as cm:
                    cudapool.snapshot(fifo)
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, previous)
            self.assertIn("not a regular file (a FIFO): give the path of a regular file", str(cm.exception))
            # Another user's file, writable by everyone, is never written (needs root to make one).
            theirs = os.path.join(tmp, "theirs.pickle")
            with open(theirs, "w") as f:
                f.write("theirs\n")
            os.chmod(theirs, 0o666)
            if os.geteuid() == 0:
                os.chown(theirs, 65534, 65534)
                with self.assertRaises(PermissionError) as cm:
                    cudapool.snapshot(theirs)
                self.assertIn("owned by uid 65534", str(cm.exception))
                self.assertIn("remove it or choose another path", str(cm.exception))
                with open(theirs) as f:
                    self.assertEqual(f.read(), "theirs\n")
        # The policy under the names PyTorch's snapshot gives it (the defaults here).
        settings = snap["allocator_settings"]
        self.assertIsInstance(settings["PYTORCH_CUDA_ALLOC_CONF"], str)
        self.assertIs(settings["expandable_segments"], True)
        self.assertEqual(settings["max_split_size"], -1)
        self.assertEqual(settings["garbage_collection_threshold"], 0)
        self.assertIsInstance(settings["roundup_power2_divisions"], list)
        # Once CUDA is in use the device count is known: a device past it is a ValueError.
        with self.assertRaises(ValueError):
            cudapool.memory_allocated("cuda:3")
        blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
        self.assertEqual(blocks[small]["size"], 1024)
        self.assertEqual(blocks[small]["requested_size"], 1000)
        self.assertEqual(blocks[small]["state"], "active_allocated")
        self.assertEqual(blocks[big]["size"], 30 * MiB)
        self.assertEqual(sum(s["total_size"] for s in snap["segments"]), st2["reserved_bytes.all.current"])
        types = {s["segment_type"] for s in snap["segments"]}
        self.assertEqual(types, {"small", "large"})

        # Free the big block: allocated drops, reserved stays (cached); empty_cache gives it back.
        d.free(big)
        st3 = cudapool.memory_stats()
        self.assertEqual(st3["allocated_bytes.all.current"], st["allocated_bytes.all.current"])
        self.assertEqual(st3["reserved_bytes.all.current"], st2["reserved_bytes.all.current"])
        released = cudapool.empty_cache()
        self.assertGreaterEqual(released, 30 * MiB)
        st4 = cudapool.memory_stats()
        self.assertEqual(st4["reserved_bytes.all.current"], st3["reserved_bytes.all.current"] - released)
        self.assertEqual(st4["reserved_bytes.all.peak"], st2["reserved_bytes.all.peak"])  # peaks stay
        d.free(small)
        self.assertEqual(cudapool.memory_stats()["allocation.all.current"], base.get("allocation.all.current", 0))


class TorchPath(unittest.TestCase):
    """tests/python/torch_scenarios.py, one process each, preloaded and loaded by use() alone."""

    def run_scenario(self, name, preload=True, conf="", **extra):
        env = dict(os.environ, CUDAPOOL_CONF=conf, **extra)
        shim = env.get("LD_PRELOAD", "") or os.environ["CUDAPOOL_TEST_SHIM"]
        env["EXPECT_LIBRARY"] = shim
        if not preload:
            env.pop("LD_PRELOAD", None)
            env["CUDAPOOL_LIBRARY"] = shim
        r = subprocess.run([sys.executable, os.path.join(HERE, "torch_scenarios.py"), name], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("PASS " + name, r.stdout)

    def test_use_and_allocate(self):
        self.run_scenario("use_and_allocate")
        self.run_scenario("use_and_allocate", preload=False)

    def test_mode_without_the_cpp_header_is_device_fenced(self):
        self.run_scenario("mode_python")
        self.run_scenario("mode_python", preload=False)

    def test_mode_with_the_cpp_header_passes_record_stream_on(self):
        self.run_scenario("mode_cpp", FAKE_TORCH_PLUGGABLE="1")
        self.run_scenario("mode_cpp", preload=False, FAKE_TORCH_PLUGGABLE="1")

    def test_allocator_class_that_does_not_compile_falls_back(self):
        self.run_scenario("class_fallback", FAKE_TORCH_PLUGGABLE="1")

    def test_too_late_through_the_cpp_registration(self):
        self.run_scenario("too_late", FAKE_TORCH_PLUGGABLE="1", FAKE_TORCH_ALLOCATOR_IN_USE="1")

    def test_free_device(self):
        self.run_scenario("free_device", conf="free_sync:fenced")

    def test_old_preloaded_library_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            src, lib = os.path.join(tmp, "old.c"), os.path.join(tmp, "libcudapool.so")
            with open(src, "w") as f:
                f.write("int cudapool_api_version(void) { return 2; }\n")
            subprocess.run(["cc", "-shared", "-fPIC", src, "-o", lib], check=True)
            env = dict(os.environ, LD_PRELOAD=lib, CUDAPOOL_LIBRARY=os.environ["CUDAPOOL_TEST_SHIM"])
            r = subprocess.run([sys.executable, os.path.join(HERE, "torch_scenarios.py"), "old_preloaded"], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("PASS old_preloaded", r.stdout)

    def test_translate_oom(self):
        self.run_scenario("translate_oom", conf="max_reserved_mb:64")

    def test_too_late(self):
        self.run_scenario("too_late")

    def test_oom_message(self):
        self.run_scenario("oom_message", conf="max_reserved_mb:64")
        self.run_scenario("oom_message", preload=False, conf="max_reserved_mb:64")

    def test_devices_and_parity(self):
        self.run_scenario("devices_and_parity")
        self.run_scenario("devices_and_parity", preload=False)

    def test_run_module(self):
        self.run_scenario("run_module", preload=False)

    def test_glue_is_cached(self):
        self.run_scenario("glue_is_cached")


if __name__ == "__main__":
    unittest.main(verbosity=2)
