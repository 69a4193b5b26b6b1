"""A batch replay keyed by stream groups sums each bundle in the parse stage (``BundleGroupSums``): the
blocks it emits at the end of the bundle are the per-(group, step) sums of what the stream path emits."""

from __future__ import annotations

import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.beam.shell import combine
from beam_dp.beam.shell.parse import ParseEvents
from beam_dp.beam.sums import ContinualSumParams
from beam_dp.core.clock import StepClock
from beam_dp.mechanisms.stream_groups import GroupBlock
from beam_dp.steps.events import EventBatch

CLOCK = StepClock(100.0, 10.0, end=400.0)
DIM = 3


def _params() -> ContinualSumParams:
    return ContinualSumParams(dim=DIM, epsilon=1.0, clip_bound=2.0, clock=CLOCK, stream_groups=3)


def _batches(seed: int, count: int) -> list[EventBatch]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        n = int(rng.integers(100, 2000))
        ids = rng.choice([f"s{i:02d}" for i in range(25)], size=n).astype(object)
        ts = CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start)
        ts[rng.random(n) < 0.03] = 10.0  # before the start: dead-lettered
        batches.append(EventBatch(ids, ts, rng.normal(0, 1.5, (n, DIM))))
    return batches


def _reference(elements: list) -> dict:
    """The stream path's per-row blocks of each (group key, step), merged by ``GroupBlock.combine``."""
    parse = ParseEvents(_params(), pre_aggregate=False)
    parse.setup()
    parse.start_bundle()
    blocks: dict = {}
    for element in elements:
        for out in parse.process(element):
            if isinstance(out, tuple):
                key, (step, block, _) = out
                blocks.setdefault((key, step), []).append(block)
    return {cell: GroupBlock.combine(parts) for cell, parts in blocks.items()}


def _assert_sums_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for cell, block in got.items():
        assert block.streams == want[cell].streams  # sorted by name
        np.testing.assert_array_equal(block.counts, want[cell].counts)
        np.testing.assert_array_equal(block.clipped, want[cell].clipped)
        # <= 5 batch sums of O(1) clipped floats, added in another order: within 1e-12 relative
        np.testing.assert_allclose(block.sums, want[cell].sums, rtol=1e-12, atol=1e-12)


def _bundle(elements: list, window=GlobalWindow()) -> tuple[list, list]:
    parse = ParseEvents(_params(), pre_aggregate=True)
    parse.setup()
    parse.start_bundle()
    letters = [out for element in elements for out in parse.process(element, window)]
    return letters, list(parse.finish_bundle())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_bundles_blocks_are_the_streams_blocks_summed(seed):
    batches = _batches(seed, 5)
    rows = [("s03", 150.0, [0.5, -0.25, 4.0]), ("s77", 390.0, [1.0, 1.0, 1.0])]  # one-row elements too
    elements = batches[:2] + rows + batches[2:]
    letters, emitted = _bundle(elements)
    assert letters and all(not isinstance(out, (tuple, WindowedValue)) for out in letters)  # only dead letters
    assert all(isinstance(out, WindowedValue) and out.windows == (GlobalWindow(),) for out in emitted)
    got = {key_step: block for (key_step, block) in (out.value for out in emitted)}
    want = _reference(elements)
    assert list(got) == sorted(got)  # one block per (group, step), in order
    _assert_sums_equal(got, want)


def test_a_bundle_past_its_budget_sends_its_sums_early(monkeypatch):
    """Past the budget a bundle's sums leave as blocks during the bundle (memory bounded whatever the input's
    cells); a (group, step) may leave several times, and their sum is the same sums."""
    monkeypatch.setattr(combine, "BUNDLE_BUDGET_BYTES", 20_000)
    elements = _batches(3, 5) + [("s03", 150.0, [0.5, -0.25, 4.0])] + _batches(4, 3)
    outputs, emitted = _bundle(elements)
    early = [out for out in outputs if isinstance(out, WindowedValue)]
    assert early  # taken during the bundle (each batch here passes 20 kB)
    parts: dict = {}
    for out in early + emitted:
        key_step, block = out.value
        parts.setdefault(key_step, []).append(block)
    assert max(map(len, parts.values())) > 1
    _assert_sums_equal({cell: GroupBlock.combine(blocks) for cell, blocks in parts.items()}, _reference(elements))


