"""Statistical ring for PMWG (checks 5, 9, 10), each with a negative control where it applies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.growing_db.base import Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG, DynamicNumericSparse
from tests.conftest import TEST_KEY

NOISE = NoiseSource(TEST_KEY)
DRAWS = 20_000
KS_LEVEL = 1e-3  # KS not rejected at 1e-3 (a correct sampler fails w.p. 1e-3 per test)


class _HalfAnswerNoise(DynamicNumericSparse):
    ANSWER_SCALE = 2.0  # negative control: answer noise halved, accounting unchanged


class _TinyTestNoise(DynamicNumericSparse):
    TEST_SCALE = 0.25  # negative control of the audit: test noise Lap(ξ_t/4), accounting unchanged


def _sub(cls=DynamicNumericSparse, **kw):
    return cls(n=100, epsilon=1.0, delta=0.0, xi_n=0.05, a=0.5, **kw)


def _ks_ok(samples, scale):
    return stats.kstest(samples, stats.laplace(scale=scale).cdf).pvalue > KS_LEVEL


def test_noise_scales_match_laplace_laws():
    sub, t = _sub(), 400
    xi = sub.xi(t)
    assert xi == 0.05 * (100 / 400) ** 0.5
    tests_ = np.array([sub.test_noise(NOISE, "ks", i, i % 2, t) for i in range(DRAWS)])
    answers = np.array([sub.answer_noise(NOISE, "ks", i, t) for i in range(DRAWS)])
    thresholds = np.array([sub.threshold_draw(NOISE, "ks", i) for i in range(DRAWS)])
    assert _ks_ok(tests_, 2 * xi) and _ks_ok(answers, 4 * xi) and _ks_ok(thresholds, 1.0)
    # the keys are distinct per purpose: no two uses share a draw
    assert len(np.unique(np.concatenate([tests_, answers, thresholds]))) == 3 * DRAWS


def test_half_answer_noise_fails_the_same_check():
    sub, t = _sub(_HalfAnswerNoise), 400
    answers = np.array([sub.answer_noise(NOISE, "ks", i, t) for i in range(DRAWS)])
    assert not _ks_ok(answers, 4 * sub.xi(t))


def test_pmwg_hard_answer_uses_the_subroutine_answer_noise():
    mech = PMWG(universe_size=4, n=10, epsilon=50.0, alpha=0.3, xi_n=0.01)
    state, _ = mech.absorb(mech.init_state("h"), np.zeros(10, np.int64), NOISE)
    state, (rel,) = mech.answer(state, Query(10, "q", np.array([1.0, 0, 0, 0])), NOISE)
    assert rel.meta["hard"] and rel.meta["sign"] == 1
    omega = mech.sub.answer_noise(NOISE, "h", 0, 10)
    assert rel.value[0] == min(1.0, 1.0 + omega)  # clamped to the query's range [0, 1]


def test_accuracy_within_alpha_when_beta_bound_is_small():
    """Check 9: over 200 independent noise streams, every answer within α in ≥ 1 − β̂ − 3 s.e. of runs."""
    N, n, alpha = 16, 100_000, 0.5  # δ > 0, large n: α/(12 ξ_n) ≈ 12.6, so beta_bound is tiny
    mech = PMWG(universe_size=N, n=n, epsilon=2.0, alpha=alpha, delta=1e-6)
    rng = np.random.default_rng(9)
    start = rng.integers(0, 4, n)
    arrivals = [rng.integers(4, 8, 50) for _ in range(10)]
    queries = [(rng.random(N) < 0.5).astype(float) for _ in range(20)]
    good, betas, hard = 0, [], 0
    for seed in range(200):
        stream = f"acc{seed}"
        state, _ = mech.absorb(mech.init_state(stream), start, NOISE)
        ok = True
        for k, block in enumerate(arrivals):
            for f in queries[2 * k : 2 * k + 2]:
                state, (rel,) = mech.answer(state, Query(state.t, "q", f), NOISE)
                ok &= abs(rel.value[0] - f @ state.counts / state.t) <= alpha and not rel.meta["unchecked"]
            state, _ = mech.absorb(state, block, NOISE)
        good += ok
        betas.append(state.beta_bound)
        hard += state.hard_count
    beta = max(betas)
    assert beta <= 0.05 and hard > 0
    se = math.sqrt(max(beta * (1 - beta), 1e-12) / 200)
    assert good / 200 >= 1 - beta - 3 * se


def _audit_event_rate(subroutine, counts, runs):
    """Rate of the transcript event E = (query e_1 easy, then query e_0 hard with sign +1) at t = n.

    Neighbours: counts (12, 10, 8) vs (11, 11, 8) (one element moved from cell 0 to 1, t* = n). With
    y uniform the two queries' errors d are 1/n apart in opposite directions: the AboveThreshold
    attack window that the test noise must smear."""
    n = int(sum(counts))
    elements = np.repeat(np.arange(3), counts)
    xi_n = 2.25 / n * 1.000001  # one segment costs just under ε = 1
    mech = PMWG(universe_size=3, n=n, epsilon=1.0, alpha=0.075, xi_n=xi_n, subroutine=subroutine)
    base, _ = mech.absorb(mech.init_state("audit"), elements, NOISE)
    hits = 0
    for r in range(runs):
        from dataclasses import replace

        state = replace(base, stream=f"audit{r}")
        state, (first,) = mech.answer(state, Query(n, "a", np.array([0.0, 1.0, 0.0])), NOISE)
        if first.meta["hard"]:
            continue
        state, (second,) = mech.answer(state, Query(n, "b", np.array([1.0, 0.0, 0.0])), NOISE)
        assert second.epsilon_spent <= 1.0
        hits += second.meta["hard"] and second.meta["sign"] == 1
    return hits / runs


@pytest.mark.slow
@pytest.mark.parametrize("subroutine, should_pass", [(DynamicNumericSparse, True), (_TinyTestNoise, False)])
def test_privacy_audit_on_neighbouring_streams(subroutine, should_pass):
    """Check 10: ε̂ = ln(P_X(E)/P_X'(E)) (the larger-probability neighbour on top). Its s.e. is
    √((1−p)/(p·runs)) per term by the delta method; the real mechanism must stay ≤ ε = 1 at the
    upper 4-s.e. bound, the mis-calibrated one must exceed ε at the lower 4-s.e. bound."""
    runs = 8000
    p = _audit_event_rate(subroutine, (12, 10, 8), runs)
    q = _audit_event_rate(subroutine, (11, 11, 8), runs)
    eps_hat = abs(math.log(p / q))
    se = math.sqrt((1 - p) / (p * runs) + (1 - q) / (q * runs))
    if should_pass:
        assert eps_hat + 4 * se <= 1.0
    else:
        assert eps_hat - 4 * se > 1.0
