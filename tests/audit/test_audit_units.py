"""Black-box audits at the unit level: neighbouring inputs differ in one privacy unit's whole bounded
contribution (−R → +R in each (stream, step) of its worst pattern), on the harness ``beam_dp.testing.audit``.

* The default Gaussian counter (BLT): the unit takes ``k = 3`` steps ``b = 2`` apart (the earliest
  pattern, the worst for a factorization counter) in each of ``m = 2`` streams; n = 200,000 independent
  1-D experiments as the coordinates of one run per stream (each stream its own noise cells).
* The default pure counter (the fitted k-ary tree): ``m = 2`` streams at step 1, ``k = 1`` (pure noise
  pays ``F = m·k``, attained by one step in each of ``m·k`` streams); independent runs as one group step
  of many streams per unit stream.
* The window tree (Gaussian, the window rule): ``k = 4`` steps inside one window of ``W = 8`` in each of
  ``m = 2`` streams, audited on the releases while every step of the pattern is protected.

The statistic is the Gaussian log-likelihood-ratio direction over the concatenated releases of the
unit's streams; the 95% Clopper–Pearson lower bound on ε must stay <= the claim, and the mutant whose
noise is calibrated at the event level (``ScaledNoise(key, 1/F)``) must be flagged above it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams, WindowedSumParams
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


def _release_losses(mech, horizon: int, patterns) -> list[float]:
    """mu² over one node's ``(Δ₂/σ)²`` of each pattern (its steps moved by ``Δ₂``) seen in the releases
    ``1..horizon`` of the window tree ``mech``: ``Δmᵀ (AAᵀ)⁺ Δm``, ``A`` the release-by-node incidence
    (``nodes_used``), ``Δm`` the pattern's steps up to each release."""
    used = [mech.nodes_used(t) for t in range(1, horizon + 1)]
    index = {node: i for i, node in enumerate(sorted({node for nodes in used for node in nodes}))}
    incidence = np.zeros((horizon, len(index)))
    for t, nodes in enumerate(used):
        incidence[t, [index[node] for node in nodes]] = 1.0
    gram = incidence @ incidence.T
    inverse = np.linalg.pinv(gram, hermitian=True)
    moved = np.array([np.searchsorted(p, np.arange(1, horizon + 1), side="right") for p in patterns], float)
    assert np.allclose(moved @ inverse @ gram, moved)  # no step of a pattern is in a release's clean part
    return list(np.einsum("pt,ts,ps->p", moved, inverse, moved))


def test_window_tree_audit_pattern_is_the_worst_the_rule_admits():
    """Every pattern of at most ``k = 4`` steps within the ``B = W = 8`` steps protected at a horizon (the
    window rule), every horizon up to ``3B``: ``k`` consecutive steps from a block's first step, seen at
    horizon ``B``, move the releases most, and the calibration's ``G`` covers them."""
    k, clock = 4, StepClock(start=0.0, period=1.0, end=24.0)
    params = WindowedSumParams(clock=clock, window=8, epsilon=EPSILON, delta=DELTA, noise="gaussian")
    mech = params.build_mechanism()
    losses = {}
    for horizon in range(1, 3 * mech.block):
        protected = range(max(1, horizon - mech.block + 1), horizon + 1)
        patterns = [p for r in range(1, k + 1) for p in itertools.combinations(protected, r)]
        losses.update(zip([(horizon, p) for p in patterns], _release_losses(mech, horizon, patterns)))
    single = max(loss for (_, p), loss in losses.items() if len(p) == 1)
    assert single == pytest.approx(mech.joint_nodes, rel=1e-9)  # one step: its L_W nodes
    worst = max(losses.values())
    assert worst == pytest.approx(losses[(mech.block, (1, 2, 3, 4))], rel=1e-9)
    assert worst / single == pytest.approx(9.5, rel=1e-9)
    unit = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=1, max_steps=k)
    assert worst / single <= params.with_privacy_unit(unit).unit_factor.loss  # G = 11 (all nodes counted)


def test_gaussian_window_tree_unit_audit():
    """The window tree under the window rule (``W = B = 8``, at most ``k = 4`` steps in any 8): the unit
    takes steps 1..4 of the first block in each of ``m = 2`` streams, at the clip bound, and the audit
    sees the releases of steps 1..8 (every step of the pattern still protected): the worst pattern the
    rule admits (``test_window_tree_audit_pattern_is_the_worst_the_rule_admits``: mu² 9.5 times one
    step's; the calibration's ``G = 11`` also counts the right children that no release uses while the
    steps are protected)."""
    unit = PrivacyUnit("user", max_streams_per_step=2, max_contributions_per_step=1, max_steps=4)
    clock = StepClock(start=0.0, period=1.0, end=8.0)

    def params(dim: int):
        return WindowedSumParams(clock=clock, dim=dim, window=8, clip_bound=R, epsilon=EPSILON, delta=DELTA,
                                 noise="gaussian").with_privacy_unit(unit)

    factor = params(1).unit_factor.factor
    assert factor > 4  # F = √(m·G) = √22: the unit-level noise is well above the event level's
    pattern = [1, 2, 3, 4]
    report = audit_with_mutant("window tree, unit (W=8, m=2, k=4)",
                               _unit_samples(lambda dim: params(dim).build_mechanism(), 8,
                                             {"a": pattern, "b": pattern}, 200_000),
                               EPSILON, DELTA, mutant_factor=1.0 / factor)
    print("\n" + report.row())
    assert report.honest_ok, report
    assert report.mutant_caught, report
