"""Numeric limits of the public parameters and inputs, and the checks that enforce them.

Every check raises ``ValueError`` naming the field and its allowed range, so a parameter that cannot
work (a clip bound or an epsilon whose noise overflows float64, a zero window, an empty stream set, a
clock beyond the int64-microsecond range of Beam's event times) is refused when the params object is
built, never at run time. Inputs beyond these limits are dead-lettered, never a crash.

Why these numbers:

* ``MAX_ABS_SECONDS = 1e12`` (about year 33 600): event times are int64 microseconds (as in Beam);
  ±1e12 s keeps every time and every difference of two times (≤ 2e18 µs) inside int64 (9.2e18).
* ``MAX_COUNT = 2**62``: sizes, steps, windows and query sizes stay int64 with room for a sum of two.
* ``MAX_DIM = 10**7``: one float64 vector per stream state; larger vectors exhaust worker memory.
* ``EPSILON_RANGE = [1e-9, 1e9]`` and ``MAX_SCALE = 1e100`` for clip bounds and model scales: within
  these the noise scales (Δ·levels/ε, squared in variances) stay far inside float64.
* ``MAX_NOISE_STD = 1e150``: a release whose noise std is larger carries no information and its
  variance or its sums overflow float64.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

__all__ = ["EPSILON_RANGE", "MAX_ABS_SECONDS", "MAX_COUNT", "MAX_DIM", "MAX_NOISE_STD", "MAX_SCALE",
           "check_clock", "check_count", "check_noise_std", "check_number", "check_streams", "is_utf8"]

MAX_ABS_SECONDS = 1e12
MAX_COUNT = 2**62
MAX_DIM = 10**7
EPSILON_RANGE = (1e-9, 1e9)
MAX_SCALE = 1e100
MAX_NOISE_STD = 1e150


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (no lone surrogates): stream ids and keys must be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """``value`` as a float in ``[low, high]`` (``(low, high]`` with ``low_open``), else ``ValueError``."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    number = float(value) if abs(value) < 1e309 else math.copysign(math.inf, value)
    if not (math.isfinite(number) and (number > low if low_open else number >= low) and number <= high):
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return number


def check_count(name: str, value: Any, low: int = 1, high: int = MAX_COUNT) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high if high != MAX_COUNT else '2**62'}], got {value!r}")
    return int(value)


def check_streams(streams: Any) -> tuple[str, ...] | None:
    """``None`` (any stream) or a non-empty tuple of distinct non-empty UTF-8 strings, else ``ValueError``."""
    if streams is None:
        return None
    if isinstance(streams, (str, bytes)) or not isinstance(streams, Iterable):
        raise ValueError("streams must be None (any stream) or a non-empty tuple of non-empty strings")
    streams = tuple(streams)
    if not streams:
        raise ValueError("streams must be None (any stream) or a non-empty tuple of non-empty strings, got ()")
    if not all(isinstance(s, str) and s and is_utf8(s) for s in streams):
        raise ValueError("streams must be a tuple of non-empty strings encodable as UTF-8")
    return tuple(dict.fromkeys(streams))


def check_clock(clock: Any) -> None:
    """The clock's start, end and period must lie within ±``MAX_ABS_SECONDS`` (int64 microseconds)."""
    if clock is None:
        return
    for name in ("start", "end", "period"):
        value = getattr(clock, name)
        if value is not None:
            check_number(f"clock.{name}", value, -MAX_ABS_SECONDS, MAX_ABS_SECONDS)


def check_noise_std(std: float, fields: str) -> None:
    """Refuse a release noise std that is not finite or above ``MAX_NOISE_STD`` (naming ``fields``)."""
    if not (math.isfinite(std) and std <= MAX_NOISE_STD):
        raise ValueError(f"{fields}: the release noise std would be {std:.3g} (allowed: at most {MAX_NOISE_STD:g}); "
                         "raise epsilon or lower clip_bound")
