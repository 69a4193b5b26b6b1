"""The one end rule on the Beam shell, its timer callbacks called directly (no runner), so the order
of the firings at +infinity is the test's: rungs in timestamp order then ``end`` (the DirectRunner),
``end`` first, and either with the key's state round-tripped through the coder on a fresh DoFn before
every firing (a restore). Every order releases the same steps, the driver's ``end_step`` of the first
step the last finite watermark had not closed (what the Flink shell computes from its exact
watermark: tests/flink/test_shell_rules.py), with the same values and dead letters."""

from __future__ import annotations

import numpy as np
import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.steps.coder import decode_key_state, encode_key_state
from beam_dp.steps.driver import RELEASE, ListBuffer
from beam_dp.steps.params import NoiseKey
from tests.beam.fake_state import Bag, Cell, Timer

OPEN = StepClock(start=0.0, period=10.0)  # no public end
S = 1_000_000
END_TAG = ""  # the end timer's (untagged) slot in the fake Timer


class Shell:
    """One key of the shell with its state, bag and timers; ``restore``: a fresh DoFn and the key's
    state decoded and re-encoded before every firing (a worker restored from a checkpoint)."""

    def __init__(self, params, restore=False):
        self.params, self.restore = params, restore
        self.key_state, self.bag, self.close, self.end = Cell(), Bag(), Timer(), Timer()
        self.releases, self.dead = [], []
        self.dofn = self._fresh()

    def _fresh(self):
        dofn = ContinualReleaseDoFn(self.params, per_step_timers=True)
        dofn.setup()
        return dofn

    def _collect(self, outputs):
        for out in outputs:
            if isinstance(out, TaggedOutput):
                self.dead.append(out.value.reason)
            else:
                assert isinstance(out, TimestampedValue)  # stamped end(step): the public time (no grace)
                assert out.timestamp.micros == OPEN.step_end_micros(out.value.step)
                self.releases.append(out.value)

    def _maybe_restore(self):
        if self.restore:
            self.dofn = self._fresh()
            self.key_state.write(encode_key_state(decode_key_state(self.key_state.read())))

    def element(self, seconds, value):
        block = self.dofn._driver.policy.mechanism.clip_and_sum(np.array([value]))
        step = int(OPEN.step_of_micros(round(seconds * S)))
        self._collect(self.dofn.process(("a", (step, block, ("a", seconds, value))), self.key_state, self.bag,
                                        self.close, self.end, self.bag.sums))

    def fire_rung(self, tag):
        self._maybe_restore()
        at = self.close.set_at.pop(tag)
        self._collect(self.dofn.on_close(Timestamp(micros=at), tag, "a", self.key_state, self.bag, self.close,
                                         self.bag.sums))

    def fire_end(self):
        self._maybe_restore()
        self.end.set_at.pop(END_TAG)
        self._collect(self.dofn.on_end("a", self.key_state, self.bag, self.bag.sums))

    def advance(self, watermark_s):
        """A finite watermark: rounds of the due rungs in timestamp order until none is due (timers a
        round sets fire in the next round, as on a runner)."""
        while due := sorted((at, tag) for tag, at in self.close.set_at.items() if at <= watermark_s * S):
            for _, tag in due:
                self.fire_rung(tag)

    def to_infinity(self, order):
        """+infinity: the armed rungs and ``end`` fire once, in ``order``; what they re-arm fires later,
        on an ended key (a no-op)."""
        rungs = [tag for _, tag in sorted((at, tag) for tag, at in self.close.set_at.items())]
        for timer in (rungs + [END_TAG] if order == "timestamp" else [END_TAG] + rungs[::-1]):
            self.fire_end() if timer == END_TAG else self.fire_rung(timer)
        rounds = 0
        while self.close.set_at and rounds < 3:  # what they re-armed: no-ops now
            before = len(self.releases)
            for tag in list(self.close.set_at):
                self.fire_rung(tag)
            assert len(self.releases) == before
            rounds += 1


def _params():
    return ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN, noise_key=NoiseKey(domain="endrule"))


EVENTS = [(5.0, 0.5), (152.0, 0.25), (163.0, 1.0), (455.0, 0.75), (1995.0, 0.5)]  # steps 1, 16, 17, 46, 200


def _driver_alone(params, watermark_s):
    """What an engine that knows the watermark (Flink) computes: the driver on the same items."""
    shell = Shell(params)
    driver = shell.dofn._driver
    state, buffer = driver.open("a", 0), ListBuffer()
    for seconds, value in EVENTS:
        block = driver.policy.mechanism.clip_and_sum(np.array([value]))
        driver.add(state, buffer, int(OPEN.step_of_micros(round(seconds * S))), block, None)
    out = driver.advance(state, buffer, watermark_s * S)
    first_open = state.next_step
    out += driver.finish(state, buffer)
    return first_open, [o.value for o in out if o.tag == RELEASE], sorted(o.value.reason for o in out if o.tag != RELEASE)


# last finite watermarks: mid-step 3; mid-step 16 (first open step a multiple of 16); the close of
# step 16 exactly; after a jump of 45 steps
@pytest.mark.parametrize("watermark_s", [25, 155, 160, 455])
def test_every_firing_order_and_a_restore_release_the_end_rule_s_steps(watermark_s):
    params = _params()
    first_open, expected, expected_dead = _driver_alone(params, watermark_s)
    runs = {}
    for order in ("timestamp", "end-first"):
        for restore in (False, True):
            shell = Shell(params, restore)
            for seconds, value in EVENTS:
                shell.element(seconds, value)
            shell.advance(watermark_s)
            shell.to_infinity(order)
            runs[order, restore] = shell
    last = shell.dofn._driver.end_step(first_open)
    assert first_open == int(watermark_s // 10) + 1  # the step the watermark had not closed: exact ints
    assert last == (first_open // 16 + 1) * 16
    for (order, restore), shell in runs.items():
        assert [r.step for r in shell.releases] == list(range(1, last + 1)), (order, restore)
        assert sorted(shell.dead) == expected_dead == ["unclosed"] * sum(
            1 for seconds, _ in EVENTS if OPEN.step_of_micros(round(seconds * S)) > last)
        # the same keyed noise and sums: equal up to float summation order (1e-12 relative)
        for got, want in zip(shell.releases, expected):
            assert got.step == want.step
            np.testing.assert_allclose(got.value, want.value, rtol=1e-12, atol=1e-12)
