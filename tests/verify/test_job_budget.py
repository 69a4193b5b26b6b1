"""JobBudget, BudgetPlan and compose: splits hit the total, over-budget plans are refused, Gaussian
shares compose through mu (tighter than adding epsilons), job spend on a release is an upper bound."""

import math

import pytest

from beam_dp.core.budget import JobBudget, check_share, compose, gaussian_mu
from beam_dp.core.calibration import analytic_gaussian_delta, analytic_gaussian_epsilon
from beam_dp.core.noise import NoiseSource


def test_pure_shares_add_and_split_sums_to_the_total():
    plan = JobBudget(1.0).split({"sum": "pure", "count": "pure", "windowed": "pure"})
    assert [plan[n].epsilon for n in plan.names] == pytest.approx([1 / 3] * 3, rel=1e-8)
    assert plan.total_epsilon() <= 1.0
    assert plan.total_epsilon() == pytest.approx(1.0, rel=1e-8)


def test_weights_are_respected():
    plan = JobBudget(1.0).split({"a": "pure", "b": "pure"}, weights={"a": 3.0})
    assert plan["a"].epsilon == pytest.approx(3 * plan["b"].epsilon)


def test_gaussian_shares_compose_through_mu_and_get_more_than_half_each():
    budget = JobBudget(1.0, 1e-6)
    plan = budget.split({"sum": "gaussian", "count": "gaussian"})
    eps, delta = plan["sum"].epsilon, plan["sum"].delta
    assert eps > 0.5 and delta == pytest.approx(1e-6, rel=1e-6)  # tighter than halving epsilon
    # two Gaussians of mu_i compose to mu = sqrt(2) mu_i, which must meet (1, 1e-6) exactly
    mu = math.sqrt(2) * gaussian_mu(eps, delta)
    assert analytic_gaussian_delta(1.0, mu) <= 1e-6 * (1 + 1e-6)
    assert plan.total_epsilon() <= 1.0


def test_mixed_plan_uses_basic_composition_between_kinds():
    plan = JobBudget(2.0, 1e-5).split({"g": "gaussian", "p": "pure", "a": "approx"})
    g, p, a = plan["g"], plan["p"], plan["a"]
    assert g.delta + a.delta <= 1e-5
    assert p.epsilon + a.epsilon + analytic_gaussian_epsilon(gaussian_mu(g.epsilon, g.delta), 1e-5 - a.delta) <= 2.0


def test_a_plan_over_the_total_is_refused_at_construction():
    with pytest.raises(ValueError, match="more than the job's total"):
        JobBudget(1.0).plan({"a": ("pure", 0.6, 0.0), "b": ("pure", 0.6, 0.0)})
    with pytest.raises(ValueError, match="needs delta > 0"):
        JobBudget(1.0).split({"a": "gaussian"})
    with pytest.raises(ValueError, match="epsilon"):
        JobBudget(0.0)
    with pytest.raises(ValueError, match="unique"):
        JobBudget(1.0).plan({"a": ("pure", 0.1, 0.0)}).__class__(1.0, 0.0, (("a", "pure", .1, 0.), ("a", "pure", .1, 0.)))


def test_compose_is_infinite_when_delta_cannot_cover_the_shares():
    assert compose([("approx", 0.1, 1e-3)], 1e-4) == math.inf
    assert compose([("pure", 0.3, 0.0), ("pure", 0.2, 0.0)], 0.0) == pytest.approx(0.5)


def test_job_spend_composes_own_spend_with_others_full_shares():
    plan = JobBudget(1.0).split({"sum": "pure", "count": "pure"})
    eps, delta = plan["sum"].job_spend(0.1, 0.0)
    assert eps == pytest.approx(0.1 + plan["count"].epsilon) and delta == 0.0
    assert plan["sum"].job_spend(plan["sum"].epsilon, 0.0)[0] <= 1.0


def test_a_share_admits_only_mechanisms_that_fit_it():
    plan = JobBudget(1.0, 1e-6).split({"g": "gaussian", "a": "approx"})
    check_share(plan["g"], plan["g"].epsilon, plan["g"].delta, "gaussian", "x")
    check_share(plan["a"], plan["a"].epsilon / 2, 0.0, "pure", "x")  # pure fits an approx share
    with pytest.raises(ValueError, match="compose as 'pure'"):
        check_share(plan["g"], plan["g"].epsilon / 2, 0.0, "pure", "x")
    with pytest.raises(ValueError, match="exceeds its budget share"):
        check_share(plan["a"], plan["a"].epsilon * 1.01, plan["a"].delta, "approx", "x")


def test_noise_domains_are_independent_and_reproducible():
    key = bytes(range(32))
    a1 = NoiseSource(key).for_domain("job/Sum").gaussian("s", "tree", (0, 1, 2), 1.0, 4)
    a2 = NoiseSource(key).for_domain("job/Sum").gaussian("s", "tree", (0, 1, 2), 1.0, 4)
    b = NoiseSource(key).for_domain("job/Count").gaussian("s", "tree", (0, 1, 2), 1.0, 4)
    root = NoiseSource(key).gaussian("s", "tree", (0, 1, 2), 1.0, 4)
    assert a1.tobytes() == a2.tobytes()
    assert not any(math.isclose(x, y) for x, y in zip(a1, b)) and not any(math.isclose(x, y) for x, y in zip(a1, root))
    with pytest.raises(ValueError):
        NoiseSource(key).for_domain("")


def test_a_pure_share_with_a_delta_is_refused_never_dropped():
    """The issue's case (e): ``JobBudget(1, 0).plan`` accepted a pure share with delta 0.3 and reported
    delta 0, and ``compose`` dropped it. Both refuse now; the same share as ``approx`` is composed."""
    with pytest.raises(ValueError, match="'pure' share must have delta 0"):
        JobBudget(1.0, 0.0).plan({"a": ("pure", 0.5, 0.3)})
    with pytest.raises(ValueError, match="'pure' share must have delta 0"):
        JobBudget(1.0, 0.5).plan({"a": ("pure", 0.5, 0.3)})
    with pytest.raises(ValueError, match="'pure' share must have delta 0"):
        compose([("pure", 0.5, 0.3)], 0.5)
    assert compose([("approx", 0.5, 0.3)], 0.5) == pytest.approx(0.5)
    assert compose([("approx", 0.5, 0.3)], 0.0) == math.inf  # the delta is counted, not dropped
