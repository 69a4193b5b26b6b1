"""Black-box audits at the unit level: neighbouring inputs differ in one privacy unit's whole bounded
contribution (−R → +R in each (stream, step) of its worst pattern), on the harness ``beam_dp.testing.audit``.

* The default Gaussian counter (BLT): the unit takes ``k = 3`` steps ``b = 2`` apart (the earliest
  pattern, the worst for a factorization counter) in each of ``m = 2`` streams; n = 200,000 independent
  1-D experiments as the coordinates of one run per stream (each stream its own noise cells).
* The default pure counter (the fitted k-ary tree): ``m = 2`` streams at step 1, ``k = 1`` (pure noise
  pays ``F = m·k``, attained by one step in each of ``m·k`` streams); independent runs as one group step
  of many streams per unit stream.

The statistic is the Gaussian log-likelihood-ratio direction over the concatenated releases of the
unit's streams; the 95% Clopper–Pearson lower bound on ε must stay <= the claim, and the mutant whose
noise is calibrated at the event level (``ScaledNoise(key, 1/F)``) must be flagged above it.
"""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import (
    ScaledNoise,
    audit_with_mutant,
    linear_statistic_weights,
    release_matrix,
    run_stream,
    seeded_key,
)

R = 0.5
EPSILON, DELTA = 1.0, 1e-5


def _blocks(steps: int, pattern: list[int], value: np.ndarray) -> list:
    return [ClippedSum(value, len(value), 0) if t in pattern else None for t in range(1, steps + 1)]


def _unit_samples(make, steps: int, patterns: dict[str, list[int]], n: int):
    """``sample(factor)``: n 1-D experiments as the coordinates of one run per stream of the unit
    (``patterns``: stream -> its 1-based steps), releases of all streams concatenated."""
    mech, small, wide = make(n), make(1), make(20_000)

    def releases(mechanism, value, salt, noise_of, dim):
        return np.concatenate([release_matrix(run_stream(mechanism, _blocks(steps, pattern, np.full(dim, value)),
                                                         noise_of(salt + stream.encode()), stream))
                               for stream, pattern in patterns.items()])

    m_d = releases(small, -R, b"", lambda _: ZeroNoise(), 1)[:, 0]
    m_dp = releases(small, R, b"", lambda _: ZeroNoise(), 1)[:, 0]

    def sample(factor: float):
        def noisy(salt):
            return ScaledNoise(seeded_key(0, salt), factor)

        w = linear_statistic_weights(m_d, m_dp, releases(wide, 0.0, b"cov", noisy, 20_000).T)
        x = w @ (releases(mech, -R, b"D", noisy, n) - m_d[:, None])
        y = w @ (releases(mech, R, b"D'", noisy, n) - m_d[:, None])
        return x, y

    return sample


def _group_releases(mech, steps: int, pattern: list[int], value: float, runs: int, stream: str, noise) -> np.ndarray:
    """``(runs, steps)``: the releases of ``runs`` streams of one group step, each fed the unit's pattern."""
    group, columns = mech.init_group([f"{stream}-{i}" for i in range(runs)]), []
    for t in range(1, steps + 1):
        sums, counts = np.zeros((runs, 1)), np.zeros(runs, dtype=np.int64)
        if t in pattern:
            sums[:], counts[:] = value, 1
        group, batch = mech.step_group(group, sums, counts, noise)
        columns.append(batch.values[:, 0])
    return np.stack(columns, axis=1)


def _pure_unit_samples(mech, steps: int, patterns: dict[str, list[int]], runs: int):
    def releases(value, n, salt, factor):
        return np.concatenate([_group_releases(mech, steps, pattern, value, n, stream,
                                               ScaledNoise(seeded_key(0, salt + stream.encode()), factor))
                               for stream, pattern in patterns.items()], axis=1)

    def mean(value):
        return np.concatenate([_group_releases(mech, steps, pattern, value, 1, stream, ZeroNoise())[0]
                               for stream, pattern in patterns.items()])

    m_d, m_dp = mean(-R), mean(R)

    def sample(factor: float):
        w = linear_statistic_weights(m_d, m_dp, releases(-R, max(runs // 4, 500), b"cov", factor) - m_d)
        return (releases(-R, runs, b"D", factor) - m_d) @ w, (releases(R, runs, b"D'", factor) - m_d) @ w

    return sample


def test_gaussian_blt_unit_audit():
    unit = PrivacyUnit("user", max_streams_per_step=2, max_contributions_per_step=1, max_steps=3, min_separation=2)
    clock = StepClock(start=0.0, period=1.0, end=16.0)

    def make(dim: int):
        params = ContinualSumParams(clock=clock, dim=dim, clip_bound=R, epsilon=EPSILON, delta=DELTA,
                                    noise="gaussian").with_privacy_unit(unit)
        return params.build_mechanism()

    factor = ContinualSumParams(clock=clock, clip_bound=R, epsilon=EPSILON, delta=DELTA, noise="gaussian"
                                ).with_privacy_unit(unit).unit_factor.factor
    assert factor > 2  # the unit-level noise is well above the event level's
    pattern = [1, 3, 5]  # the earliest pattern of k = 3 steps b = 2 apart
    report = audit_with_mutant("blt, unit (m=2, k=3, b=2)", _unit_samples(make, 16, {"a": pattern, "b": pattern},
                                                                           200_000),
                               EPSILON, DELTA, mutant_factor=1.0 / factor)
    print("\n" + report.row())
    assert report.honest_ok, report
    assert report.mutant_caught, report


@pytest.mark.slow
def test_pure_kary_unit_audit():
    unit = PrivacyUnit("user", max_streams_per_step=2, max_contributions_per_step=1, max_steps=1)
    params = ContinualSumParams(clock=StepClock(start=0.0, period=1.0, end=8.0), clip_bound=R,
                                epsilon=EPSILON).with_privacy_unit(unit)
    assert params.unit_factor.factor == 2
    report = audit_with_mutant("kary, unit (m=2, k=1)", _pure_unit_samples(params.build_mechanism(), 8,
                                                                           {"a": [1], "b": [1]}, 20_000),
                               EPSILON, mutant_factor=0.5)
    print("\n" + report.row())
    assert report.honest_ok, report
    assert report.mutant_caught, report
