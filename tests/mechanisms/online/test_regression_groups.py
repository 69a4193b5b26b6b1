"""Group stepping of PRIVINCREG₁ (issue 16, item 1), and PRIVINCREG₂ on the same code.

A group of streams stepped in one array pass per step releases what each stream stepped alone
releases (the same tree noise cells; values compared to 1e-12, since the group's batched matrix
products and row-wise projections may round differently from a group of one), with the same spend
and meta; streams may have different numbers of records in a step, or none; states move between
the per-stream and the group form; bad input is refused as before; and the per-stream releases and
encoded states of the implementation before the port (commit d820e02,
``data/regression_releases_d820e02.json``) are reproduced.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.online.regression import (
    PrivIncReg1,
    PrivIncReg2,
    RegressionBlock,
    RegState,
    make_incremental_regression,
)
from tests.mechanisms.group_checks import assert_stack_refusals
from tests.release_checks import assert_release_matches

KEY = bytes(range(32))
STREAMS = [f"user-{i}" for i in (3, 1, 4, 15, 9, 2, 6)]  # not in sorted order
DIM = 3
CONFIGS = {  # r_t from 2 (eps 8) to hundreds (eps 2000); plain, hybrid and doubling trees
    "l2-hybrid-every1": dict(constraint={"kind": "l2_ball", "radius": 1.0}, epsilon=8.0, delta=1e-5),
    "l1-horizon-every3": dict(constraint={"kind": "l1_ball", "radius": 0.8}, epsilon=8.0, delta=1e-5, horizon=32,
                              release_every=3),
    "l2-doubling-sym-capped": dict(constraint={"kind": "l2_ball", "radius": 0.7}, epsilon=1000.0, delta=1e-6,
                                   unbounded="doubling", symmetrize=True, calibration="analytic", r_max=60),
    "l1-hybrid-many-iterations": dict(constraint={"kind": "l1_ball", "radius": 0.6}, epsilon=2000.0, delta=1e-5,
                                      calibration="analytic"),
}


def build(name: str) -> PrivIncReg1:
    return PrivIncReg1(dim=DIM, **CONFIGS[name])


def steps(n_steps: int, seed: int = 0, n_streams: int = len(STREAMS)) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: records ``X (n, d)`` (some of norm > 1), labels ``y (n,)`` (some beyond [−1, 1]) and the
    stream of each row, interleaved; streams get 0 to 4 records a step (stream 0 none at even steps)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_steps):
        counts = rng.integers(0, 5, n_streams)
        if t % 2 == 0:
            counts[0] = 0
        rows = rng.permutation(np.repeat(np.arange(n_streams), counts))
        out.append((rng.normal(0.0, 0.8, (len(rows), DIM)), rng.uniform(-1.5, 1.5, len(rows)), rows))
    return out


def block_of(X: np.ndarray, y: np.ndarray, rows: np.ndarray, i: int) -> RegressionBlock:
    """Stream ``i``'s records of a step, in arrival order."""
    return RegressionBlock(X[rows == i], y[rows == i])


def assert_same_release(row, single):
    # the same noise cells and formulas; floats within tolerance for the rounding of batched array operations
    assert_release_matches(row, single)


def assert_same_states(mech: PrivIncReg1, a: RegState, b: RegState):
    assert (a.stream, a.t, a.tree_q.stream, a.tree_Q.stream, a.tree_q.t) == (b.stream, b.t, b.tree_q.stream, b.tree_Q.stream, b.tree_q.t)
    pairs = [(a.theta, b.theta), (a.aux, b.aux), (a.q_hat, b.q_hat), (a.Q_hat, b.Q_hat)]
    pairs += [(getattr(a.tree_q, n), getattr(b.tree_q, n)) for n in mech.tree_q._array_fields()]
    pairs += [(getattr(a.tree_Q, n), getattr(b.tree_Q, n)) for n in mech.tree_Q._array_fields()]
    for x, y in pairs:
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_group_step_equals_per_stream_steps(name):
    mech = build(name)
    source = NoiseSource(KEY)
    group, states = mech.init_group(STREAMS), [mech.init_state(s) for s in STREAMS]
    released = 0
    for X, y, rows in steps(20):
        group, batch = mech.step_group(group, X, y, rows, source)
        singles = []
        for i in range(len(STREAMS)):
            states[i], out = mech.step(states[i], block_of(X, y, rows, i), source)
            singles.append(out)
        if batch is None:
            assert group.t % mech.release_every and all(out == [] for out in singles)
            continue
        released += 1
        assert batch.streams == tuple(STREAMS) and batch.step == group.t and batch.values.shape == (len(STREAMS), DIM)
        for row, (single,) in zip(batch.rows(), singles, strict=True):
            assert_same_release(row, single)
            assert mech.constraint.contains(row.value["theta"], 1e-9)
        assert len({tuple(v) for v in batch.values}) == len(STREAMS)  # every stream has its own data and noise
    assert released == 20 // mech.release_every
    for state, back in zip(states, mech.unstack(group), strict=True):
        assert_same_states(mech, state, back)
        assert_same_states(mech, state, mech.decode_state(mech.encode_state(back)))