def test_windows_keep_their_own_sums():
    batch = _batches(5, 1)[0]
    parse = ParseEvents(_params(), pre_aggregate=True)
    parse.setup()
    parse.start_bundle()
    first, second = IntervalWindow(0, 10), IntervalWindow(10, 20)
    for window in (first, second, first):
        list(parse.process(batch, window))
    emitted = list(parse.finish_bundle())
    by_window = {}
    for out in emitted:
        (cell, block), = [out.value]
        by_window.setdefault(out.windows[0], {})[cell] = block
        assert out.timestamp == out.windows[0].max_timestamp()
    assert set(by_window) == {first, second} and set(by_window[first]) == set(by_window[second])
    for cell, block in by_window[first].items():
        np.testing.assert_array_equal(block.counts, 2 * by_window[second][cell].counts)  # the batch twice
    parse.start_bundle()
    assert list(parse.finish_bundle() or ()) == []  # a new bundle starts empty


def test_the_release_stage_adds_a_steps_blocks_as_they_come():
    """The release stage's buffer (``StepSumsBuffer``): a step's lone block is kept as it is; several blocks of
    a step are summed on the group's row map as they come, the same sums as ``GroupBlock.combine``; other
    items are kept as they are, and a block added after a read adds to its step's sum again."""
    from beam_dp.beam.shell.batch_release import StepSumsBuffer
    from beam_dp.steps.driver import CARRIED

    _, emitted = _bundle(_batches(6, 3))
    parts = [block for _, block in (out.value for out in emitted)][:6]
    buffer = StepSumsBuffer()
    buffer.add((1, parts[0]))
    buffer.add((CARRIED, "carried"))
    for part in parts[:6]:
        buffer.add((2, part))
    buffer.add((3, parts[1]))
    entries = buffer.read()
    assert [step for step, _ in entries] == [1, CARRIED, 2, 3]  # one entry per step
    assert entries[0][1] is parts[0] and entries[1][1] == "carried" and entries[3][1] is parts[1]
    _assert_sums_equal({2: entries[2][1]}, {2: GroupBlock.combine(parts)})
    buffer.add((3, parts[2]))
    _assert_sums_equal({3: buffer.read()[3][1]}, {3: GroupBlock.combine(parts[1:3])})
    buffer.clear()
    assert buffer.read() == []


@pytest.mark.parametrize("budget", [None, 20_000])  # dense arrays; sparse accumulators
def test_the_budget_counts_every_live_accumulators_arrays(monkeypatch, budget):
    if budget is not None:
        monkeypatch.setattr(combine, "BUNDLE_BUDGET_BYTES", budget)
    parse = ParseEvents(_params(), pre_aggregate=True)
    parse.setup()
    parse.start_bundle()
    for element in _batches(7, 4) + [("s03", 150.0, [0.5, -0.25, 4.0]), ("zz-new", 150.0, [1.0, 0.0, 0.0])]:
        list(parse.process(element, GlobalWindow()))
        live = parse._bundle._acc.values()
        dense = parse._bundle._dense.values()
        assert bool(dense) == (budget is None)
        assert parse._bundle._bytes == sum(acc.cells.nbytes for acc in live) + sum(
            0 if a is None else a.nbytes for acc in live for a in (acc._local, acc._held, acc._seen)) + sum(
            sums.cells.nbytes for sums in dense)


def test_events_in_time_order_fill_a_dense_array_again_after_each_take(monkeypatch):
    """A dense (step, stream) array grows with the steps of time-ordered input until the budget; then the
    bundle's sums leave and a new array starts at the later steps. Every event is counted once."""
    rng = np.random.default_rng(8)
    ids = rng.choice([f"s{i:02d}" for i in range(25)], size=6000).astype(object)
    ts = np.sort(CLOCK.start + rng.random(6000) * (CLOCK.end - CLOCK.start))
    values = rng.normal(0, 1.5, (6000, DIM))
    batches = [EventBatch(ids[i:i + 500], ts[i:i + 500], values[i:i + 500]) for i in range(0, 6000, 500)]
    monkeypatch.setattr(combine, "BUNDLE_BUDGET_BYTES", 25 * 12 * (DIM + 2) * 8)  # 12 of the 30 steps
    parse = ParseEvents(_params(), pre_aggregate=True)
    parse.setup()
    parse.start_bundle()
    outputs, history = [], []
    for batch in batches:
        out = list(parse.process(batch, GlobalWindow()))
        outputs += out
        history.append((any(isinstance(o, WindowedValue) for o in out), bool(parse._bundle._dense)))
        assert parse._bundle._bytes <= combine.BUNDLE_BUDGET_BYTES
    emitted = list(parse.finish_bundle())
    early = [out for out in outputs if isinstance(out, WindowedValue)]
    first_take = next(i for i, (took, _) in enumerate(history) if took)  # taken during the bundle
    assert all(dense for _, dense in history[:first_take]) and any(dense for _, dense in history[first_take + 1:])
    parts: dict = {}
    for out in early + emitted:
        key_step, block = out.value
        parts.setdefault(key_step, []).append(block)
    _assert_sums_equal({cell: GroupBlock.combine(blocks) for cell, blocks in parts.items()}, _reference(batches))
