"""PRIVINCERM, PRIVINCREG₁, PRIVINCREG₂, NOISYPROJGRAD (checks 9–14 of §9)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.optimize import minimize

from beam_dp.core import NoiseSource, PrivacyLedger
from beam_dp.core.accounting.regression import advanced_composition
from beam_dp.mechanisms.base import NodeNoise
from beam_dp.mechanisms.online.convex_sets import L1Ball, L2Ball
from beam_dp.mechanisms.online.regression import (
    NoisyGradientDescent,
    PrivIncERM,
    PrivIncReg1,
    PrivIncReg2,
    RegressionBlock,
    make_incremental_regression,
    noisy_proj_grad,
    tau_schedule,
)
from beam_dp.testing.noise import ZeroNoise
from beam_dp.testing.stats import gaussian_variance_matches
from tests.conftest import TEST_KEY

NOISE = NoiseSource(TEST_KEY)


def _data(n, d, seed, sparse=None):
    rng = np.random.default_rng(seed)
    theta = np.zeros(d)
    k = sparse or d
    theta[:k] = rng.normal(size=k)
    theta /= 2 * np.abs(theta).sum()
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.clip(X @ theta + 0.05 * rng.normal(size=n), -1, 1)
    return X, y


def _ls_min_l2(X, y, R=1.0):
    """min_{‖θ‖<=R} Σ(y − Xθ)² by SLSQP from two starts (independent of the mechanisms' solvers)."""
    f = lambda th: float(np.sum((y - X @ th) ** 2))  # noqa: E731
    best = np.inf
    for start in (np.zeros(X.shape[1]), np.linalg.lstsq(X, y, rcond=None)[0]):
        start = start * min(1.0, R / max(np.linalg.norm(start), 1e-300))
        res = minimize(f, start, jac=lambda th: -2 * X.T @ (y - X @ th), method="SLSQP",
                       constraints=[{"type": "ineq", "fun": lambda th: R * R - th @ th,
                                     "jac": lambda th: -2 * th}], options={"ftol": 1e-15, "maxiter": 1000})
        best = min(best, f(res.x) if np.linalg.norm(res.x) <= R * (1 + 1e-9) else np.inf)
    return best


# -- NOISYPROJGRAD (§7) ------------------------------------------------------------------------
def test_noisy_proj_grad_bound():
    rng = np.random.default_rng(0)
    C = L2Ball(4)
    for _ in range(20):
        X, y = _data(30, 4, int(rng.integers(1 << 30)))
        f = lambda th: float(np.sum((y - X @ th) ** 2))  # noqa: E731
        L = 2 * 30 * (1 + 1)  # Lipschitz bound of f on the unit ball (‖x‖ <= 1, |y| <= 1)
        alpha = float(rng.uniform(0.1, 20))
        bias = rng.normal(size=4)
        bias *= alpha / np.linalg.norm(bias)  # a worst-case-style constant error of norm α
        r = int(rng.integers(5, 400))
        eta = C.radius / (math.sqrt(r) * (alpha + L))
        theta, _ = noisy_proj_grad(lambda th: -2 * X.T @ (y - X @ th) + bias, lambda v, a: (C.project(v), None),
                                   r, eta, C.project(rng.normal(size=4)))
        bound = 2.5 * C.radius * (L + alpha) / math.sqrt(r) + 2 * alpha * C.radius
        assert f(theta) - _ls_min_l2(X, y) <= bound


def test_noisy_proj_grad_averages_the_first_r_iterates():
    seen = []
    theta, _ = noisy_proj_grad(lambda th: np.ones(1), lambda v, a: (seen.append(v) or v, None), 3, 1.0, np.zeros(1))
    assert theta[0] == pytest.approx((0 - 1 - 2) / 3)  # θ_1..θ_3 = 0, −1, −2 (θ_4 = −3 not averaged)


# -- check 9: PRIVINCERM ----------------------------------------------------------------------
@pytest.mark.parametrize("T,tau", [(20, 5), (23, 5), (50, 50), (1000, 7), (64, 1)])
def test_privincerm_budget_composes_to_the_guarantee(T, tau):
    m = PrivIncERM(dim=2, epsilon=1.0, delta=1e-6, horizon=T, tau=tau, iterations=20)
    calls = math.ceil(T / tau)
    eps, delta = advanced_composition(calls, m.epsilon_call, m.delta_call, 1e-6 / 2)
    assert eps <= 1.0 + 1e-12 and delta <= 1e-6 * (1 + 1e-12)
    assert m.spend(calls)[0] <= 1.0 and m.spend(calls)[1] <= 1e-6
    rho = NoisyGradientDescent.rho(m.epsilon_call, m.delta_call)
    assert rho + 2 * math.sqrt(rho * math.log(1 / m.delta_call)) == pytest.approx(m.epsilon_call, abs=1e-9)


def test_privincerm_exact_spend_is_below_dp_accounting():
    m = PrivIncERM(dim=2, epsilon=1.0, delta=1e-6, horizon=100, tau=10, iterations=50)
    k = 7
    sigma_over_sens = m.solver.sigma(m.epsilon_call, m.delta_call) / (2 * m.lipschitz)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma_over_sens), k * 50)
    pld_eps = acc.get_epsilon(1e-6)
    mine, _ = m.spend(k)
    assert mine == pytest.approx(pld_eps, rel=1e-3)  # exact Gaussian composition, as PLD finds it
    assert mine <= advanced_composition(k, m.epsilon_call, m.delta_call, 0.5e-6)[0]


