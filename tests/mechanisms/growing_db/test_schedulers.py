"""BBScheduler, BBImprover and the black boxes (Cummings et al., "Differential Privacy for Growing Databases", checks 11–16)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from beam_dp.core import NoiseSource
from beam_dp.core.accounting.growing_db import bbimprover_epsilon, bbscheduler_plan, cdp_budget_sq, cdp_epsilon
from beam_dp.mechanisms.growing_db.base import Query, replay_growing
from beam_dp.mechanisms.growing_db.schedulers import MWEM, BBImprover, BBScheduler, BoxNoise, LaplaceHistogram, SmallDB
from beam_dp.testing.audit import ScaledNoise
from tests.conftest import TEST_KEY

NOISE = NoiseSource(TEST_KEY)


class _Box:
    """A user black box meeting the interface: (p, g) = (1/3, 2)."""

    name, p, g = "toy", 1.0 / 3.0, 2.0

    def run(self, counts, t, epsilon, alpha, beta, noise):
        return {"histogram": counts / t + noise.laplace(0, 2.0 / (epsilon * t), len(counts))}

    def answer(self, synopsis, weights):
        return float(weights @ synopsis["histogram"])

    def histogram(self, synopsis):
        return synopsis["histogram"]


def test_check11_epochs_epsilons_betas_alphas():
    plan = bbscheduler_plan(n=100, epsilon=1.0, beta=0.05, p=1 / 3, g=2.0, gamma=0.5)
    assert [plan.epoch_time(i) for i in range(8)] == [100, 150, 225, 338, 507, 760, 1140, 1709]
    want = [0.111111, 0.148148, 0.148148, 0.131687, 0.109739, 0.087791, 0.068282, 0.052025]
    np.testing.assert_allclose([plan.epsilon_i(i) for i in range(8)], want, atol=5e-7)
    x = 2 / 3
    first4 = sum(plan.epsilon_i(i) for i in range(4))
    assert first4 == pytest.approx(0.5390947, abs=1e-7) and first4 == pytest.approx(1 - 5 * x**4 + 4 * x**5, rel=1e-12)
    assert plan.spent_after(3) == pytest.approx(first4, rel=1e-12)
    assert sum(plan.epsilon_i(i) for i in range(2000)) == pytest.approx(1.0, rel=1e-12)  # Σ ε_i = ε, never above
    assert sum(plan.epsilon_i(i) for i in range(2000)) <= 1.0 + 1e-12
    assert sum(plan.beta_i(i) for i in range(200)) == pytest.approx(0.05, rel=1e-12)
    assert plan.alpha == pytest.approx(1.2990242, abs=1e-7)
    # α_i = g (ln(1/β_i)/(ε_i (1+γ)^i n))^p is the same for every epoch
    for i in range(8):
        a_i = 2.0 * (math.log(1 / plan.beta_i(i)) / (plan.epsilon_i(i) * 1.5**i * 100)) ** (1 / 3)
        assert plan.epoch_time(i) == math.ceil(100 * 1.5**i - 1e-9)
        assert a_i == pytest.approx(plan.alpha, rel=1e-12)


def test_check12_gamma_formula():
    plan = bbscheduler_plan(n=10**4, epsilon=1.0, beta=0.05, p=1 / 3, g=2.0)
    assert plan.gamma == pytest.approx(0.2991704, abs=1e-7)
    assert [plan.epoch_time(i) for i in range(6)] == [10000, 12992, 16879, 21928, 28489, 37011]


def test_check13_answers_come_from_the_latest_run_and_spend_matches_the_run_log():
    N, n = 8, 100
    mech = BBScheduler(_Box(), universe_size=N, n=n, epsilon=1.0, beta=0.05, gamma=0.5)
    rng = np.random.default_rng(13)
    elements = [rng.integers(0, N, 50) for _ in range(20)]  # t = 50 … 1000
    queries = [[Query(50 * (k + 1), f"q{k}", (rng.random(N) < 0.5).astype(float))] if k >= 1 else []
               for k in range(20)]
    state, releases = replay_growing(mech, "s", elements, queries, NOISE)
    runs = {r.meta["run"]: r for r in releases if r.meta.get("kind") == "black_box_run"}
    assert [r.step for r in runs.values()] == [100, 150, 225, 338, 507, 760]
    answers = [r for r in releases if "query_id" in r.meta]
    counts = np.zeros(N, np.int64)
    all_elements = np.concatenate(elements)
    drift = {}
    for r in answers:
        t = r.meta["t"]
        i = max(i for i, run in runs.items() if run.step <= t)
        assert r.meta["run"] == i
        f = queries[t // 50 - 1][0].weights
        # answered by run i only, clamped to the query's range (post-processing)
        assert r.value[0] == pytest.approx(np.clip(f @ runs[i].value, f.min(), f.max()), rel=1e-12)
        counts = np.bincount(all_elements[:t], minlength=N)
        t_i, t_next = runs[i].step, mech.plan.epoch_time(i + 1)
        drift[t] = abs(r.value[0] - f @ counts / t) - (t - t_i) / t
        assert (t - t_i) / t <= (t_next - 1 - t_i) / (t_next - 1)
        # per-element spend recomputed from the run log: an element present from n is in every run so far
        assert r.epsilon_spent == pytest.approx(sum(mech.plan.epsilon_i(j) for j in range(i + 1)), rel=1e-12)
        assert r.epsilon_spent <= 1.0
    assert max(drift.values()) <= mech.plan.alpha  # error ≤ α_i + drift (here the noise is far below α_i)


def test_check14_bbscheduler_delta_positive():
    plan = bbscheduler_plan(n=1000, epsilon=1.0, beta=0.05, delta=1e-6, p=1 / 3, g=2.0)
    s_tot = cdp_budget_sq(1.0, 1e-6)
    partial = np.cumsum([plan.epsilon_i(i) ** 2 for i in range(3000)])
    assert np.all(np.diff(partial) >= 0) and np.all(np.diff(partial[:20]) > 0) and np.all(partial <= s_tot * (1 + 1e-12))
    assert partial[-1] == pytest.approx(s_tot, rel=1e-12)
    assert cdp_epsilon(s_tot, 1e-6) == pytest.approx(1.0, abs=1e-12)
    alphas = [2.0 * (math.log(1 / plan.beta_i(i)) / (plan.epsilon_i(i) * (1 + plan.gamma) ** i * 1000)) ** (1 / 3)
              for i in range(20)]
    np.testing.assert_allclose(alphas, plan.alpha, rtol=1e-12)


def test_check15_bbimprover_schedule():
    mech = BBImprover(_Box(), universe_size=4, n=100, epsilon=1.0, delta=1e-6, beta=0.05)
    assert mech.s_tot == pytest.approx(0.0349378, rel=1e-5)
    for t, want in [(100, 0.0087320), (101, 0.0086696), (200, 0.0053566), (1000, 0.0018348), (10**4, 0.00043504)]:
        assert mech.epsilon_t(t) == pytest.approx(want, abs=0.5 * 10 ** (math.floor(math.log10(want)) - 4))  # 5 s.d.
    for T in (100, 150, 1000, 20000):
        eps = bbimprover_epsilon(np.arange(100, T + 1), 100, mech.s_tot)
        assert math.fsum(eps**2) == pytest.approx(mech.spent_sq(T), rel=1e-12, abs=1e-12)
        assert mech.spent_sq(T) < mech.s_tot
        betas = [mech.beta_t(t) for t in range(100, T + 1)]
        assert math.fsum(betas) == pytest.approx(0.05 * 100 * (1 / 100 - 1 / (T + 1)), rel=1e-12)
    assert cdp_epsilon(mech.spent_sq(10**9), 1e-6) < 1.0


def test_bbimprover_runs_lazily_and_reports_cdp_spend():
    mech = BBImprover(LaplaceHistogram(8), universe_size=8, n=10, epsilon=1.0, delta=1e-6)
    rng = np.random.default_rng(15)
    elements = [rng.integers(0, 8, 10) for _ in range(5)]
    queries = [[Query(10 * (k + 1), f"q{k}", np.ones(8) / 2)] for k in range(5)]
    state, releases = replay_growing(mech, "s", elements, queries, NOISE)
    answers = [r for r in releases if "query_id" in r.meta]
    assert [r.meta["run"] for r in answers] == [10, 20, 30, 40, 50]
    for r in answers:
        assert r.epsilon_spent == pytest.approx(cdp_epsilon(mech.spent_sq(r.step), 1e-6), rel=1e-12)
        assert r.delta_spent == 1e-6 and r.epsilon_spent < 1.0
    assert mech.alpha_t(10**5) < mech.alpha_t(10**3) < mech.alpha_t(50)  # accuracy improves with t


def test_check16_smalldb_output_law():
    """N = 3, two queries, α' = 0.7 → m = 2 and 6 range points; χ² of 10⁵ draws against exp(εnu/2)."""
    queries = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    box = SmallDB(queries)
    assert box.range_size(0.7) == (2, 6)
    counts, t, eps = np.array([3, 1, 1]), 5, 1.0
    cands = box.candidates(0.7)
    u = -np.max(np.abs(cands @ queries.T - queries @ (counts / t)), axis=1)
    law = np.exp(eps * t * u / 2)
    law /= law.sum()
    gen = np.random.default_rng(16)
    draws = 100_000
    # the same Gumbel-max sampler as SmallDB.run, on independent Gumbels (10⁵ keyed runs would be slow)
    scores = eps * t * u / 2 + gen.gumbel(size=(draws, len(cands)))
    observed = np.bincount(np.argmax(scores, axis=1), minlength=len(cands))
    assert stats.chisquare(observed, law * draws).pvalue > 1e-3
    # and the keyed run picks candidates with these probabilities too (a small sample: 2000 runs)
    picks = [int(np.argmax((cands == box.run(counts, t, eps, 1.4, 0.05, BoxNoise(NOISE, "sdb", "bbs", (k,)))
                            ["histogram"]).all(axis=1))) for k in range(2000)]
    assert stats.chisquare(np.bincount(picks, minlength=6), law * 2000).pvalue > 1e-3
    assert box.g == pytest.approx((16 * math.log(3) * math.log(2) + 4) ** (1 / 3))
    with pytest.raises(ValueError):
        SmallDB(np.ones((2, 40)), max_range=1000).candidates(0.1)


