"""Streams keyed by group (beam_dp.mechanisms.stream_groups, the driver's GroupPolicy): the public hash,
block merging, cohorts, the join rule, and releases equal to those of streams keyed alone."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.io import release_dicts
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, GroupedSum, group_key, group_of
from beam_dp.mechanisms.sums import BLTSum, KaryTreeSum
from beam_dp.steps.driver import DEAD_LETTER, RELEASE, ListBuffer, StepDriver
from beam_dp.steps.policies import BlockPolicy, GroupPolicy
from beam_dp.steps.schema import ReleaseColumns, release_table
from tests.conftest import TEST_KEY

DIM = 3
NOISE = NoiseSource(TEST_KEY).for_domain("test/stream-groups")
MECHANISMS = {
    "blt": lambda: BLTSum(horizon=32, dim=DIM, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian"),
    "kary": lambda: KaryTreeSum(horizon=32, dim=DIM, epsilon=1.0, clip_bound=1.0, noise="gamma"),
}


def _block(mechanism, rows: dict[str, np.ndarray]) -> GroupBlock:
    """A block of clipped sums, one per stream (each row clipped by the mechanism)."""
    names = sorted(rows)
    values = np.stack([rows[n] for n in names])
    sums, counts, clipped = mechanism.clip_and_sum_groups(values, np.arange(len(names)), len(names))
    return GroupBlock(tuple(names), sums, counts.astype(np.int64), clipped.astype(np.int64))


def test_group_of_is_a_stable_public_hash():
    # pinned: BLAKE2b of the UTF-8 name (personalisation beam_dp-group-1); a change moves streams
    assert [group_of(s, 1000) for s in ("a", "user-42", "ünï")] == [880, 641, 332]
    spread = np.bincount([group_of(f"user-{i}", 8) for i in range(8000)], minlength=8)
    # 8,000 names in 8 groups: each count is Binomial(8000, 1/8), sd 29.6; 6 sd either side
    assert np.all(np.abs(spread - 1000) < 6 * 29.6)
    assert group_key(7) == "stream-group-7"


def test_blocks_merge_by_stream():
    a = GroupBlock(("x", "y"), np.array([[1.0, 0, 0], [0, 1.0, 0]]), np.array([1, 1]), np.array([0, 1]))
    b = GroupBlock(("w", "y"), np.array([[0, 0, 2.0], [0, 3.0, 0]]), np.array([2, 3]), np.array([0, 0]))
    merged = a.merge(b)
    assert merged.streams == ("w", "x", "y")
    np.testing.assert_array_equal(merged.sums, [[0, 0, 2.0], [1.0, 0, 0], [0, 4.0, 0]])
    assert merged.counts.tolist() == [2, 1, 4] and merged.clipped.tolist() == [0, 0, 1]
    assert merged.count == 7 and GroupBlock.declaring(["q", "p", "q"], DIM).streams == ("p", "q")


def test_adding_one_stream_row_equals_the_general_merge():
    """The one-row path (an engine adding one contribution) against sums kept per stream in a dict:
    a stream already there, and new streams before, between and after the held ones (names compared
    by code point, as the general path's sort). Float tolerance 1e-12: each sum adds the same two
    numbers of size ~1 in both (equal in practice; the sign of a zero sum may differ)."""
    rng = np.random.default_rng(8)
    held = GroupBlock(("b", "d", "é"), rng.normal(size=(3, DIM)), np.array([2, 1, 4]), np.array([0, 1, 0]))
    for stream in ("d", "a", "c", "z", "éa", "B"):
        row = GroupBlock((stream,), rng.normal(size=(1, DIM)), np.array([3]), np.array([1]))
        want = {s: (v, c, k) for s, v, c, k in zip(held.streams, held.sums, held.counts, held.clipped)}
        v, c, k = want.get(stream, (np.zeros(DIM), 0, 0))
        want[stream] = (v + row.sums[0], c + 3, k + 1)
        merged = GroupBlock.combine([held, row])
        assert merged.streams == tuple(sorted(want))
        np.testing.assert_allclose(merged.sums, [want[s][0] for s in merged.streams], rtol=0, atol=1e-12)
        assert merged.counts.tolist() == [want[s][1] for s in merged.streams]
        assert merged.clipped.tolist() == [want[s][2] for s in merged.streams]
        assert merged.counts.dtype == np.int64 and merged.sums.shape == (len(want), DIM)
    assert held.counts.tolist() == [2, 1, 4]  # the held block is not changed in place


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_cohorts_release_what_streams_keyed_alone_release(name):
    """s0..s2 from group step 1, s3 from group step 3 (its own steps 1..), through an encode/decode."""
    mechanism = MECHANISMS[name]()
    grouped = GroupedSum(mechanism)
    rng = np.random.default_rng(4)
    data = {t: {s: rng.normal(size=DIM) for s in ("s0", "s1", "s2", "s3") if (t >= 3 or s != "s3") and rng.random() < 0.7}
            for t in range(1, 9)}
    state = grouped.join(grouped.init_state("g"), ["s0", "s1", "s2"])
    got: dict[tuple[str, int], ReleaseBatch] = {}
    for t in range(1, 9):
        if t == 3:
            state = grouped.join(state, ["s3"])
        block = _block(mechanism, data[t]) if data[t] else None
        state, batches = grouped.step(state, block, NOISE)
        state = grouped.decode_state(grouped.encode_state(state))
        for batch in batches:
            assert batch.step == t
            for i, stream in enumerate(batch.streams):
                got[(stream, t)] = (batch.values[i], batch.epsilon_spent)
    assert [len(c["streams"]) for c in state.cohorts] == [3, 1]
    for stream in ("s0", "s1", "s2", "s3"):
        alone, first = mechanism.init_state(stream), 3 if stream == "s3" else 1
        for t in range(first, 9):
            vector = data[t].get(stream)
            block = ClippedSum(*[x[0] for x in mechanism.clip_and_sum_groups(vector[None], np.zeros(1, int), 1)]) \
                if vector is not None else None
            alone, (release,) = mechanism.step(alone, block, NOISE)
            assert release.step == t - first + 1
            value, eps = got[(stream, t)]
            np.testing.assert_allclose(value, release.value, rtol=1e-12, atol=1e-12)  # summation order only
            assert eps == pytest.approx(release.epsilon_spent, rel=1e-12)


def _driver(policy, clock=StepClock(0.0, 10.0)):
    return StepDriver(policy, clock=clock, last_step=clock.last_step)


def test_a_stream_joins_at_the_first_step_closed_after_its_item_arrived():
    mechanism = MECHANISMS["blt"]()
    driver = _driver(GroupPolicy(GroupedSum(mechanism), NOISE))
    state, buffer = driver.open("stream-group-0"), ListBuffer()
    driver.add(state, buffer, 3, _block(mechanism, {"a": np.ones(DIM)}))  # arrives while step 1 is open
    out = driver.advance(state, buffer, 20_000_000)  # closes steps 1 and 2
    assert [(o.value.batch.streams, o.value.batch.step) for o in out] == [(("a",), 1), (("a",), 2)]
    driver.carry(state, buffer, GroupBlock.declaring(["d"], DIM))  # declared while step 3 is open
    driver.add(state, buffer, 4, _block(mechanism, {"b": np.ones(DIM)}))
    out = driver.advance(state, buffer, 40_000_000)  # closes steps 3 and 4
    released = sorted((s, o.value.batch.step) for o in out for s in o.value.batch.streams)
    assert released == [("a", 3), ("a", 4), ("b", 3), ("b", 4), ("d", 3), ("d", 4)]
    assert all(isinstance(o.value, ReleaseColumns) for o in out)
    # a late block is dead-lettered whole, under its stream when it has one
    (letter,) = driver.add(state, buffer, 2, _block(mechanism, {"b": np.ones(DIM)}), "raw", "b")
    assert letter.tag == DEAD_LETTER and letter.value.stream == "b" and letter.value.element == "raw"


def test_group_and_stream_keyed_drivers_release_the_same_values():
    mechanism = MECHANISMS["kary"]()
    clock = StepClock(0.0, 10.0, end=60.0)
    rng = np.random.default_rng(9)
    items = [(int(rng.integers(1, 7)), f"s{rng.integers(0, 5)}", rng.normal(size=DIM)) for _ in range(40)]
    grouped = _driver(GroupPolicy(GroupedSum(mechanism), NOISE), clock)
    gstate, gbuffer = grouped.open("stream-group-0"), ListBuffer()
    alone = _driver(BlockPolicy(mechanism, NOISE), clock)
    states = {}
    for step, stream, value in items:
        grouped.add(gstate, gbuffer, step, _block(mechanism, {stream: value}))
        state, buffer = states.setdefault(stream, (alone.open(stream), ListBuffer()))
        block = ClippedSum(*[x[0] for x in mechanism.clip_and_sum_groups(value[None], np.zeros(1, int), 1)])
        alone.add(state, buffer, step, block)
    by_group = {(s, o.value.batch.step): o.value.batch.values[i]
                for o in grouped.finish(gstate, gbuffer) if o.tag == RELEASE for i, s in enumerate(o.value.batch.streams)}
    by_stream = {(o.value.stream, o.value.step): o.value.value
                 for stream, (state, buffer) in states.items() for o in alone.finish(state, buffer) if o.tag == RELEASE}
    assert sorted(by_group) == sorted(by_stream) and len(by_group) == 5 * 6
    for key, value in by_stream.items():
        np.testing.assert_allclose(by_group[key], value, rtol=1e-12, atol=1e-12)


def test_release_table_holds_the_rows_of_its_parts():
    mechanism = MECHANISMS["blt"]()
    grouped = GroupedSum(mechanism)
    state = grouped.join(grouped.init_state("g"), ["a", "b"])
    parts = []
    for t in (1, 2):
        state, (batch,) = grouped.step(state, _block(mechanism, {"a": np.ones(DIM)}), NOISE)
        parts.append(ReleaseColumns(batch, mechanism.guarantee, t * 10_000_000, (t + 1) * 10_000_000))
    table = release_table(parts)
    rows = [row._asdict() for part in parts for row in part.rows()]
    assert release_dicts(table) == rows  # the same doubles, moved without arithmetic


@pytest.mark.parametrize("law, index", [("gaussian", (5,)), ("k_norm", (7,)), ("laplace", (0, 2, 3))])
def test_noise_drawn_ahead_equals_noise_drawn_step_by_step(law, index):
    from beam_dp.core.noise_ahead import NoiseAhead

    streams = ("a", "b", "c")
    ahead = NoiseAhead(NOISE, 8)
    for step in range(index[-1], index[-1] + 12):  # crosses one refill of the 8-step window
        cell = index[:-1] + (step,)
        # same cells, drawn in a larger array: equal up to the last bit of vectorised log/sin/cos
        np.testing.assert_allclose(ahead.draw_cells(law, streams, "p", cell, 2.0, 4),
                                   NOISE.draw_cells(law, streams, "p", cell, 2.0, 4), rtol=1e-13, atol=1e-13)
    assert ahead.for_domain("x").draw_cells("gaussian", ("a",), "p", (1,), 1.0, 2).shape == (1, 2)
