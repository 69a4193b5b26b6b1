"""A new stream whose first event is late, through the Flink shell (:class:`beam_dp.flink.job.ContinualReleaseFunction`)
driven by the scripted Flink of tests/flink/test_shell_rules.py: the event is dead-lettered and no release
of any stream is behind the watermark (a Flink record with timestamp ``<=`` a watermark already passed
downstream is late), the scenario of tests/beam/test_late_first_event.py. Also after a restore (a fresh
function on the checkpointed keyed state, Flink's watermark unknown again): the events go through the
watermark gate (:mod:`beam_dp.flink.gate`), scripted the same way, whose keyed state outlives the restore.
Needs .venv-flink."""

from __future__ import annotations

import pytest

pytest.importorskip("pyflink")

from beam_dp.flink.gate import GATE_BUCKETS, GateSeed, WatermarkGateFunction, gate_bucket  # noqa: E402
from tests.flink.test_shell_rules import END, MIN_WATERMARK, ScriptedFlink, _ms, _params  # noqa: E402


class WatchedFlink(ScriptedFlink):
    """Records each release whose time (ms) is at or before the highest watermark already passed
    downstream (across restores: a sink downstream has seen it)."""

    def __init__(self, params, provisional=True):
        self.passed, self.behind = MIN_WATERMARK, []
        super().__init__(params, provisional)

    def _collect(self, outputs):
        count = len(self.releases)
        super()._collect(outputs)
        grace = round(self.params.allowed_lateness * 1_000_000)
        for row in self.releases[count:]:
            if (self.params.clock.step_end_micros(row["step"]) + grace) // 1000 <= self.passed:
                self.behind.append((row["stream"], row["step"]))

    def advance(self, ms):
        super().advance(ms)
        self.passed = max(self.passed, ms)


class _BucketValue:
    """The gate's ``ValueState``, following the gate's current bucket."""

    def __init__(self, gate):
        self.gate = gate

    def value(self):
        return self.gate.states.get(self.gate.key)

    def update(self, data):
        self.gate.states[self.gate.key] = data


class GatedFlink(WatchedFlink):
    """The gate stage ahead of the release function, each with its keyed state and timers; the gate's timers
    fire before the release function's at each watermark (it passes the watermark on). Every bucket is
    seeded when the job starts, as :func:`beam_dp.flink.job.gated` does."""

    def __init__(self, params, provisional=True):
        self.gate_states: dict[int, int] = {}
        self.gate_timers: set[tuple[int, int]] = set()
        super().__init__(params, provisional)
        self._open_gate()
        for bucket in range(GATE_BUCKETS):
            self._gate_element(("", self.params.clock.start, GateSeed(bucket)))

    def _open_gate(self):
        self.gate = WatermarkGateFunction(self.params)
        self.gate.open(_GateContext(self))

    def _gate_element(self, event):
        context = _GateContext(self, gate_bucket(event))
        return list(self.gate.process_element(event, context))

    def element(self, stream, seconds, value):
        for gated in self._gate_element((stream, float(seconds), value)):
            self.key = stream
            self._collect(self.function.process_element(gated, self))

    def advance(self, ms):
        self.watermark = ms
        while due := sorted(t for t in self.gate_timers if t[0] <= ms):
            self.gate_timers.discard(due[0])
            assert not list(self.gate.on_timer(due[0][0], _GateContext(self, due[0][1])))
        super().advance(ms)

    def restore(self):
        super().restore()
        self._open_gate()


class _GateContext:
    """The gate's runtime context, context and timer service at bucket ``key``."""

    def __init__(self, flink, key=None):
        self.flink, self.key = flink, key

    @property
    def states(self):
        return self.flink.gate_states

    def get_state(self, descriptor):
        return _BucketValue(self)

    def timer_service(self):
        return self

    def current_watermark(self):
        return self.flink.watermark

    def register_event_time_timer(self, ms):
        self.flink.gate_timers.add((ms, self.key))


def _scenario(restore: bool) -> WatchedFlink:
    """``a`` from the start; the watermark passes 65.5 s (steps 1..6 closed); (a restore); the first
    event of ``c`` at 15 s (step 2: late), one at 65 s (step 7); the watermark to 100 s, then the end."""
    flink = GatedFlink(_params())
    flink.element("a", 5.0, [0.5])
    flink.element("a", 15.0, [0.5])
    flink.advance(_ms(65.5))
    if restore:
        flink.restore()
    flink.element("c", 15.0, [0.5])
    flink.element("c", 65.0, [0.25])
    flink.advance(_ms(100))
    flink.advance(END)
    return flink


def _check(flink: WatchedFlink) -> None:
    steps = {s: sorted(r["step"] for r in flink.releases if r["stream"] == s) for s in ("a", "c")}
    assert steps == {"a": list(range(1, 17)), "c": list(range(7, 17))}
    assert [(d["reason"], d["stream"]) for d in flink.dead] == [("late", "c")]
    assert flink.behind == []


def test_a_late_first_event_is_dead_lettered_and_nothing_is_released_behind_the_watermark():
    _check(_scenario(restore=False))


def test_the_same_after_a_restore():
    _check(_scenario(restore=True))
