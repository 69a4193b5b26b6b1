"""The lifted combiner ``MergeClippedSums`` (issue 26.1): the sums of the blocks of a key and step, held in a
dense accumulator whose size follows the cells, not the blocks."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from beam_dp.beam.shell.combine import MergeClippedSums
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock

D = 3


def _block(rng, names) -> GroupBlock:
    names = tuple(sorted(set(names)))
    n = len(names)
    return GroupBlock(names, rng.normal(size=(n, D)), rng.integers(1, 5, n), rng.integers(0, 2, n))


def _bundles(fn, blocks, per_bundle):
    """Beam's lifted combine: each bundle adds its blocks to a fresh accumulator and compacts it; the
    shuffle carries them (pickled) to merge_accumulators and extract_output."""
    accs = []
    for i in range(0, len(blocks), per_bundle):
        acc = fn.create_accumulator()
        for block in blocks[i:i + per_bundle]:
            acc = fn.add_input(acc, block)
        accs.append(pickle.loads(pickle.dumps(fn.compact(acc))))
    return fn.extract_output(fn.merge_accumulators(accs))


@pytest.mark.parametrize("per_bundle", [1, 7, 1000])
def test_group_blocks_sum_like_combine(per_bundle):
    rng = np.random.default_rng(3)
    streams = [f"s{i:03d}" for i in range(40)]
    blocks = [_block(rng, rng.choice(streams, rng.integers(1, 12))) for _ in range(150)]
    blocks.append(GroupBlock.declaring(["zz-declared", streams[0]], D))  # a zero-count block declares streams
    fn = pickle.loads(pickle.dumps(MergeClippedSums()))
    got, want = _bundles(fn, blocks, per_bundle), GroupBlock.combine(blocks)
    assert got.streams == want.streams and "zz-declared" in got.streams  # sorted by name, declared kept
    # counts are integers: exact; sums of <= 150 O(1) floats in another order: within 1e-12 relative
    np.testing.assert_array_equal(got.counts, want.counts)
    np.testing.assert_array_equal(got.clipped, want.clipped)
    np.testing.assert_allclose(got.sums, want.sums, rtol=1e-12, atol=1e-12)


def test_the_accumulator_follows_the_cells_not_the_blocks():
    rng = np.random.default_rng(4)
    streams = [f"s{i:02d}" for i in range(50)]
    fn = MergeClippedSums()
    steps = [fn.create_accumulator() for _ in range(3)]  # three steps of one group: the first, then two interleaved
    for rounds, live in ((100, [0]), (400, [1, 2])):
        for _ in range(rounds):
            for i in live:
                steps[i] = fn.add_input(steps[i], _block(rng, rng.choice(streams, 8)))
    for acc in steps:
        # 50 streams: one row each (dense once it held 25 of the group's streams: one row per stream known)
        assert len(acc.cells) == 50 and (acc.cells[:, D] > 0).all()
    assert len({id(acc.rows) for acc in steps}) == 1  # the steps of a group share one row map


def test_a_step_holds_only_the_rows_it_was_given():
    """A group's steps share the row map, but each step's accumulator holds only its own streams: a step that
    sees 3 of a group's 2,000 streams costs 16 rows, not 2,000."""
    rng = np.random.default_rng(7)
    fn = MergeClippedSums()
    wide = fn.add_input(fn.create_accumulator(), _block(rng, [f"s{i:04d}" for i in range(2000)]))
    lone = _block(rng, ["s0007", "s1234"])
    assert fn.add_input(fn.create_accumulator(), lone) is lone  # a lone block stays as it is
    wide = fn.add_input(wide, _block(rng, ["s0001"]))  # a second block: live, on the group's row map
    narrow = fn.add_input(lone, _block(rng, ["s1234", "zz-new"]))
    assert narrow.rows is wide.rows and len(wide.rows.names) == 2001
    assert narrow.size == 3 and len(narrow.cells) == 16 and narrow.nbytes < 2001 * 4 + 16 * (D + 2 + 1) * 8 + 1
    out = fn.compact(narrow)
    assert out.streams == ("s0007", "s1234", "zz-new") and out.sums.shape == (3, D)


def test_stream_keys_merge_clipped_sums():
    fn = MergeClippedSums()
    parts = [ClippedSum(np.full(D, float(i)), 2, i % 2) for i in range(10)]
    acc = fn.create_accumulator()
    for part in parts[:6]:
        acc = fn.add_input(acc, part)
    other = fn.add_input(fn.create_accumulator(), parts[6])
    for part in parts[7:]:
        other = fn.add_input(other, part)
    out = fn.extract_output(fn.merge_accumulators([acc, None, other]))
    np.testing.assert_allclose(out.vector, np.full(D, 45.0))  # sums of small integers: exact in floats
    assert (out.count, out.clipped) == (20, 5)
    assert fn.extract_output(fn.create_accumulator()) is None


def test_compacting_frees_the_live_accumulator():
    """Beam outputs all the live accumulators of a bundle at its end and drops them only after the last: each one
    frees its arrays as it is compacted, so the bundle's accumulators and their output do not coexist."""
    rng = np.random.default_rng(5)
    streams = [f"s{i:02d}" for i in range(30)]
    fn = MergeClippedSums()
    acc = fn.create_accumulator()
    blocks = [_block(rng, rng.choice(streams, 6)) for _ in range(20)]
    for block in blocks:
        acc = fn.add_input(acc, block)
    out = fn.compact(acc)
    want = GroupBlock.combine(blocks)
    assert out.streams == want.streams
    np.testing.assert_allclose(out.sums, want.sums, rtol=1e-12, atol=1e-12)  # 20 O(1) floats summed in another order
    assert acc.cells is None and acc.nbytes == 0  # freed
    with pytest.raises(RuntimeError, match="after it was compacted"):
        fn.add_input(acc, blocks[0])


@pytest.mark.parametrize("names", [("a", "b\x00c", "d"), ("only",), ()])
def test_group_blocks_pickle_names_that_cannot_be_joined_as_a_tuple(names):
    block = GroupBlock.declaring(names, D)
    back = pickle.loads(pickle.dumps(block))
    assert back.streams == block.streams and back.sums.shape == (len(names), D)


def test_unpickled_group_blocks_share_one_string_per_stream():
    """The shuffle pickles each (group, step) block; read back, the blocks of a group share their stream names'
    string objects (one per stream, not one per cell: ~56 bytes a cell less)."""
    rng = np.random.default_rng(6)
    names = [f"stream-{i:04d}" for i in range(200)]
    a, b = (pickle.loads(pickle.dumps(_block(rng, names))) for _ in range(2))
    assert a.streams == tuple(sorted(names)) and all(x is y for x, y in zip(a.streams, b.streams))
    assert a.streams is b.streams  # the same list of streams: one tuple
    other = pickle.loads(pickle.dumps(_block(rng, names[:150])))
    assert other.streams == tuple(sorted(names[:150])) and other.streams[0] is a.streams[0]
    original = _block(rng, names)
    back = pickle.loads(pickle.dumps(original))
    np.testing.assert_array_equal(back.sums, original.sums)  # the same bytes, pickled and read back
    np.testing.assert_array_equal(back.counts, original.counts)

