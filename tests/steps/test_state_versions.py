"""State that survives versions: the v1 fixtures (tests/steps/fixtures, written by the coder before
``KeyState`` v2) are read by this version; state this version cannot read is refused with
``UnreadableState``, and the driver ends such a key with one ``unreadable_state`` dead letter."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.state import encode_state
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.steps.coder import (
    UNREADABLE_STATE,
    KeyState,
    UnreadableState,
    decode_entry,
    decode_key_state,
    encode_key_state,
)
from beam_dp.steps.driver import RELEASE, ListBuffer, StepDriver
from beam_dp.steps.events import DEAD_LETTER, Reason
from beam_dp.steps.policies import BlockPolicy
from tests.conftest import TEST_KEY

FIXTURES = Path(__file__).parent / "fixtures"
S = 1_000_000
OPEN = StepClock(start=0.0, period=10.0)


def _driver():
    mechanism = make_tree_sum(dim=1, epsilon=1.0, clip_bound=1.0, horizon=None)
    return StepDriver(BlockPolicy(mechanism, NoiseSource(TEST_KEY)), clock=OPEN)


def test_a_v1_key_state_is_read_with_every_field_and_the_new_fields_defaulted():
    state = decode_key_state((FIXTURES / "key_state_v1.bin").read_bytes())
    # the fixture's facts (tests/steps/fixtures/README.md): ints and flags, exact by construction
    assert (state.key, state.next_step, state.offset, state.watermark, state.lowest) == ("a", 5, 2, 40 * S, 5)
    assert (state.buffered, state.ended, state.stream_ended) == (0, False, False)
    assert state.provisional is False and state.stream_groups is None  # v2's fields: defaults (not recorded)
    again = decode_key_state(encode_key_state(state))  # re-encoded as v2, read back the same
    assert (again.next_step, again.offset, again.lowest) == (5, 2, 5)
    assert again.mechanism.tobytes() == state.mechanism.tobytes()


def test_a_v2_key_state_is_read_and_ends_by_the_end_rule_as_a_key_at_rest():
    """The v2 fixture (written by the v2 coder, before ``first_rung``): v3's field takes its default
    (None: not recorded), and the end rule then takes the key as at rest: through step 16."""
    state = decode_key_state((FIXTURES / "key_state_v2.bin").read_bytes())
    assert (state.key, state.next_step, state.offset, state.watermark, state.lowest) == ("b", 5, 2, 40 * S, None)
    assert (state.provisional, state.stream_groups, state.first_rung) == (False, 0, None)
    out = _driver().finish(state, ListBuffer())
    assert [o.value.step for o in out if o.tag == RELEASE] == list(range(5, 17)) and state.ended


def test_a_v1_state_continues_where_it_stopped():
    """The v1 key (next step 5, one item buffered for step 5) closes steps 5.. with its mechanism state."""
    driver = _driver()
    state = decode_key_state((FIXTURES / "key_state_v1.bin").read_bytes())
    step, item = decode_entry((FIXTURES / "entry_v1.bin").read_bytes())
    assert step == 5 and isinstance(item, ClippedSum)
    # the clipped sum of [0.25] (clip bound 1): exact, a stored float64 read back bit for bit by design
    assert item.vector.tolist() == [0.25] and (item.count, item.clipped) == (1, 0)
    out = driver.advance(state, ListBuffer([(step, item)]), 70 * S)
    assert [o.value.step for o in out if o.tag == RELEASE] == [5, 6, 7]
    assert state.next_step == 8
    # the same key run by this version from the start (as the fixture was written) releases the same
    # values: same state and keyed noise; 1e-12 relative only absorbs float summation order
    fresh, buf = driver.open("a", 25 * S), ListBuffer()
    mechanism = driver.policy.mechanism
    driver.add(fresh, buf, 4, mechanism.clip_and_sum(np.array([0.5])), "e")
    driver.advance(fresh, buf, 40 * S)
    driver.add(fresh, buf, 5, mechanism.clip_and_sum(np.array([0.25])), "e")
    again = driver.advance(fresh, buf, 70 * S)
    assert [o.value.step for o in again] == [5, 6, 7]
    assert np.allclose([o.value.value for o in out], [o.value.value for o in again], rtol=1e-12, atol=0)


def _encoded(**changes) -> bytes:
    """A KeyState encoding with ``changes`` to its header (``version``) or fields (``extra``)."""
    state = _driver().open("a")
    data = encode_key_state(state)
    if "version" in changes:
        data = data.replace(b'"version":%d' % KeyState.STATE_VERSION, b'"version":%d' % changes["version"], 1)
    if "extra" in changes:
        @dataclasses.dataclass
        class KeyState3(KeyState):  # noqa: D401 - a newer KeyState with one more field
            extra: int = 0
        KeyState3.__qualname__ = KeyState.__qualname__
        KeyState3.__module__ = KeyState.__module__
        data = encode_state(KeyState3(**dataclasses.asdict(state), extra=1))
    return data


@pytest.mark.parametrize("data,why", [
    (b"garbage", "not a beam_dp state encoding"),
    (None, "truncated"),
    ("version", f"cannot be read by version {KeyState.STATE_VERSION}"),
    ("extra", "does not know"),
], ids=["garbage", "truncated", "newer-version", "unknown-field"])
def test_state_this_version_cannot_read_is_refused_as_unreadable(data, why):
    if data is None:
        data = encode_key_state(_driver().open("a"))[:-3]
    elif data == "version":
        data = _encoded(version=KeyState.STATE_VERSION + 1)
    elif data == "extra":
        data = _encoded(extra=True)
    with pytest.raises(UnreadableState, match=why):
        decode_key_state(data)


def test_an_unreadable_mechanism_state_raises_unreadable_and_the_driver_ends_the_key():
    driver = _driver()
    state, buf = driver.open("a"), ListBuffer()
    driver.add(state, buf, 1, driver.policy.mechanism.clip_and_sum(np.array([1.0])), "e")
    state.mechanism = np.frombuffer(b"not a mechanism state", dtype=np.uint8).copy()
    with pytest.raises(UnreadableState, match="mechanism state"):
        driver.advance(state, buf, 20 * S)
    ended, out = driver.unreadable("a", buf, "mechanism state: corrupt")
    assert [(o.tag, o.value.reason, o.value.stream, o.value.element) for o in out] == [
        (DEAD_LETTER, UNREADABLE_STATE, "a", None)]
    assert not buf and ended.ended and ended.stream_ended
    # the ended key: later items are dead-lettered, nothing is released, nothing raises
    late = driver.add(ended, buf, 9, driver.policy.mechanism.clip_and_sum(np.array([1.0])), "later")
    assert [(o.value.reason, o.value.element) for o in late] == [(Reason.STREAM_ENDED, "later")]
    assert driver.advance(ended, buf, 200 * S) == [] and driver.finish(ended, buf) == [] and not buf
    again = decode_key_state(encode_key_state(ended))
    assert again.ended and again.stream_ended and again.mechanism.size == 0
