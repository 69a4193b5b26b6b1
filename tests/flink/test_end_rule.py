"""The end rule and the first step of a stream on the Flink shell (scripted Flink: keyed state, timers
and watermark moved by the test), with and without a restore from a checkpoint before every timer
firing. The same input and watermarks as tests/beam/test_end_rule.py, and the same releases: through
``StepDriver.end_step`` of the first step the last finite watermark had not closed. Needs .venv-flink."""

from __future__ import annotations

import pytest

pytest.importorskip("pyflink")

from beam_dp.steps.driver import END_RUNG  # noqa: E402
from tests.flink.cases import assert_rows_equal  # noqa: E402
from tests.flink.test_shell_rules import END, OPEN, ScriptedFlink, _expected, _ms, _params  # noqa: E402

EVENTS = [(5.0, 0.5), (152.0, 0.25), (163.0, 1.0), (455.0, 0.75), (1995.0, 0.5)]  # as tests/beam/test_end_rule.py


class RestoredFlink(ScriptedFlink):
    """Restores from a checkpoint before every timer firing (state bytes and timers kept, watermark lost)."""

    def advance(self, ms):
        while due := sorted(t for t in self.timers if t[0] <= ms):
            self.restore()
            self.watermark = ms
            timer = due[0]
            self.timers.discard(timer)
            self.key = timer[1]
            self.firings += 1
            self._collect(self.function.on_timer(timer[0], self))
        self.watermark = ms


@pytest.mark.parametrize("provisional", [False, True], ids=["replay-open", "streaming-open"])
@pytest.mark.parametrize("restore", [False, True], ids=["clean", "restored"])
@pytest.mark.parametrize("watermark_s", [25, 155, 160, 455])
def test_the_end_releases_through_the_first_multiple_of_16_after_the_first_open_step(watermark_s, restore, provisional):
    flink = (RestoredFlink if restore else ScriptedFlink)(_params(), provisional)
    flink.advance(_ms(0.001))  # a finite watermark before the first event: both opening modes place "a" at step 1
    for seconds, value in EVENTS:
        flink.element("a", seconds, [value])
    flink.advance(_ms(watermark_s))
    flink.advance(END)
    first_open = int(watermark_s // OPEN.period) + 1  # exact ints
    last = (first_open // END_RUNG + 1) * END_RUNG
    released = [("a", s, [v]) for s, v in EVENTS if OPEN.step_of_micros(round(s * 1e6)) <= last]
    assert sorted(r["step"] for r in flink.releases) == list(range(1, last + 1))
    assert_rows_equal(flink.releases, _expected(released, last))
    assert [d["reason"] for d in flink.dead] == ["unclosed"] * (len(EVENTS) - len(released))


def test_a_stream_first_seen_after_a_restore_starts_at_its_first_open_step_not_step_1():
    """After a restore Flink's watermark is unknown until the next one arrives: a new stream seen then
    opens provisionally (as on Beam), at its first item's step, and its first timer fixes it; an item
    for an earlier step is then late. Without it the stream would open at step 1 and back-fill."""
    flink = ScriptedFlink(_params(), provisional=True)
    a = [("a", 5.0, [0.5]), ("a", 15.0, [0.5])]
    for event in a:
        flink.element(*event)
    flink.advance(_ms(52))          # closes steps 1..5
    flink.restore()                 # the watermark is unknown again
    late = [("late", 55.0, [0.5])]
    flink.element(*late[0])         # step 6: its first step
    flink.advance(_ms(62))          # its first timer: step 6 closes
    flink.element("late", 12.0, [1.0])  # step 2: late
    flink.advance(END)
    assert sorted(r["step"] for r in flink.releases if r["stream"] == "late") == list(range(6, 17))
    assert_rows_equal(flink.releases, _expected(a, 16) + _expected(late, 16, first_step=6))
    assert [d["reason"] for d in flink.dead] == ["late"]


def test_an_idle_stream_ends_a_busy_one_does_not_as_recomputed_from_the_rows():
    """The idle rule (tests/beam/idle_cases.py, the same case as on Beam): decided from released values
    by the shared driver, so the rows alone give the same decision; a restore before every firing keeps
    it (the recent releases are keyed state)."""
    import dataclasses
    import functools

    from beam_dp.mechanisms.sums.tree import make_tree_sum
    from tests.beam.idle_cases import (
        EPSILON,
        EVENTS,
        IDLE_STEPS,
        IDLE_THRESHOLD,
        PERIOD,
        STEPS,
        idle_end_from_rows,
        margin_holds,
    )

    build = functools.partial(make_tree_sum, horizon=None, unbounded="hybrid", dim=1, epsilon=EPSILON,
                              clip_bound=1.0, noise="gamma")
    assert margin_holds(build())
    params = dataclasses.replace(_params(), build=build, idle_steps=IDLE_STEPS, idle_threshold=IDLE_THRESHOLD)
    for flink in (ScriptedFlink(params), RestoredFlink(params)):
        for event in EVENTS:
            flink.element(*event)
        flink.advance(_ms(STEPS * PERIOD))
        flink.element("idle", STEPS * PERIOD + 1.0, [1.0])
        flink.advance(END)
        rows = {s: [(r["step"], r["value"]) for r in flink.releases if r["stream"] == s] for s in ("busy", "idle")}
        ended = idle_end_from_rows(rows["idle"])
        assert ended is not None and max(step for step, _ in rows["idle"]) == ended
        assert idle_end_from_rows(rows["busy"]) is None and len(rows["busy"]) > STEPS
        assert sorted((d["reason"], d["stream"]) for d in flink.dead) == [("stream_ended", "idle")] * 2


def test_a_declared_stream_releases_from_step_1_in_a_streaming_job_with_no_watermark_yet():
    """Declared streams start at step 1 (rule 3): the declaration fixes a provisional key there, so a
    declared stream without data releases steps 1.. like any other (the end rule: through step 16)."""
    import dataclasses

    from beam_dp.flink.job import DECLARE

    flink = ScriptedFlink(dataclasses.replace(_params(), streams=("a", "quiet")), provisional=True)
    flink.element("quiet", OPEN.start, DECLARE)
    flink.element("a", 25.0, [0.5])  # "a", not declared here, opens provisionally at its item's step (3)
    flink.advance(_ms(52))
    flink.advance(END)
    assert sorted(r["step"] for r in flink.releases if r["stream"] == "quiet") == list(range(1, 17))
    assert sorted(r["step"] for r in flink.releases if r["stream"] == "a") == list(range(3, 17))