def test_privincerm_schedule_and_refusals():
    X, y = _data(40, 3, 1)
    m = PrivIncERM(dim=3, epsilon=1.0, delta=1e-6, horizon=40, tau=8, iterations=30)
    rels = m.run("s", list(zip(X, y)), NOISE)
    thetas = np.array([r.value["theta"] for r in rels])
    for t in range(1, 41):
        if t < 8:
            np.testing.assert_array_equal(thetas[t - 1], m.theta0)
            assert rels[t - 1].epsilon_spent == 0.0
        elif t % 8:
            np.testing.assert_array_equal(thetas[t - 1], thetas[t - 2])
        else:
            assert not np.array_equal(thetas[t - 1], thetas[t - 2])
    assert rels[-1].meta["calls"] == 5 and rels[-1].epsilon_spent <= 1.0
    with pytest.raises(ValueError, match="2 ln"):
        PrivIncERM(dim=2, epsilon=3.0, delta=0.5, horizon=10, tau=10)
    with pytest.raises(ValueError, match="<= 1"):
        PrivIncERM(dim=2, epsilon=20.0, delta=1e-6, horizon=10, tau=10)
    with pytest.raises(ValueError):
        m.step(m.init_state("s").__class__("s", 40, X, y, m.theta0, 5), (X[0], y[0]), NOISE)  # beyond T


def test_tau_schedules():
    assert tau_schedule("convex", horizon=1000, dim=8, epsilon=1.0) == 20
    assert tau_schedule("strongly_convex", horizon=1000, dim=16, epsilon=0.5, lipschitz=4.0, nu=1.0) == 16
    v = tau_schedule("gaussian_width", horizon=100, dim=3, epsilon=1.0, width=4.0, curvature=1.0, lipschitz=1.0)
    assert v == 20
    assert tau_schedule("convex", horizon=5, dim=1000, epsilon=0.01) == 5  # clamped to T
    with pytest.raises(ValueError):
        tau_schedule("strongly_convex", horizon=10, dim=2, epsilon=1.0)


# -- check 10: PRIVINCREG₁ accuracy event, with a negative control --------------------------------
@pytest.mark.slow
def test_privincreg1_accuracy_event():
    d, t, runs, beta = 5, 16, 200, 0.05
    mech = PrivIncReg1(dim=d, epsilon=1.0, delta=1e-5, horizon=t, release_every=t, beta=beta)
    tol = beta + 3 * math.sqrt(beta * (1 - beta) / runs)
    above, above_half, above_bound = 0, 0, 0
    for run in range(runs):
        X, y = _data(t, d, run)
        state = mech.init_state(f"run{run}")
        for i in range(t):
            state, rels = mech.step(state, (X[i], y[i]), NOISE)
        E_Q = state.Q_hat.reshape(d, d) - X.T @ X
        e_q = state.q_hat - X.T @ y
        err = 2 * np.linalg.norm(E_Q, 2) + 2 * np.linalg.norm(e_q)
        meta = rels[0].meta
        above += err > meta["alpha_t"]
        above_half += err > meta["alpha_t"] / 2
        theta = rels[0].value["theta"]
        excess = np.sum((y - X @ theta) ** 2) - _ls_min_l2(X, y)
        bound = 2.5 * (meta["L_t"] + meta["alpha_t"]) / math.sqrt(meta["r_t"]) + 2 * meta["alpha_t"]
        above_bound += excess > bound
    assert above / runs <= tol
    assert above_bound / runs <= tol
    assert above_half / runs > tol  # negative control: α_t halved is not a 1 − β bound


