"""Exact identities of the Toeplitz factorizations (square root, BLT) at small T."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import toeplitz

from beam_dp.core import NoiseSource, analytic_gaussian_delta
from beam_dp.mechanisms.sums import BLT, BLTSum, ToeplitzSqrtSum
from beam_dp.mechanisms.sums.fitted_params import blt_for
from tests.mechanisms.sums.helpers import KEY, build

T = 48


def lower_toeplitz(coeffs: np.ndarray) -> np.ndarray:
    return np.tril(toeplitz(coeffs))


@pytest.fixture(params=["toeplitz", "blt"])
def mech(request):
    return build(request.param, "gaussian", horizon=T, dim=2, clip_bound=0.5)


def test_b_times_c_is_the_prefix_sum_matrix(mech):
    c = lower_toeplitz(mech.c_coeffs(T))
    b = np.tril(np.ones((T, T))) @ np.linalg.inv(c)
    np.testing.assert_allclose(b @ c, np.tril(np.ones((T, T))), atol=1e-10)
    if isinstance(mech, ToeplitzSqrtSum):  # B = C = A^{1/2}
        np.testing.assert_allclose(c @ c, np.tril(np.ones((T, T))), atol=1e-12)
    if isinstance(mech, BLTSum):  # B's coefficients are the prefix sums of C^{-1}'s
        np.testing.assert_allclose(lower_toeplitz(mech.blt.b_coeffs(T)), b, atol=1e-10)


def test_sensitivity_is_the_max_column_norm_and_sigma_is_exact(mech):
    c = lower_toeplitz(mech.c_coeffs(T))
    max_col = np.linalg.norm(c, axis=0).max()
    assert math.isclose(mech.max_col_norm, max_col, rel_tol=1e-12)
    assert math.isclose(np.linalg.norm(c[:, 0]), max_col, rel_tol=1e-12)  # Toeplitz: the first column
    mu = mech.sensitivity * max_col / mech.sigma
    assert analytic_gaussian_delta(mech.epsilon, mu) <= mech.delta  # certified at (eps, delta) ...
    assert analytic_gaussian_delta(mech.epsilon, 2 * mu) > mech.delta  # ... and half the noise fails it


def test_noise_variance_is_sigma_squared_times_row_norms_of_b(mech):
    c = lower_toeplitz(mech.c_coeffs(T))
    b = np.tril(np.ones((T, T))) @ np.linalg.inv(c)
    rows = (b**2).sum(axis=1)
    got = np.array([mech.noise_var(t) for t in range(1, T + 1)])
    np.testing.assert_allclose(got, mech.sigma**2 * rows, rtol=1e-9)


def test_streamed_noise_equals_the_dense_product(mech):
    """Releases on zero data are exactly (B z)_t with z the keyed per-step draws."""
    noise = NoiseSource(KEY)
    state, released = mech.init_state("s"), []
    for _ in range(T):
        state, (rel,) = mech.step(state, None, noise)
        released.append(rel.value)
    if isinstance(mech, ToeplitzSqrtSum):
        z = mech.noise_history(noise, ("s",), T)[0]
    else:
        z = np.stack([noise.gaussian("s", mech.purpose, (t,), mech.sigma, mech.dim) for t in range(1, T + 1)])
    b = np.tril(np.ones((T, T))) @ np.linalg.inv(lower_toeplitz(mech.c_coeffs(T)))
    np.testing.assert_allclose(np.array(released), b @ z, atol=1e-9 * mech.sigma)


@pytest.mark.parametrize("horizon", [1, 7, 1000, 2**16, 2**20])
def test_blt_closed_forms_match_explicit_sums(horizon):
    blt = blt_for(horizon)
    for t in sorted({1, 2, max(1, horizon // 3), horizon}):
        assert math.isclose(blt.col_norm_sq(t), blt.direct_col_norm_sq(t)[-1], rel_tol=1e-9)
        assert math.isclose(blt.row_norm_sq(t), blt.direct_row_norm_sq(t)[-1], rel_tol=1e-9)


def test_blt_unbounded_mode_calibrates_on_all_steps():
    mech = build("blt", "gaussian", horizon=None)
    limit = mech.blt.col_norm_sq(math.inf)
    assert math.isclose(mech.max_col_norm**2, limit, rel_tol=1e-12)
    assert mech.blt.col_norm_sq(10**12) <= limit * (1 + 1e-12)
    state = mech.init_state("s")
    state = type(state)("s", 10**7, state.g, state.total)  # far past the fit horizon: still within budget
    state, (rel,) = mech.step(state, None, NoiseSource(KEY))
    assert rel.epsilon_spent <= mech.epsilon * (1 + 1e-9)


def test_invalid_blt_and_toeplitz_configurations():
    with pytest.raises(ValueError):
        BLT((1.0,), (0.1,))
    with pytest.raises(ValueError):
        BLT((0.5, 0.9), (0.1,))
    with pytest.raises(ValueError):
        build("toeplitz", "gaussian", horizon=None)
    with pytest.raises(ValueError):
        build("blt", "gamma")
    with pytest.raises(ValueError):
        build("toeplitz", "gamma")
    mech = build("toeplitz", "gaussian", horizon=3)
    state = mech.init_state("s")
    for _ in range(3):
        state, _ = mech.step(state, None, NoiseSource(KEY))
    with pytest.raises(ValueError, match="horizon"):
        mech.step(state, None, NoiseSource(KEY))


@pytest.mark.parametrize("cls, horizon", [(BLTSum, None), (BLTSum, 700), (ToeplitzSqrtSum, 700)])
def test_epsilon_spent_of_a_lone_stream_equals_the_per_step_bisection(cls, horizon):
    """Steps' facts are computed by chunks (1, 2-3, 4-7, ..., then blocks of 256) with one vectorised
    bisection for their epsilon_spent: the value each step gets alone, to the bisection's 1e-12."""
    mech = cls(horizon=horizon, dim=1, epsilon=1.0, delta=1e-6, clip_bound=0.5)
    noise, state = NoiseSource(KEY), mech.init_state("s")
    for t in range(1, 700 + 1):
        state, (release,) = mech.step(state, None, noise)
        if t in (1, 2, 3, 4, 7, 8, 255, 256, 257, 511, 512, 700):
            eps, delta = mech._loss(mech.col_norm_sq(t)).spend(mech.delta)
            assert release.epsilon_spent == pytest.approx(eps, rel=1e-12) and release.delta_spent == delta
            assert release.epsilon_spent <= mech.epsilon * (1 + 1e-12)
