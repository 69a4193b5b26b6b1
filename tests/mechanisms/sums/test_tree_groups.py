"""Group stepping of the trees and the window tree (``GroupSteppedSum``, issue 16).

A group of streams stepped in one array operation per node releases what each stream stepped alone
releases (the same noise cells; values compared to float tolerance, since the group's array sums may
round differently), with the same spend and meta; states move between the per-stream and the group
form without changing any release; and a state encoded by the per-stream implementation before the
port (commit 4b26ef6) decodes and continues with the releases that implementation made.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import ClippedSum, GroupSteppedSum, NodeNoise
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.testing import ZeroNoise
from tests.release_checks import assert_release_matches

KEY = bytes(range(32))
# > 4 cells: the array Philox path, not numpy's per-cell one; not in sorted order
STREAMS = [f"user-{i}" for i in (3, 1, 4, 15, 9, 2, 6, 5, 35)]
QUIET = 4  # this stream never has data


def build(kind: str, law: str, dim: int = 3):
    if law == "discrete_laplace":
        kw: dict = dict(dim=1, epsilon=1.0, clip_bound=2.0, noise=law)
    elif law == "gaussian":
        kw = dict(dim=dim, epsilon=1.0, delta=1e-6, clip_bound=1.5, noise=law, calibration="analytic")
    else:
        kw = dict(dim=dim, epsilon=1.0, clip_bound=1.5, noise=law)
    if kind == "binary":
        return BinaryTreeSum(horizon=64, **kw)
    if kind == "hybrid":
        return HybridTreeSum(**kw)
    if kind == "doubling":
        return DoublingTreeSum(**kw)
    return WindowTreeSum(window={"window5": 5, "window1": 1}[kind], **kw)


CASES = [(kind, law) for kind in ("binary", "hybrid", "doubling") for law in ("gamma", "gaussian", "discrete_laplace")]
CASES += [(kind, law) for kind in ("window5", "window1") for law in ("gamma", "gaussian")]
IDS = [f"{kind}-{law}" for kind, law in CASES]


def _steps(mech, steps: int, seed: int = 3):
    """Per step: clipped sums ``(streams, d)``, counts and clipped counts; some (stream, step) cells and
    whole steps are empty, and stream ``QUIET`` never has data. Integers for discrete Laplace."""
    rng = np.random.default_rng(seed)
    for t in range(steps):
        n = rng.integers(0, 4, len(STREAMS)) * (t % 5 != 3)  # every fifth step empty for all streams
        n[QUIET] = 0
        if mech.noise_law == "discrete_laplace":
            rows = rng.integers(-2, 3, (int(n.sum()), 1)).astype(float)  # within R = 2: clipping keeps integers
        else:
            rows = rng.normal(0, 2.0, (int(n.sum()), mech.dim))
        yield mech.clip_and_sum_groups(rows, np.repeat(np.arange(len(STREAMS)), n), len(STREAMS))


def _assert_same_release(row, single):
    # the same noise cells and elementwise arithmetic; tolerance for the rounding of array sums
    assert_release_matches(row, single)


def _assert_same_states(mech, a, b):
    assert (a.stream, a.t) == (b.stream, b.t)
    for name in mech._array_fields():
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind,law", CASES, ids=IDS)
def test_group_step_equals_per_stream_steps(kind, law):
    mech = build(kind, law)
    assert isinstance(mech, GroupSteppedSum)
    source = NoiseSource(KEY)
    group, states = mech.init_group(STREAMS), [mech.init_state(s) for s in STREAMS]
    for t, (sums, counts, clipped) in enumerate(_steps(mech, 40), start=1):  # hybrid/doubling pass 32, windows close blocks
        group, batch = mech.step_group(group, sums, counts, source)
        assert batch.step == t and batch.streams == tuple(STREAMS) and batch.values.shape == (len(STREAMS), mech.dim)
        for i, row in enumerate(batch.rows()):
            block = ClippedSum(sums[i], int(counts[i]), int(clipped[i])) if counts[i] else None
            states[i], (single,) = mech.step(states[i], block, source)
            _assert_same_release(row, single)
    for state, back in zip(states, mech.unstack(group)):
        _assert_same_states(mech, state, back)
        _assert_same_states(mech, state, mech.decode_state(mech.encode_state(back)))


@pytest.mark.parametrize("kind", ["binary", "hybrid", "doubling", "window5"])
def test_zero_noise_group_releases_the_exact_prefix_sums(kind):
    mech = build(kind, "gamma", dim=2)
    group, total = mech.init_group(STREAMS), np.zeros((len(STREAMS), 2))
    for sums, counts, _ in _steps(mech, 20, seed=5):
        total += sums
        group, batch = mech.step_group(group, sums, counts, ZeroNoise())
        np.testing.assert_allclose(batch.values, total, rtol=1e-12, atol=1e-12)
    assert np.all(batch.values[QUIET] == 0.0)


MOVES = [("hybrid", "gaussian"), ("doubling", "gamma"), ("window5", "gamma"), ("window1", "gaussian")]


@pytest.mark.parametrize("kind,law", MOVES)
def test_states_move_between_per_stream_and_group_form(kind, law):
    """Per-stream states stacked mid-run, a group unstacked mid-run, and a group stepped twice from the
    same state (a retry) all continue with the releases of one uninterrupted per-stream run, and
    stepping one form never changes a state held in the other (the window tree reuses buffers)."""
    mech = build(kind, law, dim=2)
    source = NoiseSource(KEY)
    steps = list(_steps(mech, 30, seed=8))
    ref = {s: [] for s in STREAMS}
    for i, s in enumerate(STREAMS):
        state = mech.init_state(s)
        for sums, counts, clipped in steps:
            state, (r,) = mech.step(state, ClippedSum(sums[i], int(counts[i]), int(clipped[i])), source)
            ref[s].append(r)

    def run_group(group, lo, hi):
        for t in range(lo, hi):
            sums, counts, _ = steps[t]
            group, batch = mech.step_group(group, sums, counts, source)
            for row in batch.rows():
                _assert_same_release(row, ref[row.stream][t])
        return group

    states = [mech.init_state(s) for s in STREAMS]
    for t in range(11):  # mid-block for the window tree (B = 8), mid-tree for the others
        sums, counts, clipped = steps[t]
        states = [mech.step(st, ClippedSum(sums[i], int(counts[i]), int(clipped[i])), source)[0] for i, st in enumerate(states)]
    group = mech.stack(states)
    before = [mech.encode_state(st) for st in states]
    mid = run_group(group, 11, 17)
    assert [mech.encode_state(st) for st in states] == before
    unstacked = mech.unstack(mid)
    branch, _ = mech.step_group(mid, np.zeros((len(STREAMS), 2)), np.zeros(len(STREAMS)), source)  # other input
    held = [mech.encode_state(st) for st in unstacked + mech.unstack(branch)]
    run_group(mid, 17, 30)
    run_group(mid, 17, 30)  # a retry of the same group state
    assert [mech.encode_state(st) for st in unstacked + mech.unstack(branch)] == held
    for i, state in enumerate(unstacked):  # the unstacked states continue alone
        for t in range(17, 30):
            sums, counts, clipped = steps[t]
            state, (single,) = mech.step(state, ClippedSum(sums[i], int(counts[i]), int(clipped[i])), source)
            _assert_same_release(single, ref[STREAMS[i]][t])


def test_window_tree_group_of_one_reuses_its_buffers():
    """Within a block the per-stream step writes the next rows of the buffers its state views (O(L_W·d)
    per step, no copy of the block), as before the port."""
    mech = build("window5", "gamma", dim=2)
    state = mech.init_state("s")
    buffers = []
    for _ in range(7):  # block 1: positions 1..7 (position 8 closes it)
        state, _ = mech.step(state, np.full(2, 0.1), NoiseSource(KEY))
        buffers.append(state.cur_prefix.base)
    assert buffers[0] is not None and buffers[0].shape == (1, mech.block + 1, 2)
    assert all(buf is buffers[0] for buf in buffers)  # one buffer for the whole block
    assert not state.prev_prefix.flags.writeable and not state.cur_prefix.flags.writeable


BAD_SUMS = [  # (sums, counts, error) for a group of two streams with d = 2 and R = 1.5
    ([[3.1, 0.0], [0.0, 0.0]], [2, 0], "count × clip_bound"),  # more than 2R: not made by clip_and_sum_groups
    ([[np.nan, 0.0], [0.0, 0.0]], [1, 0], "finite"),
    ([[np.inf, 0.0], [0.0, 0.0]], [1, 0], "finite"),
    (np.zeros((3, 2)), np.zeros(3), "expected sums"),
    (np.zeros((2, 3)), np.zeros(2), "expected sums"),
    (np.zeros(2), np.zeros(2), "expected sums"),
]


@pytest.mark.parametrize("kind", ["binary", "hybrid", "doubling", "window5"])
def test_group_step_refuses_bad_input(kind):
    mech = build(kind, "gamma", dim=2)
    group = mech.init_group(["a", "b"])
    for sums, counts, error in BAD_SUMS:
        with pytest.raises(ValueError, match=error):
            mech.step_group(group, np.asarray(sums, dtype=float), np.asarray(counts), NoiseSource(KEY))
    with pytest.raises(TypeError):  # another mechanism's state
        mech.stack([build("binary" if kind != "binary" else "hybrid", "gamma", dim=2).init_state("x")])
    other = build(kind, "gamma", dim=3).init_group(["a", "b"])  # a group of a mechanism with another dim
    with pytest.raises(ValueError, match="state"):
        mech.step_group(other, np.zeros((2, 2)), np.zeros(2), NoiseSource(KEY))
    group, batch = mech.step_group(group, np.zeros((2, 2)), np.zeros(2), NoiseSource(KEY))  # still usable
    assert group.t == batch.step == 1


def test_group_refuses_non_integer_sums_under_discrete_laplace_and_steps_past_the_horizon():
    mech = build("hybrid", "discrete_laplace")
    group = mech.init_group(["a", "b"])
    with pytest.raises(ValueError, match="integer"):
        mech.step_group(group, np.array([[0.5], [0.0]]), np.array([1, 0]), NoiseSource(KEY))
    binary = BinaryTreeSum(dim=1, epsilon=1.0, clip_bound=1.0, horizon=3)
    group = binary.init_group(["a", "b"])
    for _ in range(3):
        group, _ = binary.step_group(group, np.zeros((2, 1)), np.zeros(2), NoiseSource(KEY))
    with pytest.raises(ValueError, match="horizon"):
        binary.step_group(group, np.zeros((2, 1)), np.zeros(2), NoiseSource(KEY))


FIXTURE = json.loads((Path(__file__).parents[1] / "data" / "tree_states_4b26ef6.json").read_text())
OLD = {
    "binary-gamma": lambda: BinaryTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, horizon=64),
    "hybrid-gaussian": lambda: HybridTreeSum(dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian"),
    "doubling-discrete_laplace": lambda: DoublingTreeSum(dim=1, epsilon=1.0, clip_bound=2.0, noise="discrete_laplace"),
    "window-gamma": lambda: WindowTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, window=3),
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_a_state_encoded_before_the_port_decodes_and_continues(name):
    """``data/tree_states_4b26ef6.json``: the per-stream implementation at commit 4b26ef6 (before the
    group port) stepped stream "fixture" 6 steps under ``KEY``, encoded its state, and recorded the
    releases of the 10 steps after it (crossing the trees' powers of two and the window's block ends).
    The decoded state steps to the same releases and spend alone and in a group (float tolerance)."""
    mech, case = OLD[name](), FIXTURE[name]
    state = mech.decode_state(base64.b64decode(case["state_at_step_6"]))
    assert (state.stream, state.t) == ("fixture", 6)
    group = mech.stack([dataclasses.replace(state, stream="other"), state])
    for block, expected in zip(case["next_steps"], case["releases"]):
        rows = np.array(block, dtype=float).reshape(-1, mech.dim)
        state, (release,) = mech.step(state, rows, NoiseSource(KEY))
        sums, counts, _ = mech.clip_and_sum_groups(rows, np.ones(len(rows), dtype=np.int64), 2)
        group, batch = mech.step_group(group, sums, counts, NoiseSource(KEY))
        for value, spent in ((release.value, release), (batch.values[1], batch)):
            assert_release_matches({"value": value, "epsilon_spent": spent.epsilon_spent,
                                    "delta_spent": spent.delta_spent}, expected)


class _HalfGaussian(NoiseSource):
    """TEST ONLY: halves every Gaussian cell (a one-cell override, honoured cell by cell)."""

    def gaussian(self, stream, purpose, index, sigma, size):
        return 0.5 * super().gaussian(stream, purpose, index, sigma, size)


@pytest.mark.parametrize("law,scale", [("gamma", 2.0), ("gaussian", 1.5)])
def test_draw_nodes_equals_draw_group_node_by_node(law, scale):
    """The window tree draws all nodes completing at a step in one batch of cells; each cell is the
    one ``draw_group`` draws for that node, also for a noise source that overrides a one-cell sampler."""
    node = NodeNoise(law, scale)
    indices = [(3, 0, 8), (3, 1, 4), (3, 2, 2), (3, 3, 1)]
    for source in (NoiseSource(KEY), _HalfGaussian(KEY)):
        got = node.draw_nodes(source, STREAMS, "wtm", indices, 3)
        assert got.shape == (len(STREAMS), len(indices), 3)
        for j, index in enumerate(indices):
            # the same words per cell; tolerance for vectorised libm on other batch lengths
            np.testing.assert_allclose(got[:, j], node.draw_group(source, STREAMS, "wtm", index, 3), rtol=1e-12, atol=1e-12)
