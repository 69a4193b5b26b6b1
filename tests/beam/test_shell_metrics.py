"""The Beam shell's pre-aggregation and metrics, called directly: buffered items rise with items and fall when their step
closes (also at the end of input), every firing counts, dead letters count per reason. Counts are
exact integers."""

from __future__ import annotations

import numpy as np
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.steps.events import Reason
from beam_dp.steps.params import NoiseKey
from tests.beam.fake_state import Bag, Cell, Timer, metrics

S = 1_000_000
PARAMS = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=StepClock(start=0.0, period=10.0),
                            noise_key=NoiseKey(domain="metrics"))
NAMESPACE = "beam_dp/" + PARAMS.build_mechanism().name


def test_buffered_items_firings_and_dead_letters_per_reason():
    dofn = ContinualReleaseDoFn(PARAMS, per_step_timers=True)
    dofn.setup()
    cell, bag, close, end = Cell(), Bag(), Timer(), Timer()
    block = dofn._driver.policy.mechanism.clip_and_sum(np.array([0.5]))
    with metrics() as counter:
        for step in (3, 3, 4, 9):
            list(dofn.process(("a", (step, block, "e")), cell, bag, close, end, bag.sums))
        # one pre-aggregated entry per open step (3, 4, 9); the key opened at its lowest step, 3
        assert counter(NAMESPACE, "buffered_items") == 3 and close.set_at["1"] == 30 * S
        list(dofn.on_close(Timestamp(micros=40 * S), "4", "a", cell, bag, close, bag.sums))  # closes steps 3, 4
        assert counter(NAMESPACE, "buffered_items") == 1 and counter(NAMESPACE, "releases") == 2
        list(dofn.process(("a", (2, block, "late")), cell, bag, close, end, bag.sums))
        assert counter(NAMESPACE, f"dead_letters/{Reason.LATE}") == 1 and counter(NAMESPACE, "dead_letters") == 1
        out = list(dofn.on_end("a", cell, bag, bag.sums))  # end of input: step 9 never closed -> unclosed
        assert counter(NAMESPACE, f"dead_letters/{Reason.UNCLOSED}") == 1
        assert counter(NAMESPACE, "buffered_items") == 0 and counter(NAMESPACE, "timer_firings") == 2
        assert len(out) == 1 + counter(NAMESPACE, "releases") - 2  # the end's releases, then one letter


def test_state_per_open_step_does_not_grow_with_its_events():
    """Streaming pre-aggregation: the events of one open step are merged into one sum as they arrive
    (the bag stays empty), so the key's state has the same size for 1 event or 200 (but for digits)."""
    sizes = []
    for n in (1, 200):
        dofn = ContinualReleaseDoFn(PARAMS, per_step_timers=True)
        dofn.setup()
        cell, bag, close, end = Cell(), Bag(), Timer(), Timer()
        for i in range(n):
            block = dofn._driver.policy.mechanism.clip_and_sum(np.array([(i % 7) / 7]))
            list(dofn.process(("a", (3, block, "e")), cell, bag, close, end, bag.sums))
        assert bag == []
        sizes.append(len(bag.sums.read()))
        (row,) = [o.value for o in dofn.on_close(Timestamp(micros=30 * S), "1", "a", cell, bag, close, bag.sums)]
        assert row.step == 3 and bag.sums.read() is None
    # the same size but for the digits of the event count in the entry's header (1 vs 200); a bag
    # holding every event would be ~200 times larger
    assert abs(sizes[1] - sizes[0]) <= 8


def test_a_backlog_of_open_steps_beyond_the_merged_ones_goes_to_the_bag_and_releases_the_same():
    """Past ``MAX_MERGED`` open steps, sums go to the bag; the releases equal the pure driver's over an
    in-memory buffer (same blocks, same keyed noise: 1e-12 relative absorbs summation order only)."""
    from beam_dp.beam.shell.dofn import SummingBuffer
    from beam_dp.steps.driver import ListBuffer

    dofn = ContinualReleaseDoFn(PARAMS, per_step_timers=True)
    dofn.setup()
    cell, bag, close, end = Cell(), Bag(), Timer(), Timer()
    mechanism = dofn._driver.policy.mechanism
    steps = list(range(1, SummingBuffer.MAX_MERGED + 9))  # 40 open steps, two events each
    pure, pure_buffer = dofn._driver.open("a"), ListBuffer()
    for step in steps + steps:
        block = mechanism.clip_and_sum(np.array([step / 50]))
        list(dofn.process(("a", (step, block, "e")), cell, bag, close, end, bag.sums))
        dofn._driver.add(pure, pure_buffer, step, block, "e")
    assert len(bag) == 2 * 8  # the 8 steps past the merged 32, both events each
    rows = [o.value for o in dofn.on_close(Timestamp(micros=400 * S), "16", "a", cell, bag, close, bag.sums)]
    want = [o.value for o in dofn._driver.advance(pure, pure_buffer, 400 * S)]
    assert [r.step for r in rows] == [r.step for r in want] == steps
    assert np.allclose([r.value for r in rows], [r.value for r in want], rtol=1e-12, atol=1e-12)
    assert bag == [] and bag.sums.read() is None