def _discrete_laplace_chi2_pvalue(draws: np.ndarray, scale: float) -> float:
    """χ² goodness of fit of integer draws to P(x) ∝ e^{−|x|/scale}, tails pooled beyond ±k."""
    q = math.exp(-1.0 / scale)
    k = int(3 * scale) + 1
    support = np.arange(-k, k + 1)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    expected = np.concatenate([[q**k / (1 + q)], pmf[1:-1], [q**k / (1 + q)]])  # P(X <= -k), ..., P(X >= k)
    observed = np.bincount(np.clip(draws, -k, k) + k, minlength=2 * k + 1)
    return float(stats.chisquare(observed, expected / expected.sum() * len(draws)).pvalue)


@pytest.mark.parametrize("factor, fits", [(1.0, True), (0.5, False)])
def test_laplace_histogram_draws_discrete_laplace_counts_and_negative_control(factor, fits):
    """χ² fit of the count noise to discrete Laplace at the count scale 2/ε; the half-noise mutant fails."""
    box = LaplaceHistogram(64)
    counts, t, eps = np.full(64, 2), 128, 0.5
    source = ScaledNoise(TEST_KEY, factor)
    runs = [box.run(counts, t, eps, None, 0.05, BoxNoise(source, "lh", "bbs", (k,)))["histogram"] for k in range(300)]
    noise_counts = np.concatenate(runs) * t - counts[0]
    assert np.array_equal(noise_counts, np.round(noise_counts))  # integer counts: exact on the integers
    pvalue = _discrete_laplace_chi2_pvalue(np.round(noise_counts).astype(np.int64), 2 / eps)
    assert (pvalue > 1e-3) if fits else (pvalue < 1e-6)
    assert box.p == 1.0 and box.g == pytest.approx(2 * 64 * (1 + math.log(128)))


