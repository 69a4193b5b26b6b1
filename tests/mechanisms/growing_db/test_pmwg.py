"""PMWG structure, invariants and accounting (Cummings et al., "Differential Privacy for Growing Databases", checks 1–4 and 6–8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.core.accounting.growing_db import (
    cdp_budget_sq,
    cdp_epsilon,
    greedy_worst_case_spend,
    hard_query_bound,
    worst_case_xi_n,
)
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query, replay_growing
from beam_dp.mechanisms.growing_db.pmwg import PMWG, relative_entropy
from beam_dp.testing import ZeroNoise
from tests.conftest import TEST_KEY

NOISE = NoiseSource(TEST_KEY)


def _absorb_all(mech, state, elements, noise=NOISE):
    state, rel = mech.absorb(state, np.asarray(elements, np.int64), noise)
    assert rel == []
    return state


def _ask(mech, state, f, qid="q", noise=NOISE):
    state, rel = mech.answer(state, Query(state.t, qid, np.asarray(f, float)), noise)
    assert len(rel) == 1
    return state, rel[0]


# -- check 1: mixing and distribution invariants --------------------------------------------------
def test_mixing_rule_and_distribution_invariants():
    N, n = 16, 20
    mech = PMWG(universe_size=N, n=n, epsilon=1.0, alpha=0.5, delta=1e-6)
    rng = np.random.default_rng(1)
    state = mech.init_state("s")
    uniform = np.full(N, 1.0 / N)
    for v in rng.integers(0, N, n - 1):  # before n: y untouched
        state = _absorb_all(mech, state, [v])
        assert np.array_equal(state.y, uniform)
    with pytest.raises(ValueError, match="before_start"):
        mech.answer(state, Query(state.t, "early", np.ones(N)), NOISE)
    state = _absorb_all(mech, state, [3])
    assert state.t == n and np.array_equal(state.y, uniform)
    for step in range(300):
        if step % 3 == 0:  # a query (possibly hard: an MW step) between arrivals
            state, _ = _ask(mech, state, (rng.random(N) < 0.5).astype(float), f"q{step}")
            assert abs(state.y.sum() - 1.0) <= 1e-12 and np.all(state.y > 0)
        old, t = state.y.copy(), state.t + 1
        state = _absorb_all(mech, state, [rng.integers(0, N)])
        expected = (t - 1) / t * old + 1.0 / (t * N)
        np.testing.assert_allclose(state.y, expected, rtol=1e-15, atol=0)
        assert abs(state.y.sum() - 1.0) <= 1e-12 and np.all(state.y > 0)
        assert np.all(state.y >= 1.0 / (t * N) * (1 - 1e-12))
    assert state.hard_count > 0  # the MW path was exercised


def test_uniform_stays_uniform_under_arrivals_alone():
    mech = PMWG(universe_size=8, n=5, epsilon=1.0, alpha=0.5)
    state = _absorb_all(mech, mech.init_state("s"), np.arange(40) % 3)
    np.testing.assert_allclose(state.y, np.full(8, 1 / 8), rtol=1e-15)


# -- check 2: Lemma 6 ------------------------------------------------------------------------
def test_lemma6_relative_entropy_growth_on_random_cases():
    rng = np.random.default_rng(2)
    pairs = 0
    for N in (2, 3, 8, 64):
        reps = 2500
        t = rng.integers(1, 2000, reps)
        counts = np.stack([rng.multinomial(tt, rng.dirichlet(np.full(N, 0.3))) for tt in t])
        y = rng.dirichlet(np.full(N, 0.5), size=reps) + 1e-300
        y /= y.sum(axis=1, keepdims=True)
        new = rng.integers(0, N, reps)
        counts_bar = counts.copy()
        counts_bar[np.arange(reps), new] += 1
        tf = t[:, None].astype(float)
        y_bar = tf / (tf + 1) * y + 1.0 / ((tf + 1) * N)
        growth = relative_entropy(counts_bar / (tf + 1), y_bar) - relative_entropy(counts / tf, y)
        bound = math.log(N) / (t + 1) + np.log(t) / (t + 1) + np.log((t + 1) / t)
        assert np.all(growth <= bound + 1e-12)
        pairs += reps
    assert pairs == 10_000


# -- check 3: MW progress ------------------------------------------------------------------------
def test_mw_step_lowers_relative_entropy_by_alpha_sq_over_36():
    rng = np.random.default_rng(3)
    mech = PMWG(universe_size=10, n=10, epsilon=1.0, alpha=0.6)
    alpha, eta, checked = mech.alpha, mech.eta, 0
    while checked < 2000:
        x = rng.dirichlet(np.full(10, 0.3))
        y = rng.dirichlet(np.full(10, 1.0))
        f = rng.random(10) * (rng.random(10) < 0.6)
        gap = f @ x - f @ y
        if abs(gap) < alpha / 3:
            continue
        sigma = 1 if gap > 0 else -1
        r = 1 - f if sigma > 0 else f
        y_new = y * np.exp(-eta * r)
        y_new /= y_new.sum()
        assert relative_entropy(x, y) - relative_entropy(x, y_new) >= alpha**2 / 36 - 1e-12
        checked += 1


# -- check 4: Corollary 7 on a noise-free run ----------------------------------------------------
def test_hard_count_never_exceeds_H_on_noise_free_adversarial_run():
    N, n, alpha = 8, 40, 0.5
    # the worst-case noise function: the accountant never pauses while the subroutine is accurate
    mech = PMWG(universe_size=N, n=n, epsilon=1.0, alpha=alpha, xi_n=worst_case_xi_n(N, n, 1.0, alpha))
    zero = ZeroNoise()
    rng = np.random.default_rng(4)
    state = _absorb_all(mech, mech.init_state("s"), rng.integers(0, 2, n), zero)
    for t in range(n, 400):
        centre = min(N - 1, t // 50)  # drifting data
        for _ in range(30):  # adversary: the query of largest |f(x) − f(y)|
            x = state.counts / state.t
            f = (x > state.y).astype(float) if rng.random() < 0.5 else (x < state.y).astype(float)
            before = state.hard_count
            state, rel = _ask(mech, state, f, noise=zero)
            assert not rel.meta["unchecked"]
            assert state.hard_count <= hard_query_bound(state.t, N, n, alpha)[0]
            if state.hard_count == before:
                break
        state = _absorb_all(mech, state, [min(N - 1, centre + rng.integers(0, 2))], zero)
    assert state.hard_count >= 5


# -- check 6: accountant, ledger, pausing -------------------------------------------------------
@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_accountant_charges_each_segment_and_matches_ledger(delta):
    N, n = 4, 30
    mech = PMWG(universe_size=N, n=n, epsilon=30.0, alpha=0.3, delta=delta, xi_n=0.2)
    state = _absorb_all(mech, mech.init_state("s"), np.zeros(n, np.int64))
    rng = np.random.default_rng(6)
    costs = []
    for step in range(200):
        opened = state.segment_index
        t = state.t
        state, rel = _ask(mech, state, np.eye(N)[rng.integers(0, N)], f"q{step}")
        if state.segment_index > opened:
            costs.append(2.25 / (t * mech.sub.xi(t)))
            assert state.segments[-1, 0] == t
        total = sum(costs) if delta == 0 else sum(c * c for c in costs)
        assert state.total == pytest.approx(total, rel=1e-12)
        eps_expected = total if delta == 0 else cdp_epsilon(total, delta)
        assert rel.epsilon_spent == pytest.approx(eps_expected, rel=1e-12)
        assert rel.epsilon_spent <= mech.epsilon
        assert rel.delta_spent == (delta if total > 0 else 0.0)
        ledger = mech.element_spend(state, np.arange(1, state.t + 1))
        assert ledger.max() == pytest.approx(rel.epsilon_spent, rel=1e-12)
        assert np.all(ledger <= rel.epsilon_spent * (1 + 1e-12))
        state = _absorb_all(mech, state, [rng.integers(0, N)])
    assert len(costs) >= 3 and 2.25 / (n * mech.sub.xi(n)) == pytest.approx(2.25 * mech.sub.sensitivity(n))


def test_pause_answers_unchecked_from_public_state_only():
    N, n = 4, 50
    xi_n = 0.09
    one_segment = 2.25 / (n * xi_n)
    mech = PMWG(universe_size=N, n=n, epsilon=1.5 * one_segment, alpha=0.3, xi_n=xi_n)
    base = _absorb_all(mech, mech.init_state("s"), np.zeros(n, np.int64))
    state, first = _ask(mech, base, np.eye(N)[0], "first")  # opens the only affordable segment
    assert first.meta["hard"] and not first.meta["unchecked"]  # x = e_0 vs uniform y: far off

    def continue_with(fill, state):
        out = []
        for i in range(3 * n - 5):  # s_t halves only at t = 4n: still paused before
            state = _absorb_all(mech, state, [fill])
            state, rel = _ask(mech, state, np.eye(N)[i % N], f"p{i}")
            out.append(rel)
        return out

    a, b = continue_with(0, state), continue_with(3, state)  # different private data after the pause
    assert all(r.meta["unchecked"] for r in a + b)
    assert [float(r.value[0]) for r in a] == [float(r.value[0]) for r in b]
    assert all(r.epsilon_spent == first.epsilon_spent for r in a)


def test_tiny_xi_pauses_from_the_start():
    mech = PMWG(universe_size=4, n=10, epsilon=1.0, alpha=0.5, xi_n=1e-9)
    state = _absorb_all(mech, mech.init_state("s"), np.zeros(10, np.int64))
    state, rel = _ask(mech, state, [1, 0, 0, 0])
    assert rel.meta["unchecked"] and rel.value[0] == pytest.approx(0.25) and rel.epsilon_spent == 0.0
    assert state.segment_index == 0


# -- check 7 and 8: default xi_n -------------------------------------------------------------------
@pytest.mark.parametrize("a, pure, approx", [(0.25, 0.9220, 0.964), (0.5, 0.9041, 0.961), (0.75, 0.7579, 0.950)])
def test_worst_case_xi_n_covers_the_greedy_worst_case(a, pure, approx):
    spend = greedy_worst_case_spend(16, 200, 0.5, 1.0, 10**6, a=a)
    assert spend <= 1.0 and spend == pytest.approx(pure, abs=1e-3)  # reference values 0.923/0.910/0.781: see docs
    spend = greedy_worst_case_spend(16, 200, 0.5, 1.0, 10**6, a=a, delta=1e-6)
    assert spend <= 1.0 and spend == pytest.approx(approx, abs=1e-3)


def test_worked_numbers_of_section_1_5():
    N, n, alpha = 1024, 10**6, 0.25
    xi = worst_case_xi_n(N, n, 1.0, alpha)
    assert xi * n / 2.25 == pytest.approx(32502.05, rel=1e-4)
    assert xi == pytest.approx(0.0731, rel=1e-3) and alpha / (12 * xi) == pytest.approx(0.285, rel=1e-3)
    xi = worst_case_xi_n(N, n, 1.0, alpha, delta=1e-6)
    u = math.sqrt(cdp_budget_sq(1.0, 1e-6))
    assert u == pytest.approx(0.186917, rel=1e-5)
    assert (xi * n * u / 2.25) ** 2 == pytest.approx(17671.79, rel=1e-4)
    assert xi == pytest.approx(0.0016002, rel=1e-4) and alpha / (12 * xi) == pytest.approx(13.02, rel=1e-3)
    assert cdp_epsilon(cdp_budget_sq(0.7, 1e-5), 1e-5) == pytest.approx(0.7, rel=1e-12)


# -- noise schedule, determinism, state, validation ---------------------------------------------
def test_noise_function_and_sensitivity():
    mech = PMWG(universe_size=8, n=100, epsilon=1.0, alpha=0.5, a=0.3, xi_n=0.2)
    for t in (100, 150, 1000, 12345):
        assert mech.sub.xi(t) == 0.2 * (100 / t) ** 0.3
        assert mech.sub.sensitivity(t) == pytest.approx(t ** (0.3 - 1) * 100 ** (-0.3) / 0.2, rel=1e-12)


def test_replay_is_deterministic_and_state_roundtrips():
    mech = PMWG(universe_size=32, n=20, epsilon=1.0, alpha=0.4, delta=1e-6)
    rng = np.random.default_rng(7)
    elements = [rng.integers(0, 32, 10) for _ in range(10)]
    queries = [[Query(10 * (i + 1) - j, f"q{i}{j}", (rng.random(32) < 0.3).astype(float)) for j in range(2)]
               if i >= 2 else [] for i in range(10)]
    s1, r1 = replay_growing(mech, "s", elements, queries, NOISE)
    s2, r2 = replay_growing(mech, "s", elements, queries, NOISE)
    assert r1 == r2 and len(r1) == 16
    assert mech.encode_state(s1) == mech.encode_state(s2)
    back = mech.decode_state(mech.encode_state(s1))
    assert mech.encode_state(back) == mech.encode_state(s1)
    assert all(r.step == r.meta["t"] for r in r1)


def test_step_refuses_query_outside_block():
    mech = PMWG(universe_size=4, n=2, epsilon=1.0, alpha=0.5)
    state = mech.init_state("s")
    with pytest.raises(ValueError):
        mech.step(state, GrowingBlock(np.array([0, 1]), (Query(5, "q", np.ones(4)),)), NOISE)


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=0.0), dict(epsilon=-1.0), dict(epsilon=math.nan), dict(alpha=0.0), dict(alpha=1.5),
    dict(n=0), dict(n=2.5), dict(universe_size=1), dict(delta=1.0), dict(delta=-0.1), dict(a=1.0),
    dict(a=-0.1), dict(xi_n=0.0), dict(xi_n=math.inf),
])
def test_invalid_parameters_raise(kwargs):
    base = dict(universe_size=8, n=10, epsilon=1.0, alpha=0.5)
    base.update(kwargs)
    with pytest.raises(ValueError):
        PMWG(**base)


@pytest.mark.parametrize("weights", [np.ones(7), np.full(8, 1.5), np.full(8, -0.1), np.full(8, np.nan), "abc"])
def test_bad_query_raises(weights):
    mech = PMWG(universe_size=8, n=2, epsilon=1.0, alpha=0.5)
    state = _absorb_all(mech, mech.init_state("s"), [0, 1])
    with pytest.raises(ValueError):
        mech.answer(state, Query(2, "bad", weights), NOISE)


@pytest.mark.parametrize("elements", [[8], [-1], [0.5]])
def test_bad_elements_raise(elements):
    mech = PMWG(universe_size=8, n=2, epsilon=1.0, alpha=0.5)
    with pytest.raises(ValueError):
        mech.absorb(mech.init_state("s"), np.asarray(elements), NOISE)


def test_large_universe_is_vectorised():
    N = 1 << 16
    mech = PMWG(universe_size=N, n=100, epsilon=1.0, alpha=0.5, delta=1e-6)
    rng = np.random.default_rng(8)
    state = _absorb_all(mech, mech.init_state("s"), rng.integers(0, N, 1000))
    for i in range(20):
        state, rel = _ask(mech, state, (rng.random(N) < 0.5).astype(float), f"q{i}")
    assert abs(state.y.sum() - 1) < 1e-12 and state.y.shape == (N,)
