"""The Beam shell's ladder of close timers, called directly (no runner): which rungs a firing
re-arms, and a timer left by a version before the ladder (no tag: a Dataflow update) re-arms all."""

from __future__ import annotations

import numpy as np
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.dofn import LADDER, ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.steps.params import NoiseKey
from tests.beam.fake_state import Bag, Cell, Timer

CLOCK = StepClock(start=0.0, period=10.0)  # open: no public end
S = 1_000_000  # µs per second


def _shell():
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, noise_key=NoiseKey(domain="ladder"))
    dofn = ContinualReleaseDoFn(params, per_step_timers=True)
    dofn.setup()
    key_state, buffer, close, end = Cell(), Bag(), Timer(), Timer()
    list(dofn.process(("a", (1, None, None)), key_state, buffer, close, end, buffer.sums))  # declares the stream
    return dofn, key_state, buffer, close


def _fire(dofn, at_s, rung, key_state, buffer, close):
    """Fires the close timer ``rung`` at ``at_s`` seconds; the release rows, each checked to carry its
    step's public time (end of the step: no grace here), exact integers of µs."""
    out = list(dofn.on_close(Timestamp(micros=at_s * S), rung, "a", key_state, buffer, close, buffer.sums))
    assert all(isinstance(o, TimestampedValue) for o in out)
    assert [o.timestamp.micros for o in out] == [CLOCK.step_end_micros(o.value.step) for o in out]
    return [o.value for o in out]


def test_a_new_key_arms_every_rung_at_the_close_of_its_multiple():
    _, _, _, close = _shell()
    assert close.set_at == {"1": 10 * S, "4": 40 * S, "16": 160 * S}  # steps 1, 4, 16 end at 10, 40, 160 s


def test_a_firing_closes_up_to_its_time_and_re_arms_only_its_own_rung():
    dofn, key_state, buffer, close = _shell()
    close.set_at.clear()
    rows = _fire(dofn, 160, "16", key_state, buffer, close)
    assert [r.step for r in rows] == list(range(1, 17))
    assert close.set_at == {"16": 320 * S}  # the next multiple of 16 after the closed steps
    rows = _fire(dofn, 40, "4", key_state, buffer, close)  # fired late: no-op
    assert rows == [] and close.set_at["4"] == 200 * S  # step 20, the first multiple of 4 after step 16


def test_an_untagged_timer_from_before_the_ladder_re_arms_every_rung():
    dofn, key_state, buffer, close = _shell()
    close.set_at.clear()
    rows = _fire(dofn, 10, "", key_state, buffer, close)
    assert [r.step for r in rows] == [1]
    assert close.set_at == {"1": 20 * S, "4": 40 * S, "16": 160 * S}
    assert np.isfinite(rows[0].value).all() and set(LADDER) == {1, 4, 16}


def test_a_restored_stream_arms_its_ladder_after_its_snapshot_step():
    """A stream restored from a snapshot is not provisional: its rungs are armed at once, after the
    snapshot's step (here the snapshot closed steps 1..5: rungs at steps 6, 8 and 16)."""
    import dataclasses

    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, noise_key=NoiseKey(domain="ladder"))
    mechanism = params.build_mechanism()
    snapshot = mechanism.init_state("r")
    for _ in range(5):
        snapshot, _ = mechanism.step(snapshot, None, _noise())
    restored = dataclasses.replace(params, restore_states=(("r", mechanism.encode_state(snapshot)),))
    dofn = ContinualReleaseDoFn(restored, per_step_timers=True)
    dofn.setup()
    key_state, buffer, close, end = Cell(), Bag(), Timer(), Timer()
    list(dofn.process(("r", (0, None, None)), key_state, buffer, close, end, buffer.sums))
    assert close.set_at == {"1": 60 * S, "4": 80 * S, "16": 160 * S}


def _noise():
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    return NoiseSource(TEST_KEY)
