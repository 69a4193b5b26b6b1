"""Guarantees, per-element losses and the per-element ledger (beam_dp/core/guarantee.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core.calibration import analytic_gaussian_epsilon
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, PrivacyLedger, require_within_budget

# ---- Guarantee -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0},
        {"epsilon": -1.0},
        {"epsilon": math.nan},
        {"epsilon": math.inf},
        {"epsilon": "1"},
        {"epsilon": None},
        {"epsilon": 1.0, "delta": -1e-9},
        {"epsilon": 1.0, "delta": 1.0},
        {"epsilon": 1.0, "delta": 2.0},
        {"epsilon": 1.0, "delta": math.nan},
        {"epsilon": 1.0, "window": 0},
        {"epsilon": 1.0, "window": -4},
        {"epsilon": 1.0, "window": 2.5},
        {"epsilon": 1.0, "window_requested": 0},
    ],
)
def test_guarantee_validation(kwargs):
    with pytest.raises(ValueError):
        Guarantee(**kwargs)


def test_guarantee_valid_and_describe():
    g = Guarantee(1.5)
    assert g.pure and g.delta == 0.0 and g.window is None
    assert "1.5-DP" in g.describe() and "forever" in g.describe()
    g2 = Guarantee(2.0, 1e-6, window=16, window_requested=10)
    assert not g2.pure
    assert "16" in g2.describe() and "window" in g2.describe()
    assert g2.as_dict() == {
        "epsilon": 2.0,
        "delta": 1e-6,
        "neighbouring": g2.neighbouring,
        "window": 16,
        "window_requested": 10,
    }
    Guarantee(np.float64(0.5), delta=0, window=np.int64(3))  # numpy scalars accepted
    with pytest.raises(AttributeError):  # frozen
        g.epsilon = 3.0


# ---- ElementLoss -----------------------------------------------------------------------------------


def test_element_loss_addition():
    a = ElementLoss(0.25, 0.5)
    b = ElementLoss(0.5, 1.5)
    c = a + b
    assert c == ElementLoss(0.75, 2.0)
    assert ElementLoss() + a == a
    total = sum([ElementLoss(0.1)] * 10, ElementLoss())
    assert total.pure_epsilon == pytest.approx(1.0, rel=1e-12) and total.gaussian_mu_sq == 0.0


def test_element_loss_epsilon_at():
    assert ElementLoss(0.7).epsilon_at(0.0) == 0.7
    assert ElementLoss(0.7).epsilon_at(1e-5) == 0.7
    assert ElementLoss(0.0, 1.0).epsilon_at(0.0) == math.inf
    mu = 0.8
    assert ElementLoss(0.0, mu**2).epsilon_at(1e-5) == pytest.approx(analytic_gaussian_epsilon(mu, 1e-5), rel=1e-12)
    # Mixed loss: basic composition of the pure part and the Gaussian part at the full delta.
    assert ElementLoss(0.3, mu**2).epsilon_at(1e-5) == pytest.approx(0.3 + analytic_gaussian_epsilon(mu, 1e-5))


def test_element_loss_spend():
    assert ElementLoss(0.4).spend(1e-5) == (0.4, 0.0)
    eps, delta = ElementLoss(0.0, 0.25).spend(1e-6)
    assert delta == 1e-6 and eps == pytest.approx(analytic_gaussian_epsilon(0.5, 1e-6))


# ---- require_within_budget ---------------------------------------------------------------------------


def test_require_within_budget_pure():
    g = Guarantee(1.0)
    require_within_budget(g, ElementLoss(1.0), "ok")
    require_within_budget(g, ElementLoss(1.0 + 1e-13), "rounding")  # inside rel_tol 1e-12
    require_within_budget(g, ElementLoss(0.1 * 10), "sum of tenths")
    with pytest.raises(ValueError, match="exceeds the budget"):
        require_within_budget(g, ElementLoss(1.0 + 1e-9), "over")
    with pytest.raises(ValueError):
        require_within_budget(g, ElementLoss(3.0), "over")


def test_require_within_budget_gaussian():
    delta = 1e-5
    mu = 0.5
    eps_needed = analytic_gaussian_epsilon(mu, delta)
    require_within_budget(Guarantee(eps_needed, delta), ElementLoss(gaussian_mu_sq=mu**2), "exact")
    with pytest.raises(ValueError):
        require_within_budget(Guarantee(0.99 * eps_needed, delta), ElementLoss(gaussian_mu_sq=mu**2), "over")
    # Gaussian noise with a pure (delta = 0) guarantee is refused, however large the budget.
    with pytest.raises(ValueError, match="delta"):
        require_within_budget(Guarantee(1000.0), ElementLoss(gaussian_mu_sq=1e-6), "pure gauss")


# ---- Charge ----------------------------------------------------------------------------------------------


def test_charge_constructors_and_validation():
    c = Charge.pure(2, 5, 0.5, "node")
    assert (c.first, c.last, c.loss, c.label) == (2, 5, ElementLoss(0.5), "node")
    g = Charge.gaussian(1, 1, 2.0, 4.0)
    assert g.loss == ElementLoss(0.0, 0.25)
    for first, last in [(0, 3), (-1, 2), (5, 4)]:
        with pytest.raises(ValueError):
            Charge.pure(first, last, 1.0)


# ---- PrivacyLedger ---------------------------------------------------------------------------------------


def _brute_force(charges, n_steps):
    pure = np.zeros(n_steps)
    gauss = np.zeros(n_steps)
    for t in range(1, n_steps + 1):
        for c in charges:
            if c.first <= t <= c.last:
                pure[t - 1] += c.loss.pure_epsilon
                gauss[t - 1] += c.loss.gaussian_mu_sq
    return pure, gauss


@pytest.mark.parametrize("seed", range(5))
def test_loss_per_step_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    charges = []
    for _ in range(200):
        first = int(rng.integers(1, 80))
        last = first + int(rng.integers(0, 30))  # some extend beyond n_steps
        if rng.random() < 0.5:
            charges.append(Charge.pure(first, last, float(rng.exponential(0.1))))
        else:
            charges.append(Charge.gaussian(first, last, 1.0, float(rng.uniform(1, 10))))
    ledger = PrivacyLedger(Guarantee(1.0, 1e-6))
    ledger.record(charges[:100])
    ledger.record(iter(charges[100:]))  # any iterable
    for n_steps in (0, 1, 37, 60, 120):
        pure, gauss = ledger.loss_per_step(n_steps)
        bf_pure, bf_gauss = _brute_force(charges, n_steps)
        assert pure.shape == gauss.shape == (n_steps,)
        np.testing.assert_allclose(pure, bf_pure, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gauss, bf_gauss, rtol=1e-12, atol=1e-12)


def test_loss_per_step_empty_ledger():
    pure, gauss = PrivacyLedger(Guarantee(1.0)).loss_per_step(5)
    assert np.array_equal(pure, np.zeros(5)) and np.array_equal(gauss, np.zeros(5))
    assert PrivacyLedger(Guarantee(1.0)).worst(0) == (0.0, 0.0)
    assert PrivacyLedger(Guarantee(1.0)).worst(10) == (0.0, 0.0)


def test_worst_and_check_pure():
    # A binary tree over 8 steps with 4 levels, each node costing eps/4: every step spends eps exactly.
    eps = 1.0
    ledger = PrivacyLedger(Guarantee(eps))
    for level in range(4):
        size = 2**level
        ledger.record(Charge.pure(s, s + size - 1, eps / 4, f"N({level},{s})") for s in range(1, 9, size))
    pure, gauss = ledger.loss_per_step(8)
    np.testing.assert_allclose(pure, eps, rtol=1e-15)
    assert not gauss.any()
    worst_eps, worst_delta = ledger.worst(8)
    assert worst_eps == pytest.approx(eps, rel=1e-15) and worst_delta == 0.0
    ledger.check(8)
    # One extra node over step 3 overspends, and only steps from 3 on see it.
    ledger.record([Charge.pure(3, 3, 0.01)])
    ledger.check(2)
    assert ledger.worst(8)[0] == pytest.approx(1.01)
    with pytest.raises(ValueError, match="budget"):
        ledger.check(8)


def test_worst_picks_the_worst_step_not_the_last():
    ledger = PrivacyLedger(Guarantee(1.0))
    ledger.record([Charge.pure(1, 2, 0.9), Charge.pure(2, 2, 0.05), Charge.pure(3, 10, 0.2)])
    assert ledger.worst(10) == (pytest.approx(0.95), 0.0)


@pytest.mark.parametrize("k", [1, 2, 5, 13])
def test_worst_gaussian_joint(k):
    # k Gaussian charges of μ each on the same step compose to one Gaussian of μ·√k.
    delta, sens, sigma = 1e-5, 1.0, 4.0
    mu = sens / sigma
    ledger = PrivacyLedger(Guarantee(100.0, delta))
    ledger.record(Charge.gaussian(1, 2**j, sens, sigma) for j in range(k))  # step 1 is in all k
    eps, d = ledger.worst(2 ** (k - 1))
    assert d == delta
    assert eps == pytest.approx(analytic_gaussian_epsilon(mu * math.sqrt(k), delta), rel=1e-9)
    # The per-step Gaussian part of step 1 is the sum of the k μ².
    _, gauss = ledger.loss_per_step(2 ** (k - 1))
    assert gauss[0] == pytest.approx(k * mu**2)
    ledger.check(2 ** (k - 1))


def test_check_gaussian_over_budget_and_pure_guarantee():
    delta = 1e-5
    mu_joint = 0.5 * math.sqrt(4)
    eps_exact = analytic_gaussian_epsilon(mu_joint, delta)
    ok = PrivacyLedger(Guarantee(eps_exact, delta))
    ok.record(Charge.gaussian(1, 1, 1.0, 2.0) for _ in range(4))
    ok.check(1)
    over = PrivacyLedger(Guarantee(0.999 * eps_exact, delta))
    over.record(Charge.gaussian(1, 1, 1.0, 2.0) for _ in range(4))
    with pytest.raises(ValueError):
        over.check(1)
    # Gaussian charges against a pure guarantee: infinite epsilon, refused.
    pure = PrivacyLedger(Guarantee(10.0))
    pure.record([Charge.gaussian(1, 1, 1.0, 100.0)])
    assert pure.worst(1)[0] == math.inf
    with pytest.raises(ValueError):
        pure.check(1)


def test_worst_mixed_pure_and_gaussian():
    delta = 1e-6
    ledger = PrivacyLedger(Guarantee(5.0, delta))
    ledger.record([Charge.pure(1, 3, 0.5), Charge.gaussian(2, 4, 1.0, 3.0), Charge.gaussian(4, 4, 1.0, 3.0)])
    pure, gauss = ledger.loss_per_step(4)
    candidates = [ElementLoss(p, g).epsilon_at(delta) for p, g in zip(pure, gauss)]
    eps, d = ledger.worst(4)
    assert eps == pytest.approx(max(candidates), rel=1e-12)
    assert d == delta
