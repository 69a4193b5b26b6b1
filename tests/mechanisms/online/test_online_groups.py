"""Group stepping of the online learners WDP-COCOP/COCOL (issue 16, item 1).

A group of streams stepped in one array operation per step releases what each stream stepped alone
releases (the same window-tree noise cells; values compared to 1e-12, since the group's row-wise
norms, dot products and sums may round differently from a batch of one), with the same spend and
meta; states move between the per-stream and the group form; bad records are refused with
``record``'s reasons; and the per-stream releases and encoded states of the implementation before
the port (commit b8dfd12, ``data/online_releases_b8dfd12.json``) are reproduced.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.io import release_dicts
from beam_dp.mechanisms.online.convex_sets import Box, L1Ball, L2Ball, Polytope, Simplex
from beam_dp.mechanisms.online.learners import WDPCOCOL, WDPCOCOP, OnlineLoss, OnlineState, make_online_learner
from beam_dp.mechanisms.replay import replay_learner
from beam_dp.steps.schema import ReleaseColumns, release_table
from tests.mechanisms.group_checks import assert_stack_refusals
from tests.release_checks import assert_release_matches

KEY = bytes(range(32))
# > 4 cells per node: the array Philox path, not numpy's per-cell one; not in sorted order
STREAMS = [f"user-{i}" for i in (3, 1, 4, 15, 9, 2, 6, 5, 35)]
DIM = 3
SETS = {
    "l2_ball": lambda: L2Ball(DIM, 0.8),
    "box": lambda: Box([-0.3, 0.0, -1.0], [0.4, 1.0, 0.0]),
    "simplex": lambda: Simplex(DIM),
    "l1_ball": lambda: L1Ball(DIM, 0.7),
    "polytope": lambda: Polytope([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0.5]]),
}
LOSSES = ("logistic", "squared")
LAWS = {"gamma": dict(epsilon=4.0), "gaussian": dict(epsilon=4.0, delta=1e-6, noise="gaussian", calibration="analytic")}


def build(algo: str, kind: str, loss="logistic", law: str = "gamma", window: int = 5):
    kw = dict(dim=DIM, constraint=SETS[kind](), loss=loss, window=window, **LAWS[law])
    if isinstance(loss, str):
        kw["mu"] = 0.5
    if algo == "cocol":
        return WDPCOCOL(alpha=0.3, C0=10.0, **kw)
    return WDPCOCOP(**kw)


def records(steps: int, n: int, loss: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, n, d)`` features (some rows of norm > 1) and ``(steps, n)`` labels (±1 for logistic,
    some beyond [−1, 1] for squared)."""
    rng = np.random.default_rng(seed)
    A = rng.normal(0.0, 0.9, (steps, n, DIM))
    b = rng.choice([-1.0, 1.0], (steps, n)) if loss == "logistic" else rng.uniform(-1.6, 1.6, (steps, n))
    return A, b


def assert_same_release(row, single):
    # the same noise cells and formulas; floats within tolerance for the rounding of row-wise array operations
    assert_release_matches(row, single)


def assert_same_states(mech, a: OnlineState, b: OnlineState):
    assert (a.stream, a.t, a.tree.stream, a.tree.t) == (b.stream, b.t, b.tree.stream, b.tree.t)
    for x, y in [(a.x, b.x), (a.S, b.S)] + [(getattr(a.tree, n), getattr(b.tree, n)) for n in mech.tree._array_fields()]:
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


CASES = [(algo, kind, loss, law) for algo, kinds in (("cocop", SETS), ("cocol", ("box", "simplex", "l1_ball", "polytope")))
         for kind in kinds for loss in LOSSES for law in LAWS]


@pytest.mark.parametrize("algo,kind,loss,law", CASES, ids=["-".join(c) for c in CASES])
def test_group_step_equals_per_stream_steps(algo, kind, loss, law):
    mech = build(algo, kind, loss, law)
    source = NoiseSource(KEY)
    A, b = records(20, len(STREAMS), loss)  # window 5: block size 8, two block ends
    group, states = mech.init_group(STREAMS), [mech.init_state(s) for s in STREAMS]
    for t in range(20):
        group, batch = mech.step_group(group, A[t], b[t], source)
        assert batch.step == t + 1 and batch.streams == tuple(STREAMS) and batch.values.shape == (len(STREAMS), DIM)
        for i, row in enumerate(batch.rows()):
            states[i], (single,) = mech.step(states[i], (A[t, i], b[t, i]), source)
            assert_same_release(row, single)
            assert mech.constraint.contains(row.value["x"], 1e-9)
    for state, back in zip(states, mech.unstack(group)):
        assert_same_states(mech, state, back)
        assert_same_states(mech, state, mech.decode_state(mech.encode_state(back)))