def test_states_move_between_per_stream_and_group_form():
    """Per-stream states stacked mid-run, a group unstacked mid-run, and a group stepped twice from the
    same state (a retry) all continue with the releases of one uninterrupted per-stream run, and
    stepping one form never changes a state held in the other."""
    mech = build("l2-doubling-sym-capped")
    source = NoiseSource(KEY)
    data = steps(24, seed=4)
    ref = {s: mech.run(s, [block_of(X, y, rows, i) for X, y, rows in data], source) for i, s in enumerate(STREAMS)}

    def run_group(group, lo, hi):
        for X, y, rows in data[lo:hi]:
            group, batch = mech.step_group(group, X, y, rows, source)
            for row in batch.rows():
                assert_same_release(row, ref[row.stream][group.t - 1])
        return group

    states = [mech.init_state(s) for s in STREAMS]
    for X, y, rows in data[:7]:
        states = [mech.step(st, block_of(X, y, rows, i), source)[0] for i, st in enumerate(states)]
    before = [mech.encode_state(st) for st in states]
    mid = run_group(mech.stack(states), 7, 13)
    assert [mech.encode_state(st) for st in states] == before
    unstacked = mech.unstack(mid)
    branch, _ = mech.step_group(mid, np.ones((3, DIM)), np.ones(3), np.array([0, 0, 5]), source)  # other input
    held = [mech.encode_state(st) for st in unstacked + mech.unstack(branch)]
    run_group(mid, 13, 24)
    run_group(mid, 13, 24)  # a retry of the same group state
    assert [mech.encode_state(st) for st in unstacked + mech.unstack(branch)] == held
    for i, state in enumerate(unstacked):  # the unstacked states continue alone
        for t, (X, y, rows) in enumerate(data[13:], start=13):
            state, (single,) = mech.step(state, block_of(X, y, rows, i), source)
            assert_same_release(single, ref[STREAMS[i]][t])
    order = np.arange(len(STREAMS))[::-1]  # regrouped in another order: stream i is now row order[i]
    regroup = mech.stack([mech.decode_state(mech.encode_state(unstacked[i])) for i in order])
    position = np.argsort(order)
    for t, (X, y, rows) in enumerate(data[13:], start=13):
        regroup, batch = mech.step_group(regroup, X, y, position[rows], source)
        for row in batch.rows():
            assert_same_release(row, ref[row.stream][t])


FIXTURE = json.loads((Path(__file__).parents[1] / "data" / "regression_releases_d820e02.json").read_text())


def recorded(exp: dict) -> dict:
    """A fixture's release as the fields :func:`assert_release_matches` compares."""
    return {"step": exp["step"], "value": {"theta": exp["theta"]}, "epsilon_spent": exp["epsilon_spent"],
            "delta_spent": exp["delta_spent"], "meta": exp["meta"]}


def fixture_case(name: str):
    case = FIXTURE["cases"][name]
    kwargs = dict(case["config"])
    mech = make_incremental_regression(kwargs.pop("algorithm"), **kwargs)
    d = kwargs["dim"]
    blocks = [(np.array(X, dtype=np.float64).reshape(-1, d), np.array(y, dtype=np.float64)) for X, y in case["blocks"]]
    # the trees' public parameters, declared in every release's meta since the fixture was recorded
    releases = [dict(exp, meta={**exp["meta"], **mech.tree_meta}) for exp in case["releases"]]
    return mech, blocks, releases, case


