"""Event-time step schedule (ARCHITECTURE §5; beam_dp/core/clock.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from beam_dp.core.clock import StepClock

US = 1e-6


@pytest.mark.parametrize("start,period", [(0.0, 1.0), (100.0, 10.0), (1_700_000_000.123456, 3600.0), (-50.5, 0.25)])
def test_step_boundaries_seconds(start, period):
    c = StepClock(start, period)
    assert c.step_of(start) == 1
    assert c.step_of(start + period - US) == 1
    assert c.step_of(start + period) == 2
    assert c.step_of(start + 2 * period - US) == 2
    assert c.step_of(start + 5 * period) == 6
    assert c.step_of(start - US) == 0
    assert c.step_of(start - period) == 0
    assert c.step_of(start - period - US) == -1


def test_step_boundaries_micros():
    c = StepClock(100.0, 10.0)
    s, p = c.start_micros, c.period_micros
    assert (s, p) == (100_000_000, 10_000_000)
    assert c.step_of_micros(s) == 1
    assert c.step_of_micros(s + p - 1) == 1
    assert c.step_of_micros(s + p) == 2
    assert c.step_of_micros(s - 1) == 0
    assert c.step_of_micros(s - p - 1) == -1
    for t in (1, 2, 7, 1000):
        assert c.step_start_micros(t) == s + (t - 1) * p
        assert c.step_end_micros(t) == s + t * p
        assert c.step_of_micros(c.step_start_micros(t)) == t
        assert c.step_of_micros(c.step_end_micros(t) - 1) == t
        assert c.step_of_micros(c.step_end_micros(t)) == t + 1


def test_step_of_vectorised_matches_scalar():
    c = StepClock(10.0, 0.5)
    rng = np.random.default_rng(0)
    times = np.concatenate([rng.uniform(0.0, 40.0, 500), [10.0, 10.5 - US, 10.5, 9.5, 9.5 - US]])
    steps = c.step_of(times)
    assert steps.shape == times.shape and steps.dtype == np.int64
    assert steps.tolist() == [int(c.step_of(float(t))) for t in times]
    expected = np.floor((np.round(times * 1e6) - 10_000_000) / 500_000).astype(np.int64) + 1
    assert np.array_equal(steps, expected)
    grid = c.step_of(np.array([[10.0, 10.5], [9.9, 11.0]]))
    assert grid.tolist() == [[1, 2], [0, 3]]
    micros = c.step_of_micros(np.array([10_000_000, 10_499_999, 10_500_000, 9_999_999]))
    assert micros.tolist() == [1, 1, 2, 0]


def test_negative_steps_before_start():
    c = StepClock(1000.0, 100.0)
    assert c.step_of(np.array([999.999999, 900.0, 899.999999, 800.0, 0.0])).tolist() == [0, 0, -1, -1, -9]


def test_last_step():
    assert StepClock(0.0, 1.0).last_step is None
    c = StepClock(100.0, 10.0, end=130.0)  # exactly three steps [100,110), [110,120), [120,130)
    assert c.last_step == 3 and isinstance(c.last_step, int)
    assert c.step_of(130.0 - US) == 3 and c.step_of(130.0) == 4
    assert StepClock(100.0, 10.0, end=130.000001).last_step == 4  # one microsecond of step 4
    assert StepClock(100.0, 10.0, end=125.0).last_step == 3
    assert StepClock(100.0, 10.0, end=100.5).last_step == 1


def test_classify_micros():
    c = StepClock(100.0, 10.0, end=130.0)
    micros = np.array([99_999_999, 100_000_000, 129_999_999, 130_000_000, 200_000_000, 0])
    out = c.classify_micros(micros)
    assert out.dtype == np.int8
    assert out.tolist() == [-1, 0, 0, 1, 1, -1]
    open_ended = StepClock(100.0, 10.0)
    assert open_ended.classify_micros(micros).tolist() == [-1, 0, 0, 0, 0, -1]
    assert c.classify_micros(np.zeros((2, 2), dtype=np.int64)).shape == (2, 2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start": math.nan, "period": 1.0},
        {"start": math.inf, "period": 1.0},
        {"start": 0.0, "period": 0.0},
        {"start": 0.0, "period": -1.0},
        {"start": 0.0, "period": math.nan},
        {"start": 0.0, "period": math.inf},
        {"start": 0.0, "period": 0.5e-6},  # less than one microsecond
        {"start": 10.0, "period": 1.0, "end": 10.0},
        {"start": 10.0, "period": 1.0, "end": 5.0},
        {"start": 10.0, "period": 1.0, "end": math.nan},
        {"start": 10.0, "period": 1.0, "end": math.inf},
    ],
)
def test_invalid_parameters(kwargs):
    with pytest.raises(ValueError):
        StepClock(**kwargs)


def test_clock_is_frozen_and_hashable():
    c = StepClock(0.0, 1.0)
    assert c == StepClock(0.0, 1.0) and hash(c) == hash(StepClock(0.0, 1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.period = 2.0


def test_a_schedule_above_the_public_step_cap_is_refused_at_once():
    """Issue 25.4: 10^18 steps (--period 1e-6 --end 1e12) is refused in O(1), naming the numbers and
    the knob; at the cap it is accepted, and max_steps raises it. (Mutant checked: dropping the check
    in StepClock.__post_init__ fails the first assertion.)"""
    import time

    from beam_dp.core.limits import MAX_STEPS

    began = time.perf_counter()
    with pytest.raises(ValueError) as exc:
        StepClock(0.0, 1e-6, end=1e12)
    assert time.perf_counter() - began < 1.0
    assert "1,000,000,000,000,000,000 steps per stream" in str(exc.value)
    assert f"{MAX_STEPS:,}" in str(exc.value) and "max_steps" in str(exc.value) and "--max-steps" in str(exc.value)
    assert StepClock(0.0, 1.0, end=float(MAX_STEPS)).last_step == MAX_STEPS
    with pytest.raises(ValueError, match="steps per stream"):
        StepClock(0.0, 1.0, end=float(MAX_STEPS) + 1.0)
    assert StepClock(0.0, 1e-6, end=1e12, max_steps=10**18).last_step == 10**18
    assert StepClock(0.0, 1e-6).last_step is None  # open-ended (streaming): no schedule size to check
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_steps"):
            StepClock(0.0, 1.0, end=10.0, max_steps=bad)


def test_steps_times_declared_streams_above_the_cap_are_refused():
    """Issue 25.4: the total over the declared streams, checked where the streams are known (params)."""
    from beam_dp.beam import ContinualSumParams

    clock = StepClock(0.0, 1.0, end=1000.0, max_stream_steps=2500)
    ContinualSumParams(dim=1, clip_bound=1.0, epsilon=1.0, clock=clock, streams=("a", "b"))  # 2,000 stream-steps
    with pytest.raises(ValueError) as exc:
        ContinualSumParams(dim=1, clip_bound=1.0, epsilon=1.0, clock=clock, streams=("a", "b", "c"))
    assert "1,000 steps x 3 declared streams = 3,000 stream-steps" in str(exc.value)
    assert "2,500" in str(exc.value) and "--max-stream-steps" in str(exc.value)
