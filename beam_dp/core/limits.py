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
* ``MAX_WINDOW_CELLS = 2**24``: a window tree keeps one dim-vector per step of its window (128 MiB).
* ``EPSILON_RANGE = [1e-9, 1e9]`` and ``[MIN_SCALE, MAX_SCALE] = [1e-100, 1e100]`` for clip bounds and
  model scales: within these the noise scales (Δ·levels/ε, squared in variances) stay far inside float64.
* ``LAMBDA_RANGE = [1e-12, 1e12]``: the ERM regulariser; the model sensitivity 2L/(λn) and the
  regularised solve stay finite and well conditioned.
* ``MAX_NOISE_STD = 1e150``: a release whose noise std is larger carries no information and its
  variance or its sums overflow float64.
* ``MAX_STEPS = 10**7`` steps per stream and ``MAX_STREAM_STEPS = 10**10`` steps in total over the
  declared streams, for a bounded event-time schedule: every step releases (empty ones included), so
  the work grows with steps × streams whatever the data; at the measured ~10–100 µs per stream-step
  these are hours of CPU. A larger schedule is usually a typo (``--period 1e-6 --end 1e12`` is 10¹⁸
  steps) and is refused at once with the numbers; raise a cap on purpose with
  ``StepClock(max_steps=..., max_stream_steps=...)`` or the jobs' ``--max-steps`` /
  ``--max-stream-steps``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

__all__ = ["EPSILON_RANGE", "LAMBDA_RANGE", "MAX_ABS_SECONDS", "MAX_COUNT", "MAX_DIM", "MAX_WINDOW_CELLS", "MAX_NOISE_STD", "MAX_SCALE", "MIN_SCALE",
           "MAX_STEPS", "MAX_STREAM_STEPS", "check_choice", "check_clock", "check_step_count", "check_count", "check_delta", "check_window", "check_noise_std", "check_number", "check_streams", "is_utf8"]

MAX_ABS_SECONDS = 1e12
MAX_COUNT = 2**62
MAX_DIM = 10**7
MAX_WINDOW_CELLS = 2**24
EPSILON_RANGE = (1e-9, 1e9)
LAMBDA_RANGE = (1e-12, 1e12)
MAX_SCALE = 1e100
MIN_SCALE = 1e-100
MAX_NOISE_STD = 1e150
MAX_STEPS = 10**7
MAX_STREAM_STEPS = 10**10


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
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64
        number = math.inf
    if not (math.isfinite(number) and (number > low if low_open else number >= low) and number <= high):
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return number


def check_count(name: str, value: Any, low: int = 1, high: int = MAX_COUNT) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high if high != MAX_COUNT else '2**62'}], got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of the strings ``choices``, else ``ValueError`` naming them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_window(window: Any, dim: int) -> int:
    """A window tree's window: an int in [1, ``MAX_WINDOW_CELLS`` // dim] (its buffers hold window × dim floats)."""
    return check_count("window", window, 1, max(1, MAX_WINDOW_CELLS // max(1, int(dim))))


def check_delta(delta: Any) -> float:
    """δ = 0 (pure ε) or δ in [``MIN_SCALE``, 1] (the guarantee refuses δ = 1), else ``ValueError``."""
    if isinstance(delta, (int, float, np.integer, np.floating)) and not isinstance(delta, bool) and delta == 0:
        return 0.0
    return check_number("delta", delta, MIN_SCALE, 1.0)


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


def check_clock(clock: Any, streams: tuple[str, ...] | None = None) -> None:
    """The clock's start, end and period must lie within ±``MAX_ABS_SECONDS`` (int64 microseconds),
    and a bounded schedule times the declared ``streams`` within the clock's ``max_stream_steps``."""
    if clock is None:
        return
    for name in ("start", "end", "period"):
        value = getattr(clock, name)
        if value is not None:
            check_number(f"clock.{name}", value, -MAX_ABS_SECONDS, MAX_ABS_SECONDS)
    last = clock.last_step
    if last is not None and isinstance(streams, (tuple, list)) and streams:
        total = last * len(streams)
        if total > clock.max_stream_steps:
            raise ValueError(f"the schedule has {last:,} steps x {len(streams):,} declared streams = {total:,} "
                             f"stream-steps, above the limit of {clock.max_stream_steps:,}; raise it with "
                             "max_stream_steps= on the StepClock (jobs: --max-stream-steps) if this is intended")


def check_step_count(steps: int, max_steps: int, schedule: str) -> None:
    """Refuse a bounded schedule of more than ``max_steps`` steps per stream, naming the numbers."""
    if steps > max_steps:
        raise ValueError(f"the schedule has {steps:,} steps per stream ({schedule}), above the limit of "
                         f"{max_steps:,}; raise it with max_steps= on the StepClock (jobs: --max-steps) "
                         "if this is intended")


def check_noise_std(std: float, fields: str) -> None:
    """Refuse a release noise std that is not finite or above ``MAX_NOISE_STD`` (naming ``fields``)."""
    if not (math.isfinite(std) and std <= MAX_NOISE_STD):
        raise ValueError(f"{fields}: the release noise std would be {std:.3g} (allowed: at most {MAX_NOISE_STD:g}); "
                         "raise epsilon or lower clip_bound")