@pytest.mark.parametrize("name", sorted(FIXTURE["cases"]))
def test_a_group_of_one_releases_what_the_per_stream_code_released(name):
    """``data/regression_releases_d820e02.json``: the per-stream implementation at commit d820e02
    (before the group port) ran stream "fixture" 20 steps under ``KEY`` (L1/L2 balls, known and
    unknown horizon, ``release_every`` 1 to 3, one record or 0 to 4 per step, PRIVINCREG₂ too),
    recorded every release and encoded its state after 9 steps. Today's per-stream step (the group
    of one) releases the same values (1e-12), spend and meta; the old encoded state decodes and
    continues to the recorded releases alone and, for PRIVINCREG₁, in a group with another stream."""
    mech, blocks, expected, case = fixture_case(name)
    by_step = {exp["step"]: exp for exp in expected}

    def check(release, exp):
        assert_release_matches(release, recorded(exp))

    for release, exp in zip(mech.run("fixture", [RegressionBlock(X, y) for X, y in blocks], NoiseSource(KEY)),
                            expected, strict=True):
        check(release, exp)
    k = FIXTURE["encoded_at"]
    state = mech.decode_state(base64.b64decode(case[f"state_at_step_{k}"]))
    assert (state.stream, state.t) == ("fixture", k)
    grouped = not isinstance(mech, PrivIncReg2)
    if grouped:
        other = dataclasses.replace(state, stream="other", tree_q=dataclasses.replace(state.tree_q, stream="other"),
                                    tree_Q=dataclasses.replace(state.tree_Q, stream="other"))
        group = mech.stack([other, state])
    for t in range(k, FIXTURE["steps"]):
        X, y = blocks[t]
        state, out = mech.step(state, RegressionBlock(X, y), NoiseSource(KEY))
        assert [r.step for r in out] == ([t + 1] if t + 1 in by_step else [])
        for release in out:
            check(release, by_step[t + 1])
        if grouped:
            rows = np.repeat([0, 1], len(y))
            group, batch = mech.step_group(group, np.concatenate([X, X]), np.concatenate([y, y]), rows, NoiseSource(KEY))
            assert (batch is None) == (out == [])
            if batch is not None:
                check(batch.rows()[1], by_step[t + 1])
                assert not np.allclose(batch.values[0], batch.values[1])  # "other" has its own noise


def test_privincreg2_steps_one_stream_at_a_time_through_the_same_code():
    """PRIVINCREG₂'s step is the group of one of the shared step (checked against the fixture above);
    ``step_group`` takes a group of one and refuses larger groups (its lift meta is per stream)."""
    mech, blocks, expected, _ = fixture_case("reg2-l2-horizon20-every1-blocks")
    assert isinstance(mech, PrivIncReg2)
    group = mech.init_group(["fixture"])
    for (X, y), exp in zip(blocks, expected, strict=True):
        group, batch = mech.step_group(group, X, y, np.zeros(len(y), dtype=int), NoiseSource(KEY))
        (row,) = batch.rows()
        assert_release_matches(row, recorded(exp))
        assert "lift_fallback" in row.meta
    with pytest.raises(ValueError, match="one stream at a time"):
        mech.step_group(mech.init_group(["a", "b"]), blocks[0][0], blocks[0][1], np.zeros(len(blocks[0][1]), dtype=int),
                        NoiseSource(KEY))


