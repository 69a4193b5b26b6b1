"""``pipelines.heap``: a local run fixes glibc's mmap threshold, so freed large blocks go back to the system."""

from __future__ import annotations

import inspect
import platform
import subprocess
import sys

import pytest

from pipelines import runner

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# In a new process (the setting is process-wide): free a 16 MiB block (glibc then raises its dynamic mmap
# threshold to 16 MiB), allocate 100 blocks of 1 MiB, free all but the last, print the resident MB. With the
# dynamic threshold the blocks come from the heap and stay resident below the last one (~100 MB); with the
# threshold fixed at 128 KiB each is a mapping of its own, unmapped when freed.
_PROBE = """
import sys
from pipelines.heap import limit_heap_retention
if sys.argv[1] == "fixed":
    assert limit_heap_retention()
big = b"\\1" * (16 << 20)
del big
blocks = [b"\\1" * (1 << 20) for _ in range(100)]
keep = blocks[-1]
del blocks
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) >> 10)
"""


def _resident_mb(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                              check=True).stdout)


def test_freed_large_blocks_leave_the_process_once_the_threshold_is_fixed():
    dynamic, fixed = _resident_mb("dynamic"), _resident_mb("fixed")
    # 99 MiB freed: resident in the dynamic case, returned in the fixed one (interpreter ~10-20 MB either way)
    assert dynamic - fixed > 80, (dynamic, fixed)


def test_a_local_run_sets_it():
    source = inspect.getsource(runner._launch)
    assert "limit_heap_retention()" in source.split("if local:", 1)[1].split("with RunOutputs", 1)[0]