def test_privincreg1_tree_noise_calibration_with_half_noise_control():
    d, runs = 3, 300
    mech = PrivIncReg1(dim=d, epsilon=1.0, delta=1e-5, horizon=4, release_every=4)
    X, y = _data(4, d, 0)
    var_q = mech.tree_q.noise_var(3)

    def errors(m):
        out = []
        for run in range(runs):
            state = m.init_state(f"r{run}")
            for i in range(3):
                state, _ = m.step(state, (X[i], y[i]), NOISE)
            out.append(state.q_hat - X[:3].T @ y[:3])
        return np.array(out)

    assert gaussian_variance_matches(errors(mech), var_q)  # chi-square 99.9% interval
    half = PrivIncReg1(dim=d, epsilon=1.0, delta=1e-5, horizon=4, release_every=4)
    half.tree_q.node_noise = NodeNoise("gaussian", mech.tree_q.node_noise.scale / 2, "test")
    assert not gaussian_variance_matches(errors(half), var_q)


# -- check 11: without noise ----------------------------------------------------------------------
def test_privincreg1_without_noise_meets_the_optimisation_bound():
    d, t = 4, 16
    # ε huge (exact calibration) makes α_t ≈ 0, so r_t = r_max = 5000; ZeroNoise removes the noise itself
    mech = PrivIncReg1(dim=d, epsilon=1e5, delta=1e-5, horizon=t, calibration="analytic", r_max=5000, release_every=t)
    X, y = _data(t, d, 3)
    (rel,) = mech.run("s", list(zip(X, y)), ZeroNoise())
    assert rel.meta["r_t"] == 5000
    excess = np.sum((y - X @ rel.value["theta"]) ** 2) - _ls_min_l2(X, y)
    assert excess <= 2.5 * 1.0 * rel.meta["L_t"] / math.sqrt(5000)


# -- check 12: PRIVINCREG₂ mechanics ---------------------------------------------------------------
@pytest.mark.parametrize("C", [L2Ball(30, 1.0), L1Ball(30, 0.8)])
def test_privincreg2_mechanics(C):
    mech = PrivIncReg2(dim=30, constraint=C, m=8, epsilon=1.0, delta=1e-5)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 30)) * rng.uniform(0, 1, (20, 1)) / 6
    W = mech._features(X)
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), np.linalg.norm(X, axis=1), atol=1e-12)
    assert mech.tree_q.dim == 8 and mech.tree_Q.dim == 64
    assert mech.tree_q.sensitivity == 2.0 and mech.tree_Q.sensitivity == 2.0
    for _ in range(5):
        v = rng.normal(size=8) * 3
        p, u = mech.project_space(v)
        assert C.gauge(u) <= 1 + 1e-9
        np.testing.assert_allclose(mech.phi @ u, p, atol=1e-9)
        p2, _ = mech.project_space(p, u)
        np.testing.assert_allclose(p2, p, atol=1e-6 * (1 + np.linalg.norm(p)))
        theta = mech.lift(p)
        assert np.linalg.norm(mech.phi @ theta - p) <= 1e-6 * (1 + np.linalg.norm(p))
        assert C.gauge(theta) <= 1 + 1e-9
        if isinstance(C, L2Ball):
            np.testing.assert_allclose(theta, np.linalg.pinv(mech.phi) @ p, atol=1e-9)
    rels = mech.run("s", list(zip(X[:6], np.clip(rng.normal(size=6), -1, 1))), NOISE)
    assert all(C.gauge(r.value["theta"]) <= 1 + 1e-9 for r in rels)
    assert rels[-1].meta["m"] == 8 and rels[-1].meta["m_capped"] is False


@pytest.mark.slow
def test_privincreg2_chooses_m_by_the_formula_and_caps_it():
    T, d, beta = 100, 1000, 0.05
    mech = PrivIncReg2(dim=d, constraint=L1Ball(d), input_domain=("sparse", 2), horizon=T, epsilon=1.0, delta=1e-5)
    W = mech.width
    gamma = (W / T) ** (1 / 3)
    assert mech.m == math.ceil(max(W**2, math.log(T / beta)) / gamma**2) and not mech.m_capped
    small = PrivIncReg2(dim=20, constraint=L2Ball(20), horizon=100, epsilon=1.0, delta=1e-5)
    assert small.m == 19 and small.m_capped
    fallback = make_incremental_regression("privincreg2", dim=10, m=10, epsilon=1.0, delta=1e-5)
    assert type(fallback) is PrivIncReg1
    with pytest.raises(ValueError):
        PrivIncReg2(dim=10, constraint={"kind": "box", "lower": -1, "upper": 1}, m=3, epsilon=1.0, delta=1e-5)