def test_a_custom_loss_is_applied_row_by_row():
    """A custom gradient callable sees one record per call (its own arrays), and the group equals the
    per-stream steps; gradients above its declared L are clipped row by row."""
    calls = []

    def gradient(x, a, b):
        calls.append((x.shape, a.shape, type(b)))
        return 3.0 * (x - a) + b

    loss = OnlineLoss(kind="custom", mu=1.0, lipschitz=0.7, gradient=gradient)
    for algo in ("cocop", "cocol"):
        mech = build(algo, "box", loss)
        A, b = records(6, len(STREAMS), "squared", seed=2)
        group, states = mech.init_group(STREAMS), [mech.init_state(s) for s in STREAMS]
        calls.clear()
        for t in range(6):
            group, batch = mech.step_group(group, A[t], b[t], NoiseSource(KEY))
            for i, row in enumerate(batch.rows()):
                states[i], (single,) = mech.step(states[i], (A[t, i], b[t, i]), NoiseSource(KEY))
                assert_same_release(row, single)
        assert set(calls) == {((DIM,), (DIM,), float)} and len(calls) == 2 * 6 * len(STREAMS)


@pytest.mark.parametrize("algo,kind,law", [("cocop", "l1_ball", "gamma"), ("cocol", "simplex", "gaussian")])
def test_states_move_between_per_stream_and_group_form(algo, kind, law):
    """Per-stream states stacked mid-block, a group unstacked mid-run, and a group stepped twice from
    the same state (a retry) all continue with the releases of one uninterrupted per-stream run, and
    stepping one form never changes a state held in the other (the window tree reuses buffers)."""
    mech = build(algo, kind, "squared", law)
    source = NoiseSource(KEY)
    A, b = records(30, len(STREAMS), "squared", seed=8)
    ref = {s: mech.run(s, list(zip(A[:, i], b[:, i])), source) for i, s in enumerate(STREAMS)}

    def run_group(group, lo, hi):
        for t in range(lo, hi):
            group, batch = mech.step_group(group, A[t], b[t], source)
            for row in batch.rows():
                assert_same_release(row, ref[row.stream][t])
        return group

    states = [mech.init_state(s) for s in STREAMS]
    for t in range(11):  # block size 8: mid-block
        states = [mech.step(st, (A[t, i], b[t, i]), source)[0] for i, st in enumerate(states)]
    before = [mech.encode_state(st) for st in states]
    mid = run_group(mech.stack(states), 11, 17)
    assert [mech.encode_state(st) for st in states] == before
    unstacked = mech.unstack(mid)
    branch, _ = mech.step_group(mid, np.zeros((len(STREAMS), DIM)), np.zeros(len(STREAMS)), source)  # other input
    held = [mech.encode_state(st) for st in unstacked + mech.unstack(branch)]
    run_group(mid, 17, 30)
    run_group(mid, 17, 30)  # a retry of the same group state
    assert [mech.encode_state(st) for st in unstacked + mech.unstack(branch)] == held
    for i, state in enumerate(unstacked):  # the unstacked states continue alone
        for t in range(17, 30):
            state, (single,) = mech.step(state, (A[t, i], b[t, i]), source)
            assert_same_release(single, ref[STREAMS[i]][t])
    regroup = mech.stack([mech.decode_state(mech.encode_state(st)) for st in unstacked[::-1]])  # another order
    for t in range(17, 30):
        regroup, batch = mech.step_group(regroup, A[t, ::-1], b[t, ::-1], source)
        for row in batch.rows():
            assert_same_release(row, ref[row.stream][t])


FIXTURE = json.loads((Path(__file__).parents[1] / "data" / "online_releases_b8dfd12.json").read_text())


