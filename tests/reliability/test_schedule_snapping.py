"""The release schedule never depends on the data, even with snapping at extreme granularities.

Before: a snapped value beyond 2^52 grid units was refused, so with a fine granularity data + noise
could cross the limit on one input and not on its neighbour (the issue measured 28 of 200 trials). Now
units are exact integers at any size and the release is the float nearest the exact grid value
(post-processing), so every step releases on both neighbours, and the grid value stays exact.
"""

from fractions import Fraction

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.grid import add_units, from_grid_units, to_grid_units
from beam_dp.testing.audit import run_stream, seeded_key
from tests.beam import collect

CLOCK = StepClock(start=0.0, period=1.0, end=32.0)


@pytest.mark.parametrize("granularity", [2.0**-60, 2.0**-30, 1e-300, 2.0**40])
def test_neighbours_release_every_step_at_extreme_granularities(granularity):
    params = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1e6, clock=CLOCK, granularity=granularity)
    mechanism = params.build_mechanism()
    rng = np.random.default_rng(0)
    for trial in range(50):
        blocks = [rng.uniform(-1e6, 1e6, (3, 2)) for _ in range(32)]
        neighbour = [b.copy() for b in blocks]
        neighbour[trial % 32][0] = -neighbour[trial % 32][0]  # replace one contribution
        noise = NoiseSource(seeded_key(trial))
        steps_d = [r.step for r in run_stream(mechanism, blocks, noise)]
        steps_dp = [r.step for r in run_stream(mechanism, neighbour, noise)]
        assert steps_d == steps_dp == list(range(1, 33))


def test_grid_arithmetic_is_exact_beyond_int64():
    grid = 2.0**-70
    values = np.array([1e6 + 0.1, -3.5e5])
    units = to_grid_units(values, grid)
    assert units.dtype == object
    assert [Fraction(int(u)) * Fraction(grid) for u in units] == [Fraction(round(Fraction(v) / Fraction(grid))) *
                                                                 Fraction(grid) for v in values]
    total = add_units(units, to_grid_units(np.array([2.0**-70, 0.0]), grid))
    assert int(total[0]) == int(units[0]) + 1
    # the release is the float nearest the exact grid value
    assert from_grid_units(total, grid)[0] == float(Fraction(int(total[0])) * Fraction(grid))
    # small values keep the int64 fast path
    assert to_grid_units(np.array([3.0]), 0.5).dtype == np.int64


def test_a_fine_granularity_releases_every_step_in_beam(monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1e9, clock=CLOCK, granularity=2.0**-80)
    events = [("s", float(t) + 0.5, 1e9 - t) for t in range(32)]
    rows = collect.run(lambda p: (p | beam.Create(events) | ContinualSum(params)).releases)
    assert [r.step for r in rows] == list(range(1, 33))
    dead = collect.run(lambda p: (p | beam.Create(events) | ContinualSum(params)).dead_letter)
    assert dead == []