def test_l1_lift_recovers_a_sparse_theta():
    """Compressed sensing: with m = 40 ≳ k log(d/k) Gaussian rows, the L1 lift of Φθ* is θ* (to 1e-6)."""
    d, k = 100, 3
    mech = PrivIncReg2(dim=d, constraint=L1Ball(d), m=40, epsilon=1.0, delta=1e-5, phi_seed=7)
    rng = np.random.default_rng(1)
    for _ in range(5):
        theta = np.zeros(d)
        theta[rng.choice(d, k, replace=False)] = rng.normal(size=k)
        theta *= 0.9 / np.abs(theta).sum()
        np.testing.assert_allclose(mech.lift(mech.phi @ theta), theta, atol=1e-6)


# -- check 2 for regression: feasibility ---------------------------------------------------------------
@pytest.mark.parametrize("algo,C", [("privincreg1", L1Ball(6, 0.5)), ("privincreg1", L2Ball(6, 2.0)),
                                    ("privincreg2", L2Ball(6))])
def test_regression_releases_are_feasible(algo, C):
    X, y = _data(60, 6, 2)
    kw = dict(m=3) if algo == "privincreg2" else {}
    mech = make_incremental_regression(algo, dim=6, constraint=C, epsilon=0.5, delta=1e-6, **kw)
    for rel in mech.run("s", list(zip(X, 3 * y)), NOISE):
        assert C.gauge(rel.value["theta"]) <= 1 + 1e-9


# -- check 13: validity check propagation ----------------------------------------------------------
def test_paper_sigma_failing_the_exact_check_raises():
    with pytest.raises(ValueError, match="analytic"):
        PrivIncReg1(dim=2, epsilon=100.0, delta=1e-5, horizon=3)
    ok = PrivIncReg1(dim=2, epsilon=100.0, delta=1e-5, horizon=3, calibration="analytic")
    assert ok.tree_q.node_noise.calibration == "analytic"


# -- ledger totals, blocks, determinism (check 14), bad input ---------------------------------------------
def test_spend_blocks_and_determinism():
    X, y = _data(24, 3, 5)
    blocks = [RegressionBlock(X[i : i + 3], y[i : i + 3]) for i in range(0, 24, 3)]
    for mech in (PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6),
                 PrivIncReg2(dim=3, m=2, epsilon=1.0, delta=1e-6),
                 PrivIncERM(dim=3, epsilon=1.0, delta=1e-6, horizon=8, tau=2, iterations=10)):
        a = mech.run("s", blocks, NOISE)
        assert a == mech.run("s", blocks, NoiseSource(TEST_KEY))
        assert all(r.epsilon_spent <= 1.0 * (1 + 1e-12) and r.delta_spent <= 1e-6 * (1 + 1e-12) for r in a)
        state, out = mech.init_state("s"), []
        for i, block in enumerate(blocks):
            if i == 4:
                state = mech.decode_state(mech.encode_state(state))
            state, rels = mech.step(state, block, NOISE)
            out += rels
        assert out == a
    reg1 = PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6, horizon=8)
    rels = reg1.run("s", blocks, NOISE)
    # the release reports the two trees' spends added (basic composition); the joint ledger of both
    # trees' charges (exact Gaussian composition) is never worse, and neither exceeds the guarantee
    ledger = PrivacyLedger(reg1.guarantee)
    for t in range(1, 9):
        ledger.record(reg1.tree_q.charges_at(t) + reg1.tree_Q.charges_at(t))
        eps, _ = ledger.worst(t)
        assert eps <= rels[t - 1].epsilon_spent * (1 + 1e-9) <= 1.0
    assert rels[-1].delta_spent == pytest.approx(1e-6)


def test_bad_records_and_parameters():
    mech = PrivIncReg1(dim=2, epsilon=1.0, delta=1e-6)
    for x, y, reason in [([np.nan, 0.0], 1.0, "non_finite"), ([1.0], 0.0, "wrong_shape"),
                         ([1.0, 0.0], np.inf, "non_finite"), ([1.0, 0.0], None, "bad_value")]:
        with pytest.raises(ValueError, match=reason):
            mech.record(x, y)
    assert mech.record([3.0, 4.0], 5.0)[1] == 5.0  # |y| > 1 is accepted and clipped inside the mechanism
    for bad in (dict(delta=0.0), dict(epsilon=-1.0), dict(constraint="sphere"), dict(r_max=0),
                dict(constraint={"kind": "halfspaces", "A": [[1.0, 0.0]], "b": [1.0]})):
        kwargs = dict(dim=2, epsilon=1.0, delta=1e-6)
        kwargs.update(bad)
        with pytest.raises(ValueError):
            PrivIncReg1(**kwargs)
