"""ParseEvents on EventBatches (unbounded path): each (stream, step) block keeps exactly its rows."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams, EventBatch
from beam_dp.beam.shell.parse import ParseEvents
from beam_dp.core import StepClock
from beam_dp.steps.batch import rows_by_group

CLOCK = StepClock(start=1000.0, period=10.0, end=1000.0 + 10 * 37)


@pytest.mark.parametrize("seed", range(5))
def test_rows_by_group_equals_one_mask_per_group(seed):
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(1, 60))
    groups = rng.integers(0, n_groups, int(rng.integers(1, 2000)))
    n_groups = int(groups.max()) + 1  # np.unique's inverse: every label up to the largest is used or not
    members = rows_by_group(groups, n_groups)
    assert len(members) == n_groups
    for g in range(n_groups):
        assert np.array_equal(members[g], np.flatnonzero(groups == g))


@pytest.mark.parametrize("seed", range(3))
def test_unbounded_batch_blocks_hold_their_rows_in_order(seed):
    """The old path (one ``np.flatnonzero`` per group) is the reference: every block's original
    EventBatch is the ok rows of its (stream, step) in input order, and its sum is theirs, clipped."""
    rng = np.random.default_rng(seed)
    n, dim = int(rng.integers(50, 3000)), 3
    ids = rng.choice([f"s{i}" for i in range(int(rng.integers(1, 40)))], size=n).astype(object)
    ts = CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start)
    values = rng.normal(0, 1.5, (n, dim))
    ts[rng.random(n) < 0.05] = 10.0  # before the start: dead-lettered, not in any block
    params = ContinualSumParams(dim=dim, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    parse = ParseEvents(params, pre_aggregate=False)
    parse.setup()
    out = [o for o in parse.process(EventBatch(ids, ts, values)) if isinstance(o, tuple)]
    ok = ts >= CLOCK.start
    steps = CLOCK.step_of(ts)
    seen = set()
    for stream, (step, block, original) in out:
        rows = np.flatnonzero(ok & (ids == stream) & (steps == step))
        assert np.array_equal(original.stream_ids, ids[rows])
        assert np.array_equal(original.values, values[rows])
        np.testing.assert_allclose(original.timestamps, ts[rows], rtol=0, atol=1e-6)  # microsecond rounding
        expected = parse._mechanism.clip_and_sum_groups(values[rows], np.zeros(len(rows), np.int64), 1)[0][0]
        np.testing.assert_allclose(block.vector, expected, rtol=1e-12, atol=1e-12)  # summation order may differ
        assert block.count == len(rows)
        seen.add((stream, step))
    assert seen == set(zip(ids[ok].tolist(), steps[ok].tolist()))


@pytest.mark.parametrize("groups", [None, 3])
def test_arrow_ids_parse_as_the_same_ids_as_objects(groups):
    """A file reader's ``EventBatch`` keeps its ids as one Arrow string array; parsing it gives the same
    dead letters (reason, stream, row) and the same blocks as the same ids as ``str`` objects."""
    import pyarrow as pa
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue

    rng = np.random.default_rng(9)
    n, dim = 1500, 3
    ids = rng.choice([f"s{i}" for i in range(30)] + [""], size=n).astype(object)  # "": a bad stream id
    ts = CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start)
    ts[rng.random(n) < 0.03] = 10.0  # before the start
    values = rng.normal(0, 1.5, (n, dim))
    values[rng.random(n) < 0.02, 1] = np.nan
    params = ContinualSumParams(dim=dim, epsilon=1.0, clip_bound=2.0, clock=CLOCK, stream_groups=groups)

    def parsed(stream_ids):
        parse = ParseEvents(params, pre_aggregate=groups is not None)
        parse.setup()
        parse.start_bundle()
        out = list(parse.process(EventBatch(stream_ids, ts, values), GlobalWindow()))
        out += list(parse.finish_bundle() or ())
        letters = [(o.value.reason, o.value.stream, o.value.element) for o in out if hasattr(o, "tag")]
        blocks = {}
        for o in out:
            if not hasattr(o, "tag"):
                key, value = o.value if isinstance(o, WindowedValue) else o
                blocks[str(key)] = value[1] if isinstance(value, tuple) else value
        return letters, blocks

    (want_letters, want), (got_letters, got) = parsed(ids), parsed(pa.array(ids.tolist(), type=pa.string()))
    assert repr(got_letters) == repr(want_letters) and {r for r, _, _ in want_letters} == {  # repr: NaN values
        "bad_stream_id", "before_start", "non_finite"}
    assert set(got) == set(want) and want
    for key, block in want.items():
        np.testing.assert_allclose(got[key].sums if groups else got[key].vector,
                                   block.sums if groups else block.vector, rtol=1e-12, atol=1e-12)
