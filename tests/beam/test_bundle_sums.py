"""A batch replay keyed by stream groups sums each bundle in the parse stage (``BundleGroupSums``): the
blocks it emits at the end of the bundle are the per-(group, step) sums of what the stream path emits."""

from __future__ import annotations

import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.beam.params import ContinualSumParams
from beam_dp.beam.parse import ParseEvents
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
    assert letters and all(not isinstance(out, tuple) for out in letters)  # only dead letters during the bundle
    assert all(isinstance(out, WindowedValue) and out.windows == (GlobalWindow(),) for out in emitted)
    got = {key_step: block for (key_step, block) in (out.value for out in emitted)}
    want = _reference(elements)
    assert list(got) == sorted(got) and set(got) == set(want)  # one block per (group, step), in order
    for cell, block in got.items():
        assert block.streams == want[cell].streams  # sorted by name
        np.testing.assert_array_equal(block.counts, want[cell].counts)
        np.testing.assert_array_equal(block.clipped, want[cell].clipped)
        # <= 5 batch sums of O(1) clipped floats, added in another order: within 1e-12 relative
        np.testing.assert_allclose(block.sums, want[cell].sums, rtol=1e-12, atol=1e-12)


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
