"""Event-time steps: the public schedule that turns timestamps into step numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from beam_dp.core.limits import (
    MAX_ABS_SECONDS,
    MAX_STEPS,
    MAX_STREAM_STEPS,
    check_count,
    check_number,
    check_step_count,
)

__all__ = ["StepClock"]

_MICROS = 1_000_000


@dataclass(frozen=True)
class StepClock:
    """Step ``t`` covers event times ``[start + (t-1)·period, start + t·period)`` (seconds).

    ``end`` (exclusive, optional) is the public end of a batch replay: the last step is the one
    that contains ``end - 1µs``. Times are handled in integer microseconds, as Beam does, so step
    boundaries are exact. The schedule (start, period, end) is public; it never depends on data.

    Size caps (public, see :mod:`beam_dp.core.limits`): a bounded schedule has at most ``max_steps``
    steps per stream (refused here, in O(1)), and at most ``max_stream_steps`` steps times declared
    streams (checked by the params, which know the streams).
    """

    start: float
    period: float
    end: float | None = None
    max_steps: int = MAX_STEPS
    max_stream_steps: int = MAX_STREAM_STEPS

    def __post_init__(self) -> None:
        if not math.isfinite(self.start):
            raise ValueError(f"start must be finite, got {self.start!r}")
        if not (math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"period must be a finite number of seconds > 0, got {self.period!r}")
        if self.period * _MICROS < 1:
            raise ValueError("period must be at least one microsecond")
        if self.end is not None and not (math.isfinite(self.end) and self.end > self.start):
            raise ValueError(f"end must be finite and after start, got {self.end!r}")
        for name in ("start", "end"):  # event times are int64 microseconds
            if getattr(self, name) is not None:
                check_number(f"{name} (epoch seconds)", getattr(self, name), -MAX_ABS_SECONDS, MAX_ABS_SECONDS)
        check_count("max_steps", self.max_steps)
        check_count("max_stream_steps", self.max_stream_steps)
        if self.end is not None and self.last_step is not None:
            check_step_count(self.last_step, self.max_steps,
                             f"start {self.start:g} s, period {self.period:g} s, end {self.end:g} s")

    @property
    def start_micros(self) -> int:
        return round(self.start * _MICROS)

    @property
    def period_micros(self) -> int:
        return round(self.period * _MICROS)

    @property
    def last_step(self) -> int | None:
        """Number of steps in ``[start, end)``, or ``None`` for an open-ended stream."""
        if self.end is None:
            return None
        return int(self.step_of_micros(round(self.end * _MICROS) - 1))

    def step_of_micros(self, micros: int | np.ndarray) -> int | np.ndarray:
        """Step number of event times in integer microseconds (vectorised); may be < 1 or > last_step."""
        return (np.asarray(micros, dtype=np.int64) - self.start_micros) // self.period_micros + 1

    def step_of(self, seconds: float | np.ndarray) -> int | np.ndarray:
        """Step number of event times in seconds (vectorised)."""
        return self.step_of_micros(np.round(np.asarray(seconds, dtype=np.float64) * _MICROS).astype(np.int64))

    def step_start_micros(self, step: int) -> int:
        return self.start_micros + (int(step) - 1) * self.period_micros

    def step_end_micros(self, step: int) -> int:
        """Exclusive end of ``step`` in microseconds: the watermark must pass it to close the step."""
        return self.start_micros + int(step) * self.period_micros

    def classify_micros(self, micros: np.ndarray) -> np.ndarray:
        """Per timestamp: 0 = in schedule, -1 = before start, +1 = at or after end."""
        micros = np.asarray(micros, dtype=np.int64)
        out = np.zeros(micros.shape, dtype=np.int8)
        out[micros < self.start_micros] = -1
        if self.end is not None:
            out[micros >= round(self.end * _MICROS)] = 1
        return out
