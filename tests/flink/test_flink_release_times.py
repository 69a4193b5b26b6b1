"""Flink release records carry the public release time ``end(step) + allowed_lateness`` (ms) as their
record timestamp, whichever firing closed the step (one step at a time, a catch-up over many steps, the
end of input), and Flink watermarks still flow: a downstream event-time tumbling window per step (offset
``(start + g) % period``, docs/running.md#windowing-releases) keeps every release, alone in its step's
window. A MiniCluster streaming job; the pauses in the source let periodic watermarks fall between the
events. Needs .venv-flink (``make flink-test``)."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from pyflink.common import Time, Types  # noqa: E402
from pyflink.datastream.functions import ProcessFunction, ProcessWindowFunction  # noqa: E402
from pyflink.datastream.window import TumblingEventTimeWindows  # noqa: E402

from beam_dp.core import StepClock  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream, to_event  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402
from beam_dp.steps.driver import END_RUNG  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLOCK = StepClock(start=1000.0, period=10.0)  # open: the end of input applies the end rule
GRACE = 5.0
BUILD = functools.partial(make_tree_sum, horizon=None, unbounded="hybrid", dim=1, epsilon=1.0, clip_bound=1.0)
PAUSE = "pause"  # a source record the pacing map holds back, then drops
#: steps 1..2 one firing at a time, a pause, a jump to step 51 (one firing closes steps 2..50), a pause,
#: the end of input (the end rule: through step 64)
EVENTS = [("a", 1001.0, [0.5]), ("b", 1007.0, [0.25]), ("a", 1012.0, [1.0]), ("b", 1016.0, [0.5]),
          (PAUSE, 1016.0, None), ("a", 1505.0, [1.0]), (PAUSE, 1505.0, None)]


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _paced(event):
    if event[0] == PAUSE:
        time.sleep(3.0)  # several watermark intervals (200 ms) and Python bundles (1 s) pass
    return event


class _Stamp(ProcessFunction):
    def process_element(self, value, ctx):
        row = json.loads(value)
        yield json.dumps(["release", row["stream"], row["step"], ctx.timestamp(),
                          ctx.timer_service().current_watermark()])


class _PerStep(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield json.dumps(["window", key, context.window().start, sorted(json.loads(e)["step"] for e in elements)])


def _release_ms(step: int) -> int:
    return (CLOCK.step_end_micros(step) + round(GRACE * 1_000_000)) // 1000


def test_release_records_carry_the_step_release_time_after_a_catch_up_and_the_end_of_input():
    # one source split, one record per Python bundle: a pause holds the watermark where the input is
    env = local_environment(parallelism=1, replay=False, settings={"python.fn-execution.bundle.size": "1"})
    events = (env.from_collection([to_event(*e) for e in EVENTS], type_info=EVENT_TYPE)
              .map(_paced, output_type=EVENT_TYPE).filter(lambda e: e[0] != PAUSE))
    params = FlinkReleaseParams(build=BUILD, clock=CLOCK, allowed_lateness=GRACE, streams=("a", "b"))
    releases, dead = release_stream(env, events, params, uid="release-times")
    period_ms, offset_ms = round(CLOCK.period * 1000), round((CLOCK.start + GRACE) % CLOCK.period * 1000)
    windows = (releases.key_by(lambda j: json.loads(j)["stream"], key_type=Types.STRING())
               .window(TumblingEventTimeWindows.of(Time.milliseconds(period_ms), Time.milliseconds(offset_ms)))
               .process(_PerStep(), output_type=Types.STRING()))
    letters = dead.map(lambda j: json.dumps(["dead", j]), output_type=Types.STRING())
    stamps = releases.process(_Stamp(), output_type=Types.STRING())
    with stamps.union(windows, letters).execute_and_collect() as results:
        outputs = [json.loads(r) for r in results]
    stamped = sorted(tuple(o[1:]) for o in outputs if o[0] == "release")
    per_window = sorted(tuple(o[1:3]) + (o[3],) for o in outputs if o[0] == "window")

    # the end rule: the last finite watermark (<= 1505 s) left step 51 open: through step 64 per stream
    assert sorted((s, step) for s, step, _, _ in stamped) == [(s, step) for s in "ab" for step in range(1, 65)]
    assert 64 == (51 // END_RUNG + 1) * END_RUNG
    assert [ts for _, _, ts, _ in stamped] == [_release_ms(step) for _, step, _, _ in stamped]
    # each release reached downstream before a watermark passed its time (not late), the catch-up's
    # (steps 2..50, or 1..50, in one firing) and the end of input's (51..64) alike; finite watermarks
    # flowed through (at least the last one, 1505 s, before the end of input's releases)
    assert all(watermark < ts for _, _, ts, watermark in stamped)
    assert any(-2 ** 63 < watermark for _, step, _, watermark in stamped if step > 50)
    # a window per step keeps every release, alone: one per (stream, window), the window of its step
    assert per_window == [(s, _release_ms(step), [step]) for s, step, _, _ in stamped]
    assert [o for o in outputs if o[0] == "dead"] == []
