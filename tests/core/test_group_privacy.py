"""Group privacy of a record-level spend for a unit of k records, and its inverse."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from beam_dp.core.budget import gaussian_mu
from beam_dp.core.group_privacy import record_budget, unit_spend

CASES = [("pure", 1.0, 0.0), ("pure", 0.3, 0.0), ("gaussian", 1.0, 1e-6), ("gaussian", 0.1, 1e-9),
         ("gaussian", 8.0, 1e-5), ("approx", 1.0, 1e-6), ("approx", 3.0, 1e-5)]


@pytest.mark.parametrize("composition,epsilon,delta", CASES)
@pytest.mark.parametrize("k", [1, 2, 7, 100])
def test_record_budget_is_within_the_unit_budget_and_tight(composition, epsilon, delta, k):
    eps0, delta0 = record_budget(composition, epsilon, delta, k)
    eps_u, delta_u = unit_spend(composition, eps0, delta0, k)
    assert eps_u <= epsilon and delta_u <= delta
    assert eps_u == pytest.approx(epsilon, rel=1e-7) and delta_u == pytest.approx(delta, rel=1e-9, abs=0)


def test_pure_and_approx_follow_the_chain_of_k_records():
    assert unit_spend("pure", 0.25, 0.0, 4) == (1.0, 0.0)
    eps, delta = unit_spend("approx", 0.5, 1e-6, 3)
    assert eps == 1.5 and delta == pytest.approx(1e-6 * (1 + math.exp(0.5) + math.exp(1.0)))


def test_gaussian_group_is_k_mu():
    """A k-record unit moves a Gaussian's mean k times as far: kμ-GDP; its delta at the read epsilon
    is the Gaussian tradeoff's (Balle and Wang 2018, Theorem 8) for mean shift kμ."""
    eps0 = 0.2
    mu = gaussian_mu(eps0, 1e-6)
    eps, delta = unit_spend("gaussian", eps0, 1e-6, 5)
    m = 5 * mu
    exact = norm.cdf(-eps / m + m / 2) - np.exp(eps) * norm.cdf(-eps / m - m / 2)
    assert exact == pytest.approx(1e-6, rel=1e-6)


def test_a_record_level_spend_is_not_a_unit_spend():
    """The mutant a verifier must catch: a record-level calibration stated as the unit's spend."""
    for composition, epsilon, delta in CASES:
        assert unit_spend(composition, epsilon, delta, 3)[0] > 2.5 * epsilon or composition == "gaussian"
        assert unit_spend(composition, epsilon, delta, 3)[0] > 1.5 * epsilon


@pytest.mark.parametrize("bad", [dict(composition="laplace"), dict(epsilon=0.0), dict(epsilon=math.inf),
                                 dict(epsilon=True), dict(delta=1.0), dict(composition="pure", delta=1e-6),
                                 dict(composition="gaussian", delta=0.0), dict(k=0), dict(k=2.0), dict(k=True)])
def test_bad_arguments_are_refused(bad):
    args = dict(composition="approx", epsilon=1.0, delta=1e-6, k=3) | bad
    for fn in (record_budget, unit_spend):
        with pytest.raises(ValueError):
            fn(args["composition"], args["epsilon"], args["delta"], args["k"])


@pytest.mark.parametrize("composition,delta", [("pure", 0.0), ("gaussian", 1e-6), ("approx", 1e-6)])
def test_a_units_share_calibrates_at_the_record_budget_and_reports_the_units_spend(composition, delta):
    from beam_dp.core.budget import JobBudget, check_share

    share = JobBudget(1.0, delta).split({"model": composition, "other": "pure"})["model"]
    unit = share.per_unit(5)
    kwargs = unit.params()
    assert (kwargs["epsilon"], kwargs["delta"]) == record_budget(composition, share.epsilon, share.delta, 5)
    assert unit.job_spend(kwargs["epsilon"], kwargs["delta"])[0] == pytest.approx(
        share.job_spend(share.epsilon, share.delta)[0], rel=1e-6)
    check_share(unit, kwargs["epsilon"], kwargs["delta"], composition, "model")
    with pytest.raises(ValueError, match="exceeds its budget share"):  # the record budget of k = 4 is too much
        check_share(unit, *record_budget(composition, share.epsilon, share.delta, 4), composition, "model")


def test_large_epsilons_do_not_overflow():
    eps0, delta0 = record_budget("approx", 2000.0, 1e-6, 3)
    assert eps0 == pytest.approx(2000.0 / 3) and 0.0 <= delta0 < 1e-6  # underflows to 0: a family refuses it
    assert unit_spend("approx", 800.0, 1e-6, 3) == (2400.0, 1.0)  # the chain's delta passes 1: no guarantee
