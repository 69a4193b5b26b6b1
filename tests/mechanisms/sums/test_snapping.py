"""SnappedSum: grid releases with exact arithmetic and data-independent noise (issue 8, item 6)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from beam_dp.core import NoiseSource
from beam_dp.core.grid import power_of_two_at_least
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.snapping import SnappedSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import ScaledNoise, release_matrix, run_stream
from tests.conftest import TEST_KEY

R, G, DIM, STEPS = 2.0, 0.25, 3, 40
GAUSS = dict(epsilon=1.0, delta=1e-6, noise="gaussian")
PURE = dict(epsilon=1.0, noise="gamma")

# every linear continual sum: name -> make(dim, clip_bound)
MAKERS = {
    "blt": lambda d, r: make_counter("blt", horizon=64, dim=d, clip_bound=r, **GAUSS),
    "toeplitz": lambda d, r: make_counter("toeplitz", horizon=64, dim=d, clip_bound=r, **GAUSS),
    "honaker": lambda d, r: make_counter("honaker", horizon=64, dim=d, clip_bound=r, **GAUSS),
    "kary": lambda d, r: make_counter("kary", horizon=64, dim=d, clip_bound=r, **PURE),
    "binary tree": lambda d, r: make_counter("tree", horizon=64, dim=d, clip_bound=r, **PURE),
    "hybrid tree": lambda d, r: make_counter("tree", dim=d, clip_bound=r, **GAUSS),
    "window tree": lambda d, r: WindowTreeSum(window=8, dim=d, clip_bound=r, **PURE),
}


def _snapped(name: str, dim: int = DIM, granularity: float = G) -> SnappedSum:
    return SnappedSum(lambda r: MAKERS[name](dim, r), clip_bound=R, granularity=granularity)


def _data(seed: int, steps: int = STEPS, dim: int = DIM) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1.5, (int(rng.integers(0, 4)), dim)) for _ in range(steps)]


def _grid_prefix(mech: SnappedSum, blocks) -> np.ndarray:
    """The exact prefix sums of the grid-rounded clipped steps, computed independently in grid units."""
    steps = [np.rint(mech.clip_and_sum(b).vector / mech.granularity) if len(b) else np.zeros(mech.dim) for b in blocks]
    return np.cumsum(steps, axis=0) * mech.granularity


@pytest.mark.parametrize("name", list(MAKERS))
def test_release_is_exact_grid_prefix_plus_rounded_noise_of_the_zero_data_run(name):
    mech, blocks = _snapped(name), _data(1)
    noise = NoiseSource(TEST_KEY)
    values = release_matrix(run_stream(mech, blocks, noise))
    # the wrapped mechanism on zero data, calibrated for R' = R + sqrt(d)·g, is the noise term
    zero_run = release_matrix(run_stream(mech.inner, [None] * STEPS, noise))
    expected = _grid_prefix(mech, blocks) + np.rint(zero_run / G) * G
    assert mech.inner.clip_bound == R + math.sqrt(DIM) * G
    assert values.tobytes() == expected.tobytes()
    assert np.array_equal(values / G, np.rint(values / G))  # every value on the grid
    assert np.allclose(release_matrix(run_stream(mech, blocks, ZeroNoise())), _grid_prefix(mech, blocks), atol=0)


@pytest.mark.parametrize("name", ["blt", "kary", "hybrid tree", "window tree"])
def test_noise_law_does_not_depend_on_the_data(name):
    """Mironov's channel: output minus the exact value must be the same noise whatever the data.
    The unsnapped mechanism fails this (its float addition leaves data-dependent low bits)."""
    noise = NoiseSource(TEST_KEY)
    a, b = _data(2), _data(3)
    snapped = _snapped(name)
    residual = [release_matrix(run_stream(snapped, d, noise)) - _grid_prefix(snapped, d) for d in (a, b)]
    assert residual[0].tobytes() == residual[1].tobytes()
    raw = MAKERS[name](DIM, R)
    exact = [release_matrix(run_stream(raw, d, ZeroNoise())) for d in (a, b)]
    raw_residual = [release_matrix(run_stream(raw, d, noise)) - e for d, e in zip((a, b), exact)]
    assert raw_residual[0].tobytes() != raw_residual[1].tobytes()  # the negative control


def test_guarantee_is_adjusted_for_rounding_and_spend_is_the_wrapped_mechanisms():
    plain, snapped = MAKERS["kary"](DIM, R), _snapped("kary")
    assert snapped.guarantee == snapped.inner.guarantee
    assert snapped.inner.sensitivity == pytest.approx(2 * (R + math.sqrt(DIM) * G))
    assert snapped.noise_var(10) > plain.noise_var(10)  # calibrated for the larger R'
    rel = run_stream(snapped, _data(4, steps=8), NoiseSource(TEST_KEY))
    inner = run_stream(snapped.inner, [None] * 8, NoiseSource(TEST_KEY))
    assert [r.epsilon_spent for r in rel] == [r.epsilon_spent for r in inner]
    assert all(r.epsilon_spent <= 1.0 for r in rel)
    assert rel[-1].meta["granularity"] == G and rel[-1].meta["snapped_clip_bound"] == snapped.inner.clip_bound
    on_grid = SnappedSum(lambda r: make_counter("blt", horizon=64, dim=1, clip_bound=r, **GAUSS), clip_bound=1.0,
                         granularity=1.0, inputs_on_grid=True)
    assert on_grid.inner.clip_bound == 1.0  # integer steps are already on the grid: no adjustment
    with pytest.raises(ValueError, match="multiple of the granularity"):
        on_grid.step(on_grid.init_state("s"), np.array([[0.5]]), NoiseSource(TEST_KEY))


@pytest.mark.parametrize("factor, fits", [(1.0, True), (0.5, False)])
def test_snapped_noise_variance_matches_the_adjusted_calibration(factor, fits):
    """Per-step variance of (release − grid prefix) over 600 independent streams (one χ² test at
    the last step: 599·s²/σ² ~ χ²₅₉₉); the half-noise mutant must fail it."""
    mech = SnappedSum(lambda r: MAKERS["blt"](1, r), clip_bound=1.0, granularity=0.5)
    source, runs, steps = ScaledNoise(TEST_KEY, factor), 600, 16
    last = np.array([mech.step(_advance(mech, f"s{k}", steps - 1, source), None, source)[1][0].value[0]
                     for k in range(runs)])
    chi2 = (runs - 1) * last.var(ddof=1) / mech.noise_var(steps)
    p = 2 * min(stats.chi2.cdf(chi2, runs - 1), stats.chi2.sf(chi2, runs - 1))
    assert (p > 1e-3) if fits else (p < 1e-6)


def _advance(mech, stream, steps, noise):
    state = mech.init_state(stream)
    for _ in range(steps):
        state, _ = mech.step(state, None, noise)
    return state


def test_state_round_trip_continues_like_an_uninterrupted_run():
    mech, blocks, noise = _snapped("blt"), _data(5), NoiseSource(TEST_KEY)
    full = run_stream(mech, blocks, noise)
    state = mech.init_state("audit")
    for b in blocks[:17]:
        state, _ = mech.step(state, b, noise)
    state = mech.decode_state(mech.encode_state(state))
    rest = []
    for b in blocks[17:]:
        state, out = mech.step(state, b, noise)
        rest.extend(out)
    assert rest == full[17:]
    with pytest.raises(ValueError):
        mech.decode_state(MAKERS["blt"](DIM, R).encode_state(MAKERS["blt"](DIM, R).init_state("x")))


def test_sums_beyond_the_exact_range_of_float64_release_the_nearest_float():
    """Snapping never refuses: far beyond 2^53 grid units (here beyond 2^62, the exact Python-integer path) a
    release is the float nearest the exact grid value (exact prefix units plus the rounded noise units)."""
    g = 2.0**-40
    mech = SnappedSum(lambda r: MAKERS["kary"](1, r), clip_bound=1e6, granularity=g)
    noise = NoiseSource(TEST_KEY)
    # one contribution per step (so each step sum is an exact float): 6e6 is ~6.6e18 units > 2^62, then
    # sub-grid steps that only the exact integer sum keeps (5·2^-41 is 2.5 units: rint, ties to even, gives 2)
    steps = [1e6] * 6 + [3 * g, 5 * g / 2, -g, 7 * g]
    state, inner_state = mech.init_state("s"), mech.inner.init_state("s")
    units, beyond_float = 0, 0
    for x in steps:
        state, releases = mech.step(state, np.array([[x]]), noise)
        # the noise term: the wrapped mechanism on a zero step, same key and stream
        inner_state, inner_releases = mech.inner.step(inner_state, np.zeros((1, 1)), noise)
        units += round(Fraction(x) / Fraction(g))
        exact = (units + round(Fraction(float(inner_releases[0].value[0])) / Fraction(g))) * Fraction(g)
        assert len(releases) == 1
        assert releases[0].value[0] == float(exact)  # correctly rounded: the nearest float (ties to even)
        beyond_float += Fraction(float(releases[0].value[0])) != exact
    assert units > 2**62 and isinstance(state.units[0], int)
    assert beyond_float > 0  # some releases were not representable, so rounding really happened


@pytest.mark.parametrize("g, grid", [(0.25, 0.25), (0.3, 0.5), (1, 1.0), (3, 4.0), (1e-3, 2.0**-9)])
def test_grid_is_the_power_of_two_at_least_the_granularity(g, grid):
    assert power_of_two_at_least(g) == grid


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "1"])
def test_bad_granularity_is_refused(bad):
    with pytest.raises(ValueError):
        power_of_two_at_least(bad)
