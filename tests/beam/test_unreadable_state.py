"""The Beam shell, called directly: state this version cannot read (corrupt bytes, or written under
another ``stream_groups``) becomes one ``unreadable_state`` dead letter and a metric and ends that
stream, with no exception (a raising timer callback is retried forever on Dataflow); a v1 state is
read and continues."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.steps.coder import UNREADABLE_STATE, decode_key_state, encode_key_state
from beam_dp.steps.events import DEAD_LETTER, Reason
from beam_dp.steps.params import NoiseKey
from tests.beam.fake_state import Bag, Cell, Timer, metrics

S = 1_000_000
CLOCK = StepClock(start=0.0, period=10.0)
PARAMS = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, counter="tree",  # as the v1 fixture
                            noise_key=NoiseKey(domain="unreadable"))
NAMESPACE = "beam_dp/" + PARAMS.build_mechanism().name


def _shell(params=PARAMS):
    dofn = ContinualReleaseDoFn(params, per_step_timers=True)
    dofn.setup()
    return dofn, Cell(), Bag(), Timer(), Timer()


def _block(dofn, value=0.5):
    return dofn._driver.policy.mechanism.clip_and_sum(np.array([value]))


def _letters(outputs):
    return [(o.value.reason, o.value.stream) for o in outputs if isinstance(o, TaggedOutput) and o.tag == DEAD_LETTER]


def test_a_corrupt_state_at_a_firing_is_one_dead_letter_a_metric_and_the_end_of_the_stream():
    dofn, cell, bag, close, end = _shell()
    with metrics() as counter:
        list(dofn.process(("a", (2, _block(dofn), "e1")), cell, bag, close, end, bag.sums))
        assert bag == [] and bag.sums.read() and counter(NAMESPACE, "buffered_items") == 1  # pre-aggregated
        cell.write(b"BDPS\x01\x00garbage")  # the key's state, unreadable
        out = list(dofn.on_close(Timestamp(micros=20 * S), "1", "a", cell, bag, close, bag.sums))
        assert _letters(out) == [(UNREADABLE_STATE, "a")] and len(out) == 1
        assert counter(NAMESPACE, "unreadable_states") == 1
        assert counter(NAMESPACE, f"dead_letters/{UNREADABLE_STATE}") == 1
        assert counter(NAMESPACE, "timer_firings") == 1
        assert bag == [] and bag.sums.read() is None and decode_key_state(cell.read()).stream_ended
        # the stream has ended: a later item is dead-lettered, later firings release nothing
        later = list(dofn.process(("a", (5, _block(dofn), "e2")), cell, bag, close, end, bag.sums))
        assert _letters(later) == [(Reason.STREAM_ENDED, "a")]
        assert list(dofn.on_close(Timestamp(micros=60 * S), "4", "a", cell, bag, close, bag.sums)) == []
        assert list(dofn.on_end("a", cell, bag, bag.sums)) == []
        assert counter(NAMESPACE, "unreadable_states") == 1 and counter(NAMESPACE, "releases") == 0


def test_state_written_under_another_group_count_is_refused_with_the_reason():
    """``stream_groups`` is fixed at launch: a key whose state recorded 4 groups, read by a job with 8
    (an ``--update`` that changed it), ends with an ``unreadable_state`` letter naming both."""
    four = dataclasses.replace(PARAMS, stream_groups=4)
    dofn, cell, bag, close, end = _shell(four)
    list(dofn.process(("stream-group-1", (0, _declaring(), None)), cell, bag, close, end, bag.sums))
    assert decode_key_state(cell.read()).stream_groups == 4
    updated, *_ = _shell(dataclasses.replace(PARAMS, stream_groups=8))
    with metrics() as counter:
        out = list(updated.on_close(Timestamp(micros=10 * S), "1", "stream-group-1", cell, bag, close, bag.sums))
        assert _letters(out) == [(UNREADABLE_STATE, "stream-group-1")]
        assert "stream_groups=4" in out[0].value.detail and "stream_groups=8" in out[0].value.detail
        assert counter(NAMESPACE, "unreadable_states") == 1


def _declaring():
    from beam_dp.mechanisms.stream_groups import GroupBlock

    return GroupBlock.declaring(["s1"], 1)


def test_a_v1_state_written_by_the_previous_coder_is_read_and_continues():
    dofn, cell, bag, close, end = _shell()
    v1 = (Path(__file__).parents[1] / "steps" / "fixtures" / "key_state_v1.bin").read_bytes()
    cell.write(v1)  # stream "a", next step 5 (no buffered entry here: the fixture's entry is read elsewhere)
    with metrics() as counter:
        out = list(dofn.on_close(Timestamp(micros=70 * S), "1", "a", cell, bag, close, bag.sums))
        assert [o.value.step for o in out] == [5, 6, 7] and counter(NAMESPACE, "unreadable_states") == 0
    state = decode_key_state(cell.read())
    assert state.next_step == 8 and encode_key_state(state) != v1  # written back as v2


def test_a_state_written_under_other_privacy_parameters_is_refused_and_one_from_before_the_binding_continues():
    """The noise is bound to the parameters: a key's state written under epsilon 1, read by a job under
    epsilon 2 (an ``--update`` or a restored snapshot that changed it), ends with one ``unreadable_state``
    letter instead of drawing new noise for its open cells. The v1 fixture (written before the binding)
    continues under the legacy derivation: its releases are those of the legacy noise source."""
    dofn, cell, bag, close, end = _shell()
    list(dofn.process(("a", (1, _block(dofn), "e1")), cell, bag, close, end, bag.sums))
    assert decode_key_state(cell.read()).noise_binding == dofn._driver.binding is not None
    changed, *_ = _shell(dataclasses.replace(PARAMS, epsilon=2.0))
    with metrics() as counter:
        out = list(changed.on_close(Timestamp(micros=10 * S), "1", "a", cell, bag, close, bag.sums))
        assert _letters(out) == [(UNREADABLE_STATE, "a")] and "other privacy parameters" in out[0].value.detail
        assert counter(NAMESPACE, "releases") == 0
    # the v1 key continues with the legacy source's draws: equal to a driver drawing from it alone
    from beam_dp.steps.driver import ListBuffer, StepDriver
    from beam_dp.steps.policies import BlockPolicy

    v1 = (Path(__file__).parents[1] / "steps" / "fixtures" / "key_state_v1.bin").read_bytes()
    dofn, cell, bag, close, end = _shell()
    cell.write(v1)
    got = [o.value for o in dofn.on_close(Timestamp(micros=70 * S), "1", "a", cell, bag, close, bag.sums)]
    legacy = StepDriver(BlockPolicy(PARAMS.build_mechanism(), dofn._driver.legacy_noise()), clock=CLOCK)
    want = [o.value for o in legacy.close_through(decode_key_state(v1), ListBuffer(), 7)]
    assert [r.step for r in got] == [r.step for r in want] == [5, 6, 7]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.value, w.value, rtol=1e-12, atol=0)
    assert decode_key_state(cell.read()).noise_binding is None  # it stays a legacy key
