"""The engine-neutral step driver, without any engine: closing, lateness, grace, the end rule,
first-seen streams, refusals, restore and the versioned buffer coder."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource, StepClock
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.steps.coder import decode_entry, decode_key_state, encode_entry, encode_key_state
from beam_dp.steps.driver import RELEASE, ListBuffer, StepDriver
from beam_dp.steps.events import DEAD_LETTER, Reason
from beam_dp.steps.policies import BlockPolicy
from tests.conftest import TEST_KEY

S = 1_000_000  # µs per second
OPEN = StepClock(start=0.0, period=10.0)  # no public end


def _driver(clock=OPEN, horizon=None, grace=0.0, restored=None, block_size=None):
    mechanism = make_tree_sum(dim=1, epsilon=1.0, clip_bound=1.0, horizon=horizon)
    return StepDriver(BlockPolicy(mechanism, NoiseSource(TEST_KEY)), clock=clock, block_size=block_size,
                      last_step=None if clock is None else clock.last_step, allowed_lateness=grace,
                      restored=restored)


def _block(driver, value=1.0):
    return driver.policy.mechanism.clip_and_sum(np.array([value]))


def _steps(outputs, tag=RELEASE):
    return [o.value.step if tag == RELEASE else o.value for o in outputs if o.tag == tag]


def test_one_call_closes_every_passed_step_in_order():
    driver = _driver()
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 3, _block(driver), "e")
    out = driver.advance(state, buf, 1000 * 10 * S)  # a jump of 1,000 steps
    assert _steps(out) == list(range(1, 1001))
    assert state.next_step == 1001 and driver.timer(state) == 1001 * 10 * S and not buf


def test_late_item_is_dead_lettered_whole_and_never_enters_state():
    driver = _driver()
    state, buf = driver.open("a"), ListBuffer()
    driver.advance(state, buf, 20 * S)
    before = state.mechanism.copy()
    out = driver.add(state, buf, 2, _block(driver), "the original")
    assert [(d.reason, d.element) for d in _steps(out, DEAD_LETTER)] == [(Reason.LATE, "the original")]
    assert not buf and np.array_equal(state.mechanism, before)


def test_allowed_lateness_keeps_a_step_open_for_the_grace():
    driver = _driver(grace=5.0)
    state, buf = driver.open("a"), ListBuffer()
    assert driver.advance(state, buf, 14 * S) == []  # end(1) = 10 s, + 5 s grace not yet passed
    assert driver.add(state, buf, 1, _block(driver), "in grace") == []
    assert _steps(driver.advance(state, buf, 15 * S)) == [1]
    assert driver.timer(state) == 25 * S
    assert _steps(driver.add(state, buf, 1, _block(driver), "too late"), DEAD_LETTER)[0].reason == Reason.LATE


def test_a_stream_first_seen_late_starts_at_the_first_open_step():
    driver = _driver(grace=5.0)
    state = driver.open("new", watermark=52 * S)  # steps with end + 5 s <= 52 s are closed: 1..4
    assert state.next_step == 5
    buf = ListBuffer()
    assert _steps(driver.add(state, buf, 2, _block(driver), "x"), DEAD_LETTER)[0].reason == Reason.LATE
    assert driver.open("fresh").next_step == 1  # no watermark known (batch replay): step 1


def test_end_of_input_releases_through_the_first_multiple_of_16_after_the_first_open_step():
    driver = _driver()
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 3, _block(driver), "e3")
    driver.add(state, buf, 17, _block(driver), "e17")  # a future step beyond the end rule
    assert _steps(driver.advance(state, buf, 25 * S)) == [1, 2]
    out = driver.finish(state, buf)
    assert _steps(out) == list(range(3, 17))  # the first open step is 3: through step 16
    assert [d.reason for d in _steps(out, DEAD_LETTER)] == [Reason.UNCLOSED]
    assert [driver.end_step(n) for n in (1, 15, 16, 17, 32)] == [16, 16, 32, 32, 48]
    assert _driver(clock=StepClock(start=0.0, period=10.0, end=200.0)).end_step(17) == 20  # capped at the end
    assert state.ended and driver.timer(state) is None and driver.finish(state, buf) == []
    assert _steps(driver.add(state, buf, 5, _block(driver), "after"), DEAD_LETTER)[0].reason == Reason.LATE


def test_end_of_a_batch_replay_uses_the_public_end():
    driver = _driver(clock=StepClock(start=0.0, period=10.0, end=50.0))
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 2, _block(driver), "e")
    assert _steps(driver.finish(state, buf)) == [1, 2, 3, 4, 5]


def test_a_refusal_at_the_public_horizon_ends_the_stream():
    driver = _driver(clock=StepClock(start=0.0, period=10.0, end=50.0), horizon=2)
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 4, _block(driver), "buffered for step 4")
    out = driver.advance(state, buf, 40 * S)
    assert _steps(out) == [1, 2]
    ended = _steps(out, DEAD_LETTER)
    assert [(d.reason, d.element) for d in ended] == [(Reason.STREAM_ENDED, None)] and "step 3" in ended[0].detail
    assert state.stream_ended and not buf and state.mechanism.size == 0 and driver.timer(state) is None
    later = _steps(driver.add(state, buf, 5, _block(driver), "later"), DEAD_LETTER)
    assert [(d.reason, d.element) for d in later] == [(Reason.STREAM_ENDED, "later")]
    assert driver.advance(state, buf, 50 * S) == [] and driver.finish(state, buf) == []


def test_count_steps_release_every_block_size_contributions():
    driver = _driver(clock=None, block_size=2)
    state, buf = driver.open("a"), ListBuffer()
    assert driver.add(state, buf, None, _block(driver), "1") == []
    assert _steps(driver.add(state, buf, None, _block(driver), "2")) == [1]
    assert driver.add(state, buf, None, _block(driver), "3") == [] and _steps(driver.finish(state, buf)) == []


def test_restored_stream_continues_after_its_snapshot():
    driver = _driver()
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 1, _block(driver, 0.5), "e")
    driver.advance(state, buf, 30 * S)
    snapshot = state.mechanism.tobytes()
    restored = _driver(restored=[("a", snapshot)])
    again = restored.open("a")
    assert again.next_step == 4 and restored.timer(again) == 40 * S


def test_key_state_and_buffered_items_round_trip_through_the_versioned_coder():
    from beam_dp.mechanisms.lifelong.config import TaskData
    from beam_dp.mechanisms.online.learners import OnlineRecord

    driver = _driver()
    state = driver.open("a", watermark=7 * S)
    back = decode_key_state(encode_key_state(state))
    assert np.array_equal(back.mechanism, state.mechanism)
    assert (back.key, back.next_step, back.buffered, back.watermark, back.ended) == ("a", 1, 0, 7 * S, False)
    items = [ClippedSum(np.array([0.5, 1.0]), 2, 1), TaskData("t1", np.ones((2, 3)), np.array([0, 1])),
             OnlineRecord(np.array([1.0, 2.0]), 0.5), (12, 3), (5, "q1", np.array([0.0, 1.0]))]
    for item in items:
        step, back = decode_entry(encode_entry(7, item))
        assert step == 7 and type(back) is type(item)
        if isinstance(item, tuple):
            assert len(back) == len(item) and all(np.array_equal(a, b) for a, b in zip(back, item))
        else:
            assert all(np.array_equal(getattr(back, f), getattr(item, f)) for f in item.__dataclass_fields__)
    with pytest.raises(TypeError, match="no buffer kind"):
        encode_entry(1, object())
    with pytest.raises(ValueError):
        decode_entry(b"garbage")


def test_closing_steps_without_buffered_items_never_reads_the_buffer():
    class NoRead(ListBuffer):
        def read(self):
            raise AssertionError("the buffer was read")

    driver = _driver()
    state, buf = driver.open("a"), NoRead()
    driver.add(state, buf, 7, _block(driver), "e")
    assert state.lowest == 7
    assert _steps(driver.advance(state, buf, 60 * S)) == [1, 2, 3, 4, 5, 6]  # step 7 is not yet closed
    with pytest.raises(AssertionError, match="buffer was read"):
        driver.advance(state, buf, 70 * S)


def test_a_provisional_key_opens_at_its_lowest_item_until_its_first_firing():
    """An engine without the watermark (Beam): the key's first step is the lowest step of the items it
    gets before its first close timer fires; that firing fixes it, and a lower item is then late."""
    driver = _driver()
    state, buf = driver.open("a", provisional=True), ListBuffer()
    assert state.provisional and driver.timer(state) is None  # no step yet: no close timer
    driver.add(state, buf, 9, _block(driver), "e9")
    assert (state.next_step, state.offset) == (9, 8) and driver.timer(state) == 90 * S
    driver.add(state, buf, 7, _block(driver), "e7")  # a lower item before any firing moves it
    driver.add(state, buf, 8, _block(driver), "e8")
    assert (state.next_step, state.offset) == (7, 6) and driver.timer(state) == 70 * S
    out = driver.advance(state, buf, 70 * S)  # the first firing: step 7 closes, the first step is fixed
    assert _steps(out) == [7] and not state.provisional
    late = driver.add(state, buf, 6, _block(driver), "e6")
    assert [(d.reason, d.element) for d in _steps(late, DEAD_LETTER)] == [(Reason.LATE, "e6")]
    assert _steps(driver.advance(state, buf, 90 * S)) == [8, 9]
    declared = driver.open("b", provisional=True)
    driver.add(declared, ListBuffer(), 9, _block(driver), "e")
    driver.declare(declared)  # a declaration: step 1, fixed
    assert (declared.next_step, declared.offset, declared.provisional) == (1, 0, False)
    never = driver.open("c", provisional=True)  # no item ever: nothing to release at the end
    assert driver.finish(never, ListBuffer()) == [] and never.ended
