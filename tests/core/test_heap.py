"""``beam_dp.heap``: a local run fixes glibc's mmap threshold, so freed large blocks go back to the system."""

from __future__ import annotations

import inspect
import platform
import subprocess
import sys

import pytest

from pipelines import runner

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# In a new process (the setting is process-wide): free a 16 MiB block (glibc then raises its dynamic mmap
# threshold to 16 MiB), allocate 50 blocks of 2 MiB, free all but the last, print the resident MB. With the
# dynamic threshold the blocks come from the heap and stay resident below the last one (~100 MB); with the
# threshold fixed (1 MiB) each is a mapping of its own, unmapped when freed.
_PROBE = """
import sys
from beam_dp.heap import limit_heap_retention
if sys.argv[1] == "fixed":
    assert limit_heap_retention()
big = b"\\1" * (16 << 20)
del big
blocks = [b"\\1" * (2 << 20) for _ in range(50)]
keep = blocks[-1]
del blocks
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) >> 10)
"""


def _resident_mb(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                              check=True).stdout)


def test_freed_large_blocks_leave_the_process_once_the_threshold_is_fixed():
    dynamic, fixed = _resident_mb("dynamic"), _resident_mb("fixed")
    # 98 MiB freed: resident in the dynamic case, returned in the fixed one (interpreter ~10-20 MB either way)
    assert dynamic - fixed > 80, (dynamic, fixed)


def test_a_local_run_sets_it():
    source = inspect.getsource(runner._launch)
    assert "limit_heap_retention()" in source.split("if local:", 1)[1].split("with RunOutputs", 1)[0]


# In a new process: where a malloc lands (the heap, below the program break, or a mapping of its own) outside
# and inside scratch_heap, with or without the fixed threshold: 2 MiB before and inside the pass, then 8 MiB
# after it (more than the free heap space the pass left, which later blocks may reuse).
_WHERE = """
import contextlib, ctypes, sys
from beam_dp.heap import limit_heap_retention, scratch_heap
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.sbrk.restype = ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes, libc.sbrk.argtypes = [ctypes.c_size_t], [ctypes.c_void_p], [ctypes.c_ssize_t]
if sys.argv[1] == "fixed":
    assert limit_heap_retention()
def where(size):
    p = libc.malloc(size)
    heap = p < libc.sbrk(0)
    libc.free(p)
    return "heap" if heap else "mapped"
before = where(2 << 20)
with scratch_heap() if sys.argv[2] == "scope" else contextlib.nullcontext():
    inside = where(2 << 20)
print(before, inside, where(8 << 20))
"""


def _where(mode: str, scope: str = "scope") -> list[str]:
    return subprocess.run([sys.executable, "-c", _WHERE, mode, scope], capture_output=True, text=True,
                          check=True).stdout.split()


def test_a_scratch_pass_takes_its_temporaries_from_the_heap_then_the_threshold_is_back():
    assert _where("fixed") == ["mapped", "heap", "mapped"]


def test_a_scratch_pass_changes_nothing_where_the_threshold_was_never_fixed():
    # glibc's own dynamic threshold rises once the first block is freed: the same with or without the pass
    assert _where("dynamic") == _where("dynamic", "none")


def test_the_parse_pass_is_a_scratch_pass():
    from beam_dp.beam.shell import parse

    assert "with scratch_heap():" in inspect.getsource(parse.ParseEvents._process_batch)


# In a new process: a scratch pass leaves 49 freed 2 MiB blocks in the heap below a live one; print the resident MB
# with or without release_free_heap afterwards.
_SCRATCH = """
import sys
from beam_dp.heap import limit_heap_retention, release_free_heap, scratch_heap
assert limit_heap_retention()
with scratch_heap():
    blocks = [b"\\1" * (2 << 20) for _ in range(50)]
keep = blocks[-1]
del blocks
if sys.argv[1] == "release":
    release_free_heap()
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) >> 10)
"""


def test_the_free_scratch_heap_goes_back_once_released():
    kept, released = (int(subprocess.run([sys.executable, "-c", _SCRATCH, mode], capture_output=True, text=True,
                                         check=True).stdout) for mode in ("keep", "release"))
    assert kept - released > 80, (kept, released)  # 98 MiB of free heap pages returned


def test_the_release_stage_and_the_reader_are_scratch_passes():
    from beam_dp.beam.shell import batch_release
    from beam_dp.io import sources

    assert "with scratch_heap():" in inspect.getsource(batch_release._scratch)
    assert "_scratch(driver." in inspect.getsource(batch_release.KeyReleaseDoFn._close)
    assert "with scratch_heap():" in inspect.getsource(sources._ReadEventFile._convert)


# In a new process: 200 blocks of 256 KiB (below the mmap threshold: the heap's top grows) freed at once;
# print the resident MB after the free, then after release_free_heap. glibc's own trim threshold once the
# mmap threshold is set is 128 KiB (the top given back at each free); fixed at TRIM_THRESHOLD, free space at
# the top stays for the next allocations until the bundle's end releases it.
_TOP = """
import sys
from beam_dp.heap import limit_heap_retention, release_free_heap
assert limit_heap_retention()
def resident():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) >> 10
blocks = [b"\\1" * (256 << 10) for _ in range(200)]
del blocks
kept = resident()
release_free_heap()
print(kept, resident())
"""


def test_free_space_at_the_heap_top_is_kept_until_released():
    kept, released = map(int, subprocess.run([sys.executable, "-c", _TOP], capture_output=True, text=True,
                                             check=True).stdout.split())
    assert kept - released > 40, (kept, released)  # ~50 MiB reused by the next pass, not faulted in again
