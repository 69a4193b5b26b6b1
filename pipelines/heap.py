"""Heap retention of a local run: glibc's ``malloc`` moves its mmap threshold up (to 32 MiB) once large
blocks are freed, after which the job's large temporaries (parse columns, accumulators, decoded shuffle
blocks) come from the heap and fragment it, and freed memory stays in the process. Fixing the
threshold makes every allocation above it a mapping of its own, returned to the system when freed
(issue 26.1: 10M events, 10,000 streams × 200 steps, peak RSS 1,219 → 1,033 MB; docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes

__all__ = ["MMAP_THRESHOLD", "limit_heap_retention"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 << 10  # bytes: glibc's initial threshold, kept fixed


def limit_heap_retention(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix the C library's mmap threshold at ``threshold`` bytes for this process; ``False`` (and no
    change) where the C library has no ``mallopt`` (not glibc) or refuses the value."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
