"""Integer-valued continual counts: the trees with ``noise="discrete_laplace"`` (issue 8, numerical safety)."""

from __future__ import annotations

import json
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that

from beam_dp.beam import ContinualCount
from beam_dp.beam.sums import ContinualCountParams, ContinualSumParams
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.guarantee import PrivacyLedger
from beam_dp.mechanisms.base import NodeNoise
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.testing.noise import ZeroNoise
from tests.beam.helpers import batch_options, expected_rows, rows_match
from tests.conftest import TEST_KEY

EPS = 1.0
T = 40  # crosses 32: a finished doubling block, a new hybrid tree B_5


def _trees():
    kw = dict(dim=1, epsilon=EPS, clip_bound=1.0, noise="discrete_laplace")
    return [BinaryTreeSum(horizon=64, **kw), HybridTreeSum(**kw), DoublingTreeSum(**kw)]


def _counts(seed=0):
    return np.random.default_rng(seed).integers(0, 6, size=T)


def _run(mech, noise, counts):
    state, out = mech.init_state("s"), []
    for n in counts:
        state, releases = mech.step(state, np.ones((int(n), 1)), noise)
        out += releases
    return out


def _dlap_variance(c: float) -> float:
    q = math.exp(-1.0 / c)
    return 2.0 * q / (1.0 - q) ** 2


@pytest.mark.parametrize("mech", _trees(), ids=lambda m: m.name)
def test_releases_are_integer_valued_and_noisy(mech):
    counts = _counts()
    releases = _run(mech, NoiseSource(TEST_KEY), counts)
    values = np.array([r.value[0] for r in releases])
    assert all(r.value.dtype == np.float64 and r.value.shape == (1,) for r in releases)
    assert np.array_equal(values, np.round(values))  # exactly integers
    assert not np.array_equal(values, np.cumsum(counts))  # noise was added
    assert all(r.meta["noise"] == "discrete_laplace" and r.meta["calibration"] == "exact" for r in releases)


@pytest.mark.parametrize("mech", _trees(), ids=lambda m: m.name)
def test_zero_noise_releases_exact_counts(mech):
    counts = _counts(1)
    values = np.array([r.value[0] for r in _run(mech, ZeroNoise(), counts)])
    assert np.array_equal(values, np.cumsum(counts).astype(float))


@pytest.mark.parametrize("mech", _trees(), ids=lambda m: m.name)
def test_spend_and_ledger_within_epsilon(mech):
    releases = _run(mech, NoiseSource(TEST_KEY), _counts(2))
    assert all(0 < r.epsilon_spent <= EPS * (1 + 1e-12) and r.delta_spent == 0 for r in releases)
    ledger = PrivacyLedger(mech.guarantee)
    for t in range(1, T + 1):
        ledger.record(mech.charges_at(t))
    eps, delta = ledger.worst(T)
    assert eps <= EPS * (1 + 1e-12) and delta == 0.0
    ledger.check(T)


def test_scales_equal_the_gamma_trees():
    kw = dict(dim=1, epsilon=EPS, clip_bound=1.0)
    for cls, extra in ((BinaryTreeSum, {"horizon": 64}), (HybridTreeSum, {}), (DoublingTreeSum, {})):
        d, g = cls(noise="discrete_laplace", **kw, **extra), cls(noise="gamma", **kw, **extra)
        for t in (1, 5, 33, 40):
            laws_d = [d.node_law(n) for n in d.nodes_used(t)]
            laws_g = [g.node_law(n) for n in g.nodes_used(t)]
            assert [n.scale for n in laws_d] == [n.scale for n in laws_g]
            assert {n.law for n in laws_d} == {"discrete_laplace"}
            assert math.isclose(d.noise_var(t), sum(_dlap_variance(n.scale) for n in laws_d), rel_tol=1e-12)


