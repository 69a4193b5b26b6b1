"""Heap retention of a local run, and scratch space for vectorised passes (glibc only; a no-op elsewhere).

glibc's ``malloc`` moves its mmap threshold up (to 32 MiB) once large blocks are freed, after which a
job's long-lived blocks (accumulators, decoded shuffle blocks) and its temporaries share the heap and
fragment it, and freed memory stays in the process. :func:`limit_heap_retention` fixes the threshold
(:data:`MMAP_THRESHOLD`, 1 MiB): every larger allocation is a mapping of its own, returned to the
system when freed (the peak RSS this saves is measured in docs/benchmarks.md).

The price is that every large temporary is fresh pages: the kernel maps and zeroes them on first touch
(~5 µs a 4 KiB page on the 2-core machine of docs/benchmarks.md). Two settings keep that price down:

* fixing the mmap threshold also fixes glibc's trim threshold (128 KiB: any free space above it at the
  heap's top is given back at once, to be faulted in again by the next allocation); it is fixed at
  :data:`TRIM_THRESHOLD` (64 MiB) instead, and :func:`release_free_heap` gives everything back at each
  bundle's end. With 1 MiB and 64 MiB: 10,000 × 200, 416k → 239k page faults, 1 s less CPU, the same
  peak; 50M events (10,000 × 1,000), 106 → 91 s of CPU, peak 771 → 798 MB;
* a vectorised pass over a batch of events, or a release stage's chunk of steps, makes dozens of
  temporaries and frees them all by its end: :func:`scratch_heap` raises the mmap threshold for such a
  pass, so its temporaries come from the heap and are reused by the next pass, and puts it back before
  the pass's results are handed on, so blocks that outlive it are mappings again.

It does something only in a process where :func:`limit_heap_retention` was called (local runs): a worker
process of a distributed runner keeps its allocator as it is.

The thresholds are settings of this process's allocator, not job state: nothing is derived from them.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Any, Iterator

__all__ = ["MMAP_THRESHOLD", "SCRATCH_THRESHOLD", "TRIM_THRESHOLD", "limit_heap_retention", "release_free_heap",
           "scratch_heap"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 20  # bytes: allocations above it are mappings of their own, kept fixed
TRIM_THRESHOLD = 64 << 20  # bytes: free space at the heap's top kept for reuse (until release_free_heap)
SCRATCH_THRESHOLD = 32 << 20  # bytes: glibc's largest dynamic threshold, inside a scratch pass

_fixed: tuple[int, Any] | None = None  # (threshold, mallopt) once limit_heap_retention fixed one here
_trim: Any = None  # glibc's malloc_trim, found with mallopt


def _mallopt():
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def limit_heap_retention(threshold: int = MMAP_THRESHOLD, trim: int = TRIM_THRESHOLD) -> bool:
    """Fix the C library's mmap threshold at ``threshold`` bytes and its trim threshold at ``trim`` bytes
    for this process; ``False`` where the C library has no ``mallopt`` (not glibc: no change) or refuses
    a value (glibc refuses neither)."""
    global _fixed, _trim
    mallopt = _mallopt()
    if mallopt is None or not mallopt(_M_MMAP_THRESHOLD, int(threshold)) or not mallopt(_M_TRIM_THRESHOLD, int(trim)):
        return False
    _fixed = (int(threshold), mallopt)
    _trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return True


def release_free_heap() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``): at the end of each bundle
    of a local run (``pipelines.local_shuffle``) and once the job has run. The heap a stage's scratch
    passes grew, and the
    holes mid-sized blocks (names, counts) leave, are otherwise kept by the process through the later
    stages (the 50M-event job: ~350 MB). Only where :func:`limit_heap_retention` fixed a threshold
    (local runs). Arrow's memory pool gives back its unused pages at the same time."""
    if _fixed is None:
        return
    if _trim is not None:
        _trim(0)
    arrow = sys.modules.get("pyarrow")  # Arrow's own pool (mimalloc) keeps freed pages too
    if arrow is not None:
        arrow.default_memory_pool().release_unused()


@contextlib.contextmanager
def scratch_heap() -> Iterator[None]:
    """Within the block, allocations up to :data:`SCRATCH_THRESHOLD` come from the heap (reused, not
    fresh pages); the fixed threshold is back on exit. Only where :func:`limit_heap_retention` fixed
    one; otherwise nothing changes. Keep what outlives the block small, or copy it after."""
    if _fixed is None:
        yield
        return
    threshold, mallopt = _fixed
    mallopt(_M_MMAP_THRESHOLD, SCRATCH_THRESHOLD)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, threshold)