def test_mwem_black_box_is_schedulable_with_explicit_gamma():
    rng = np.random.default_rng(17)
    Q = (rng.random((20, 32)) < 0.3).astype(float)
    with pytest.raises(ValueError, match="gamma"):
        BBScheduler(MWEM(Q), universe_size=32, n=100, epsilon=1.0)
    mech = BBScheduler(MWEM(Q, rounds=5), universe_size=32, n=1000, epsilon=1.0, gamma=0.5)
    state, releases = replay_growing(mech, "m", [rng.integers(0, 4, 1000)], [[Query(1000, "q", Q[0])]], NOISE)
    hist = releases[0].value
    assert abs(hist.sum() - 1) < 1e-9 and releases[-1].meta["alpha"] is None
    snap = mech.snapshot(state)
    assert snap is not None and snap.mechanism == "bbscheduler_synthetic"


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=0.0), dict(epsilon=-1), dict(n=0), dict(gamma=0.0), dict(gamma=-0.5), dict(beta=0.0),
    dict(beta=0.5), dict(delta=1.0), dict(epsilon=math.inf),
])
def test_bbscheduler_invalid_parameters(kwargs):
    base = dict(universe_size=8, n=100, epsilon=1.0)
    base.update(kwargs)
    with pytest.raises(ValueError):
        BBScheduler(_Box(), **base)


@pytest.mark.parametrize("kwargs", [dict(delta=0.0), dict(n=2), dict(epsilon=0.0), dict(beta=1.0)])
def test_bbimprover_invalid_parameters(kwargs):
    base = dict(universe_size=8, n=100, epsilon=1.0, delta=1e-6)
    base.update(kwargs)
    with pytest.raises(ValueError):
        BBImprover(_Box(), **base)