def _variance_ok(samples: np.ndarray, c: float, n_se: float = 5.0) -> bool:
    """Sample variance vs 2e^{-1/c}/(1-e^{-1/c})². SE of the sample variance = sqrt((mu4 - var²)/n), with
    mu4 = E[X⁴] of the discrete Laplace computed from its pmf (|x| up to 60c: tail below 1e-20)."""
    var = _dlap_variance(c)
    x = np.arange(-int(60 * c), int(60 * c) + 1, dtype=float)
    pmf = np.exp(-np.abs(x) / c)
    pmf /= pmf.sum()
    mu4 = float(np.sum(pmf * x**4))
    se = math.sqrt((mu4 - var**2) / samples.size)
    return abs(float(np.var(samples)) - var) <= n_se * se


def test_node_noise_variance_matches_discrete_laplace_and_half_scale_fails():
    mech = HybridTreeSum(dim=1, epsilon=EPS, clip_bound=1.0, noise="discrete_laplace")
    node = mech.block_noise(3)  # c = 3·Δ₂/(ε/2) = 12
    assert math.isclose(mech.node_variance(node), _dlap_variance(node.scale), rel_tol=1e-12)
    noise = NoiseSource(TEST_KEY)
    n = 40_000  # node law is i.i.d. per coordinate: one keyed draw of n coordinates
    samples = node.draw(noise, "s", "variance-test", (0, 0, 0), n)
    assert samples.dtype == np.float64 and np.array_equal(samples, np.round(samples))
    assert abs(samples.mean()) <= 5 * math.sqrt(_dlap_variance(node.scale) / n)
    assert _variance_ok(samples, node.scale)
    half = NodeNoise("discrete_laplace", node.scale / 2).draw(noise, "s", "variance-test-half", (0, 0, 0), n)
    assert not _variance_ok(half, node.scale)  # negative control: a half-scale sampler is caught


def test_refusals():
    with pytest.raises(ValueError, match="ContinualCount only"):
        ContinualSumParams(noise="discrete_laplace", block_size=1)
    for bad in (dict(dim=2, clip_bound=1.0), dict(dim=1, clip_bound=1.5), dict(dim=1, clip_bound=1.0, delta=1e-6)):
        with pytest.raises(ValueError):
            HybridTreeSum(epsilon=EPS, noise="discrete_laplace", **bad)
    with pytest.raises(ValueError, match="does not support"):
        WindowTreeSum(dim=1, epsilon=EPS, clip_bound=1.0, noise="discrete_laplace", window=4)
    for counter in ("kary", "blt", "honaker", "toeplitz"):
        with pytest.raises(ValueError, match="counter='tree' only"):
            make_counter(counter, dim=1, epsilon=EPS, clip_bound=1.0, noise="discrete_laplace", horizon=64)
        with pytest.raises(ValueError):
            ContinualCountParams(noise="discrete_laplace", counter=counter, block_size=1)
    assert isinstance(make_counter("auto", dim=1, epsilon=EPS, clip_bound=1.0, noise="discrete_laplace"), HybridTreeSum)
    mech = _trees()[1]
    with pytest.raises(ValueError, match="integer step values"):  # a fractional sum would leak exactly
        mech.step(mech.init_state("s"), np.array([[0.5]]), NoiseSource(TEST_KEY))


CLOCK = StepClock(start=1000.0, period=10.0, end=1000.0 + 10 * 37)


@pytest.mark.parametrize("unbounded", ["hybrid", "doubling"])
def test_continual_count_discrete_equals_pure_mechanism(unbounded):
    rng = np.random.default_rng(8)
    ids = rng.choice(["a", "b"], size=300)
    ts = CLOCK.start + rng.random(300) * (CLOCK.end - CLOCK.start)
    params = ContinualCountParams(epsilon=1.0, clock=CLOCK, noise="discrete_laplace", unbounded=unbounded)
    expected = expected_rows(params.as_sum_params(), ids, ts, np.ones((len(ids), 1)))
    assert len(expected) == 2 * 37
    assert all(float(v).is_integer() for row in expected for v in row.value)
    assert all(json.loads(row.meta)["noise"] == "discrete_laplace" for row in expected)
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([(str(i), float(t)) for i, t in zip(ids, ts)]) | ContinualCount(params)
        assert_that(out.releases, rows_match(expected))