def test_bad_input_is_refused_as_before_and_changes_nothing():
    mech = build("l2-hybrid-every1")
    source = NoiseSource(KEY)
    group = mech.init_group(["a", "b", "c"])
    X, y, rows = np.full((4, DIM), 0.2), np.array([0.5, -0.5, 1.0, 0.0]), np.array([2, 0, 2, 1])
    for bad_X, bad_y in [(np.where(np.eye(4, DIM, k=1) > 0, np.nan, X), y), (X, np.array([0.5, np.inf, 1.0, 0.0]))]:
        with pytest.raises(ValueError, match="non-finite"):
            mech.step(mech.init_state("a"), RegressionBlock(bad_X, bad_y), source)
        with pytest.raises(ValueError, match="non-finite"):
            mech.step_group(group, bad_X, bad_y, rows, source)
    for bad_X, bad_y in [(np.zeros((4, DIM + 1)), y), (X, y[:3]), (X[0], y[:1])]:
        with pytest.raises(ValueError, match="expected X of shape"):
            mech.step(mech.init_state("a"), RegressionBlock(bad_X, bad_y), source)
        with pytest.raises(ValueError, match="expected X of shape"):
            mech.step_group(group, bad_X, bad_y, rows, source)
    for bad_rows in ([2, 0, 3, 1], [2, 0, -1, 1], [2.0, 0.0, 2.0, 1.0], ["a", "b", "c", "a"]):
        with pytest.raises(ValueError, match=r"stream indices in \[0, 3\)"):
            mech.step_group(group, X, y, np.array(bad_rows), source)
    for bad_rows in (rows[:3], rows[:, None]):
        with pytest.raises(ValueError, match="expected stream_of_row of shape"):
            mech.step_group(group, X, y, bad_rows, source)
    # nothing changed: the group steps to what a fresh group releases
    _, batch = mech.step_group(group, X, y, rows, source)
    _, fresh = mech.step_group(mech.init_group(["a", "b", "c"]), X, y, rows, source)
    np.testing.assert_array_equal(batch.values, fresh.values)
    # an empty step of every stream is a step, not an error
    empty, none = mech.step_group(group, np.zeros((0, DIM)), np.zeros(0), np.zeros(0), source)
    assert empty.t == 1 and len(none) == 3


def test_groups_refuse_mixed_steps_other_mechanisms_and_duplicate_streams():
    mech = build("l1-horizon-every3")
    a, b = mech.init_state("a"), mech.init_state("b")
    b1, _ = mech.step(b, (np.ones(DIM), 0.3), NoiseSource(KEY))
    assert_stack_refusals(mech, a, b1, mech.tree_q.init_state("a"))
    with pytest.raises(ValueError, match="step differs"):
        mech.stack([dataclasses.replace(b1, t=2)])
    other = PrivIncReg1(dim=DIM + 1, constraint="l1_ball", epsilon=8.0, delta=1e-5, horizon=32).init_group(["a"])
    with pytest.raises(ValueError, match="state does not match"):
        mech.step_group(other, np.zeros((0, DIM)), np.zeros(0), np.zeros(0, dtype=int), NoiseSource(KEY))


def test_per_stream_sums_of_one_group_equal_the_trees_block_sums():
    """A group of one sums its records (``clip_and_sum_groups``: one bincount over (group, coordinate)
    cells) to the sums of the tree's ``clip_and_sum`` of the block and, to rounding, of the same rows
    summed among other streams' rows; rows above the tree's clip bound are clipped and counted either way."""
    tree = build("l2-hybrid-every1").tree_Q
    rng = np.random.default_rng(3)
    C = rng.normal(0.0, 0.1, (7, tree.dim))  # norms about 0.3 (dim 9), below the clip bound 1
    C[2] *= 10.0  # above the clip bound
    sums, counts, clipped = tree.clip_and_sum_groups(C, np.zeros(7, dtype=np.intp), 1)
    block = tree.clip_and_sum(C)
    np.testing.assert_array_equal(sums[0], block.vector)
    assert (counts.tolist(), clipped.tolist()) == ([7], [1]) == ([block.count], [block.clipped])
    mixed = np.insert(C, [1, 5], rng.normal(size=(2, tree.dim)), axis=0)  # stream 1's rows among others'
    many, many_counts, _ = tree.clip_and_sum_groups(mixed, np.insert(np.ones(7, dtype=np.intp), [1, 5], [0, 2]), 3)
    np.testing.assert_allclose(many[1], sums[0], rtol=1e-12, atol=1e-12)
    assert many_counts.tolist() == [1, 7, 1]
    empty, empty_counts, _ = tree.clip_and_sum_groups(np.zeros((0, tree.dim)), np.zeros(0, dtype=np.intp), 1)
    assert empty.shape == (1, tree.dim) and not empty.any() and empty_counts.tolist() == [0]