@pytest.mark.parametrize("name", sorted(FIXTURE["cases"]))
def test_a_group_of_one_releases_what_the_per_stream_code_released(name):
    """``data/online_releases_b8dfd12.json``: the per-stream implementation at commit b8dfd12 (before
    the group port) ran stream "fixture" 20 steps under ``KEY`` (block ends crossed), recorded every
    release and encoded its state after 9 steps. Today's per-stream step (the group of one) releases the
    same values (1e-12), spend and meta; the old encoded state decodes and continues to the recorded
    releases alone and in a group with another stream."""
    case = FIXTURE["cases"][name]
    mech = make_online_learner(dim=FIXTURE["dim"], **{"calibration": "paper", **case["config"]})  # recorded so
    A, b = np.array(case["features"]), np.array(case["labels"])
    expected = case["releases"]

    def check(release, exp):
        assert_release_matches(release, {"value": {"x": exp["x"]}, "epsilon_spent": exp["epsilon_spent"],
                                         "delta_spent": exp["delta_spent"], "meta": exp["meta"]})

    for release, exp in zip(mech.run("fixture", list(zip(A, b)), NoiseSource(KEY)), expected, strict=True):
        check(release, exp)
    k = FIXTURE["encoded_at"]
    state = mech.decode_state(base64.b64decode(case[f"state_at_step_{k}"]))
    assert (state.stream, state.t) == ("fixture", k)
    other = dataclasses.replace(state, stream="other", tree=dataclasses.replace(state.tree, stream="other"))
    group = mech.stack([other, state])
    for t in range(k, FIXTURE["steps"]):
        state, (release,) = mech.step(state, (A[t], b[t]), NoiseSource(KEY))
        group, batch = mech.step_group(group, np.stack([A[t], A[t]]), np.array([b[t], b[t]]), NoiseSource(KEY))
        check(release, expected[t])
        check(batch.rows()[1], expected[t])
        assert not np.allclose(batch.values[0], batch.values[1]) or t == k  # "other" has its own noise


BAD_ROWS = [  # (features, label) rows ``record`` refuses, for a logistic learner of dim 3
    ([np.nan, 0.0, 0.0], 1.0), ([0.0, np.inf, 0.0], -1.0), ([0.0, 1.0, 0.0], 0.5), ([0.0, 1.0, 0.0], 0.0),
    ([0.0, 1.0, 0.0], np.inf), ([0.0, 1.0, 0.0], np.nan), ([0.0, 1.0, 0.0], "x"),
]


def test_bad_records_are_refused_with_the_reasons_of_record():
    mech = build("cocop", "simplex", "logistic")
    source = NoiseSource(KEY)
    group = mech.init_group(["a", "b", "c"])
    good_A, good_b = np.full((3, DIM), 0.2), np.array([1.0, -1.0, 1.0])
    for a, label in BAD_ROWS:
        with pytest.raises(ValueError) as single:
            mech.record(a, label)
        reason = str(single.value).partition(": ")[0]
        assert reason in ("non_finite", "bad_value")
        A, b = good_A.copy(), good_b.astype(object)
        A[1], b[1] = a, label
        with pytest.raises(ValueError, match=f"^{reason}: "):
            mech.step_group(group, A, b, source)
    for A, b in [(np.zeros((3, DIM + 1)), good_b), (np.zeros((2, DIM)), good_b), (np.zeros(DIM), good_b),
                 (good_A, good_b[:2]), (good_A, good_b[:, None])]:
        with pytest.raises(ValueError, match="^wrong_shape: "):
            mech.step_group(group, A, b, source)
    with pytest.raises(ValueError, match="^wrong_shape: "):
        mech.record(np.zeros(DIM + 1), 1.0)
    with pytest.raises(ValueError, match="^bad_value: "):
        mech.step_group(group, good_A, [1.0, None, {"x": 1}], source)
    # nothing changed: the group steps to what a fresh group releases
    _, batch = mech.step_group(group, good_A, good_b, source)
    _, fresh = mech.step_group(mech.init_group(["a", "b", "c"]), good_A, good_b, source)
    np.testing.assert_array_equal(batch.values, fresh.values)
    # squared labels are clipped, not refused, row by row as record does
    sq = build("cocop", "simplex", "squared")
    rows, labels = sq.records(np.array([[3.0, 4.0, 0.0], [0.1, 0.0, 0.0]]), [7.0, -0.5], 2)
    np.testing.assert_allclose(rows, [[0.6, 0.8, 0.0], [0.1, 0.0, 0.0]], rtol=1e-15)
    assert labels.tolist() == [1.0, -0.5] == [sq.record(r, v).b for r, v in ((rows[0], 7.0), (rows[1], -0.5))]


