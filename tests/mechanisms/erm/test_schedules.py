"""Spec erm-release §9 checks 5–11, 13, 14: exact, data-independent schedules, chains and spends."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from beam_dp.core.accounting.erm_log import events_of, spend_from_log
from beam_dp.mechanisms.erm import ContinualReleaseMechanism, MultiResolutionMechanism, SlidingWindowMechanism
from beam_dp.mechanisms.erm.sliding import BASE, LEFT, RIGHT
from beam_dp.mechanisms.erm.solver import certified_slack
from tests.mechanisms.erm.util import TINY, blocks, run, test_noise

EPS = 1.0


def flat(per_step):
    return [r for rels in per_step for r in rels]


def spends(releases, n_positions, mechanism):
    pure, _, worst = spend_from_log(events_of(releases), n_positions, mechanism.guarantee)
    return pure, worst


# -- Algorithm 2 ------------------------------------------------------------------------------
def test_multires_schedule_b100():  # check 5
    mech = MultiResolutionMechanism(block=100, model=TINY, lam=1.0, epsilon=EPS)
    per_step = run(mech, blocks(8, 100))
    got = {(s + 1) * 100: [tuple(r.meta["members"][0]) for r in rels] for s, rels in enumerate(per_step)}
    assert got[100] == [(1, 100)]
    assert got[200] == [(101, 200), (1, 200)]
    assert got[300] == [(201, 300)]
    assert got[400] == [(301, 400), (201, 400), (1, 400)]
    assert got[800] == [(701, 800), (601, 800), (401, 800), (1, 800)]
    b = 2 * (1 + certified_slack(1e-3, 100)) * TINY.lipschitz / (1.0 * 100 * EPS)  # 2Δ(B)/ε (4L/(λBε) at s = 1)
    assert all(r.meta["noise_scale"] == pytest.approx(b, rel=1e-12) for r in flat(per_step))
    # release times and members do not depend on the data
    other = run(mech, blocks(8, 100, seed=5))
    assert [[r.meta["members"] for r in rels] for rels in other] == [[r.meta["members"] for r in rels] for rels in per_step]


def test_multires_spends():  # check 6
    mech = MultiResolutionMechanism(block=100, model=TINY, lam=1.0, epsilon=EPS)
    per_step = run(mech, blocks(8, 100))
    rel = lambda T: flat(per_step[: T // 100])  # noqa: E731
    pure700, _ = spends(rel(700), 700, mech)
    assert pure700[0] == pytest.approx(7 / 8) and pure700[649] == pytest.approx(1 / 2)
    pure800, _ = spends(rel(800), 800, mech)
    for p in (1, 401, 800):
        assert pure800[p - 1] == pytest.approx(15 / 16)
    assert spends(rel(300), 300, mech)[0][100] == pytest.approx(3 / 4)
    assert spends(rel(400), 400, mech)[0][249] == pytest.approx(7 / 8)
    assert per_step[-1][-1].epsilon_spent == pytest.approx(15 / 16 * EPS)


# -- Algorithm 4 ------------------------------------------------------------------------------
TABLE = {  # table, b0 = 1, B = 4: t -> (role, members, w_ref = the release at time ...)
    4: ("base", (1, 4), None), 5: ("large", (5, 5), 4), 6: ("large", (5, 6), 4), 7: ("small", (7, 7), 6),
    8: ("base", (1, 8), None), 9: ("large", (9, 9), 8), 10: ("large", (9, 10), 8), 11: ("small", (11, 11), 10),
    12: ("large", (9, 12), 8), 13: ("small", (13, 13), 12), 14: ("small", (14, 14), 12),
    15: ("small", (15, 15), 12), 16: ("base", (1, 16), None),
}


def continual(**kw):
    return ContinualReleaseMechanism(update=1, base=4, model=TINY, lam=1.0, epsilon=2 * EPS, **kw)


def test_continual_schedule_table():  # check 7 (schedule)
    per_step = run(continual(), blocks(16, 1))
    assert all(not rels for rels in per_step[:3])
    id_at = {}
    for t in range(4, 17):
        (r,) = per_step[t - 1]
        id_at[t] = r.meta["model_id"]
        role, members, ref_t = TABLE[t]
        assert (r.meta["role"], tuple(r.meta["members"][0])) == (role, members), t
        assert r.meta["w_ref_id"] == (-1 if ref_t is None else id_at[ref_t]), t
    # the chain of the small update at t = 11: model(11) <- model(10) <- base(8)
    assert [c[0] for c in per_step[10][0].meta["chain"]] == [id_at[11], id_at[10], id_at[8]]


def test_continual_update_spends():  # check 7 (spends, ε_upd units)
    mech = continual()
    per_step = run(mech, blocks(256, 1))
    updates = [r for r in flat(per_step[:64]) if r.meta["role"] != "base"]
    pure, _ = spends(updates, 64, mech)
    e = mech.eps_upd
    want = {5: Fraction(3, 4), 6: Fraction(1, 4), 7: Fraction(1, 2), 8: 0, 9: Fraction(7, 8), 10: Fraction(3, 8),
            11: Fraction(5, 8), 12: Fraction(1, 8), 13: Fraction(1, 2), 14: Fraction(1, 2), 15: Fraction(1, 2), 16: 0,
            17: Fraction(15, 16), 20: Fraction(3, 16), 24: Fraction(1, 16), 32: 0}
    want.update({p: Fraction(1, 2) for p in range(25, 32)})
    for p, v in want.items():
        assert pure[p - 1] == pytest.approx(float(v) * e, abs=1e-12), p
    assert pure[:4].max() == 0
    updates256 = [r for r in flat(per_step) if r.meta["role"] != "base"]
    pure256, _ = spends(updates256, 256, mech)
    assert pure256.max() == pytest.approx(127 / 128 * e) and pure256.argmax() + 1 == 129
    assert pure256.max() < e


def test_continual_composite_below_budget_and_ledger():  # checks 8 and 13
    for kw in ({}, {"base_fraction": 0.3}, {"variant": "basic"}, {"variant": "independent"}, {"sampling": True}):
        mech = ContinualReleaseMechanism(update=2, base=8, model=TINY, lam=1.0, epsilon=EPS, **kw)
        releases = flat(run(mech, blocks(70, 2)))
        for i, r in enumerate(releases):  # every release's epsilon_spent = the log's worst element so far
            pure, worst = spends(releases[: i + 1], 140, mech)
            assert r.epsilon_spent == pytest.approx(worst[0], rel=1e-12)
            assert pure.max() < EPS or (kw.get("variant") == "independent" and pure.max() <= EPS * (1 + 1e-12))


def test_continual_gaussian_ledger():
    mech = ContinualReleaseMechanism(update=1, base=4, model=TINY, lam=1.0, epsilon=EPS, delta=1e-6, noise="gaussian")
    releases = flat(run(mech, blocks(128, 1)))
    _, mu_sq, worst = spend_from_log(events_of(releases), 128, mech.guarantee)
    assert mu_sq.max() <= mech.mu_total**2 * (1 + 1e-12)
    assert releases[-1].epsilon_spent == pytest.approx(worst[0], rel=1e-9) and worst[0] < EPS
    assert releases[-1].delta_spent == 1e-6


# -- Algorithm 5 ------------------------------------------------------------------------------
#, paper 0-indexed elements: (trained [(a, b)] in order, chain [(a, b)] released first)
TRACE = [
    ([(3, 6), (1, 2), (0, 0)], [(0, 0), (1, 2), (3, 6)]),
    ([(7, 7)], [(7, 7), (1, 2), (3, 6)]),
    ([(7, 8), (2, 2)], [(2, 2), (7, 8), (3, 6)]),
    ([(9, 9)], [(9, 9), (7, 8), (3, 6)]),
    ([(7, 10), (5, 6), (4, 4)], [(4, 4), (5, 6), (7, 10)]),
    ([(11, 11)], [(11, 11), (5, 6), (7, 10)]),
    ([(11, 12), (6, 6)], [(6, 6), (11, 12), (7, 10)]),
    ([(13, 13)], [(13, 13), (11, 12), (7, 10)]),
    ([(11, 14), (9, 10), (8, 8)], [(8, 8), (9, 10), (11, 14)]),
]


def zero_indexed(a, b):
    return (a - 1, b - 1)


def test_sliding_window_example_1_and_extended_trace():  # check 9
    mech = SlidingWindowMechanism(block=1, levels=3, model=TINY, lam=1.0, epsilon=EPS)
    per_step = run(mech, blocks(15, 1))
    assert all(not rels for rels in per_step[:6])
    for s, (trained, chain) in enumerate(TRACE):
        (r,) = per_step[6 + s]
        assert [zero_indexed(*e["members"][0]) for e in r.meta["events"]] == trained, s
        assert [zero_indexed(a, b) for _, a, b in r.meta["chain"]] == chain, s
        assert tuple(zero_indexed(*r.meta["members"][0])) == chain[0]  # released = size-1 bucket
        assert r.meta["chain"][0][0] == r.meta["model_id"]
        for i in range(len(r.meta["chain"]) - 1):  # each link is regularised to the next
            ids = {e["model_id"]: e for e in r.meta["events"]}
            link = ids.get(r.meta["chain"][i][0])
            if link is not None:
                assert link["w_ref_id"] == r.meta["chain"][i + 1][0]


def test_sliding_window_general_w0():  # closing example: w0 = 2, k = 3
    mech = SlidingWindowMechanism(block=2, levels=3, model=TINY, lam=1.0, epsilon=EPS)
    per_step = run(mech, blocks(7, 2))
    (r,) = per_step[6]
    assert [tuple(e["members"][0]) for e in r.meta["events"]] == [(7, 14), (3, 6), (1, 2)]
    assert tuple(r.meta["members"][0]) == (1, 2)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_sliding_window_invariants_and_counts(k):  # checks 9 (counts) and 11
    mech = SlidingWindowMechanism(block=1, levels=k, model=TINY, lam=1.0, epsilon=EPS)
    H, W = 2 ** (k - 1), 2**k - 1
    state = mech.init_state("s")
    for c, block in enumerate(blocks(3 * W + 2, 1), start=1):
        r_before = state.r
        state, releases = mech.step(state, block, test_noise())
        if c < W:
            assert not releases
            continue
        (rel,) = releases
        assert rel.step == c  # release times t = w + s·w0
        b = state.buckets
        cover = sorted(x for first, size, _, _ in b for x in range(first, first + size))
        assert cover == list(range(c - W + 1, c + 1))  # buckets tile the window
        sizes = sorted(b[:, 1].tolist())
        assert sizes == sorted([H] + [2**j for j in range(k - 1)])  # one bucket per size
        right = sum(int(s) for _, s, side, _ in b if side == RIGHT)
        left = sum(int(s) for _, s, side, _ in b if side == LEFT)
        assert right == state.r and left == H - 1 - state.r and (b[:, 2] == BASE).sum() == 1
        refresh = c == W or r_before + 1 == H
        m = (~r_before & (r_before + 1)).bit_length() - 1
        assert len(rel.meta["events"]) == (k if refresh else m + 1)
        assert rel.meta["events"][-1]["model_id"] == rel.meta["model_id"]
        if k > 1:
            assert rel.meta["bucket_blocks"] == 1


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_sliding_window_spends(k):  # check 10 and 13
    mech = SlidingWindowMechanism(block=1, levels=k, model=TINY, lam=1.0, epsilon=EPS)
    W = 2**k - 1
    T = 4 * W + 3
    releases = flat(run(mech, blocks(T, 1)))
    pure, worst = spends(releases, T, mech)
    departed = np.arange(W + 1, T - W + 1)  # 1-based positions that arrived after the first window and left
    assert np.allclose(pure[departed - 1], 2 / 3 * (1 - 2.0**-k) * EPS, atol=1e-12)
    assert pure.max() < EPS
    assert releases[-1].epsilon_spent == pytest.approx(worst[0], rel=1e-12)
    if k == 3:
        assert np.allclose(pure[:5], [1 / 6, 1 / 12, 1 / 4, 1 / 3, 1 / 2])


def test_sliding_window_gaussian_spend():
    mech = SlidingWindowMechanism(block=1, levels=3, model=TINY, lam=1.0, epsilon=EPS, delta=1e-6, noise="gaussian")
    releases = flat(run(mech, blocks(40, 1)))
    _, mu_sq, worst = spend_from_log(events_of(releases), 40, mech.guarantee)
    assert mu_sq.max() < mech.mu_total**2 and worst[0] < EPS
    assert releases[-1].epsilon_spent == pytest.approx(worst[0], rel=1e-9)


# -- determinism and state (check 14) ------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: MultiResolutionMechanism(block=3, model=TINY, lam=1.0, epsilon=EPS, max_level=1),
    lambda: ContinualReleaseMechanism(update=2, base=4, model=TINY, lam=1.0, epsilon=EPS, sampling=True),
    lambda: SlidingWindowMechanism(block=2, levels=2, model=TINY, lam=1.0, epsilon=EPS),
])
def test_determinism_and_state_round_trip(make):
    mech = make()
    unit = getattr(mech, "block", None) if not hasattr(mech, "b0") else mech.b0
    unit = mech.w0 if hasattr(mech, "w0") else unit
    data = blocks(9, unit)
    state = mech.init_state("s")
    for block in data:
        encoded = mech.encode_state(state)
        decoded = mech.decode_state(encoded)
        assert mech.encode_state(decoded) == encoded
        s1, r1 = mech.step(state, block, test_noise())
        s2, r2 = mech.step(decoded, block, test_noise())
        assert r1 == r2 and mech.encode_state(s1) == mech.encode_state(s2)
        state = s1