def test_groups_refuse_mixed_steps_other_mechanisms_and_duplicate_streams():
    mech = build("cocol", "simplex", "squared")
    a, b = mech.init_state("a"), mech.init_state("b")
    b1, _ = mech.step(b, (np.ones(DIM), 0.3), NoiseSource(KEY))
    assert_stack_refusals(mech, a, b1, mech.tree.init_state("a"))
    other = WDPCOCOL(dim=DIM + 1, constraint=Simplex(DIM + 1), loss="squared", epsilon=4.0, window=5).init_group(["a"])
    with pytest.raises(ValueError, match="state does not match"):
        mech.step_group(other, np.zeros((1, DIM)), np.zeros(1), NoiseSource(KEY))


@pytest.mark.parametrize("kind", sorted(SETS))
def test_row_wise_projection_and_oracle_equal_one_row_at_a_time(kind):
    """``project_rows``/``llo_rows`` on a batch equal ``project``/``llo`` (the batch of one, checked
    against independent solvers in tests/mechanisms/online/test_convex_sets.py) on each row: no row leaks into
    another (points inside and outside, ties in ``c``, ``r`` large and small)."""
    C = SETS[kind]()
    rng = np.random.default_rng(5)
    X = rng.normal(0.0, 0.8, (40, DIM))
    X[:5] *= 0.01  # inside every set that contains a neighbourhood of 0
    got = C.project_rows(X)
    np.testing.assert_allclose(got, np.array([C.project(x) for x in X]), rtol=1e-12, atol=1e-12)
    if not C.has_llo:
        with pytest.raises(NotImplementedError):
            C.llo_rows(got, 0.1, X)
        return
    P = C.project_rows(X)  # points of the set
    Cs = rng.normal(size=(40, DIM))
    Cs[:6, 1] = Cs[:6, 0]  # ties
    for r in (1e-3, 0.1, 3.0):
        np.testing.assert_allclose(C.llo_rows(P, r, Cs), np.array([C.llo(p, r, c) for p, c in zip(P, Cs)]),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("group_size", [None, 1, 4])
def test_replay_learner_equals_per_stream_runs(group_size):
    mech = build("cocol", "l1_ball", "logistic")
    A, b = records(12, len(STREAMS), "logistic", seed=3)
    batches = []
    replay_learner(mech, tuple(STREAMS), A, b, NoiseSource(KEY), batches.append, group_size=group_size)
    size = group_size or len(STREAMS)
    assert len(batches) == 12 * -(-len(STREAMS) // size) and all(len(batch) <= size for batch in batches)
    got = {}
    for batch in batches:
        for row in batch.rows():
            got.setdefault(row.stream, []).append(row)
    for i, s in enumerate(STREAMS):
        for row, single in zip(got[s], mech.run(s, list(zip(A[:, i], b[:, i])), NoiseSource(KEY)), strict=True):
            assert_same_release(row, single)
    with pytest.raises(ValueError, match="expected features"):
        replay_learner(mech, tuple(STREAMS), A[:, :3], b, NoiseSource(KEY), batches.append)


def test_release_table_writes_named_values_as_their_rows():
    mech = build("cocop", "l2_ball", "squared")
    group = mech.init_group(STREAMS[:3])
    parts = []
    for t in (1, 2):
        group, batch = mech.step_group(group, np.full((3, DIM), 0.1 * t), np.array([0.5, -0.5, 2.0]), NoiseSource(KEY))
        parts.append(ReleaseColumns(batch, mech.guarantee, t * 10_000_000, (t + 1) * 10_000_000))
    table = release_table(parts)
    assert release_dicts(table) == [row._asdict() for part in parts for row in part.rows()]
    assert table.column("parts")[0].as_py() == json.dumps([["x", [DIM]]]) and table.column("shape")[0].as_py() == []
