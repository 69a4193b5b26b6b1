"""Release timestamps are a public function of the step: ``end(step) + allowed_lateness``, whichever
timer (a ladder rung after a watermark jump, the grace, the end of input) closed the step; so the
documented downstream windowing (docs/running.md#windowing-releases) puts each release alone in its
step's window and, with a window lateness covering the watermark jump, keeps every release a finite
watermark closed. (The DirectRunner holds no output watermark for pending timers, so after a jump
the releases are behind the downstream watermark by up to the jump; releases of the final round at
+infinity reach per-element sinks only.)"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.trigger import AccumulationMode, AfterCount, AfterWatermark
from apache_beam.transforms.window import FixedWindows, TimestampedValue
from apache_beam.utils.timestamp import Duration

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.core import StepClock
from beam_dp.io import ReleaseColumns
from tests.beam.helpers import streaming_options

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0)
SEEN: dict[str, list] = {}


def _stamp(item, timestamp=beam.DoFn.TimestampParam):
    rows = item.rows() if isinstance(item, ReleaseColumns) else [item]
    SEEN.setdefault("stamped", []).extend((row.stream, row.step, timestamp.micros) for row in rows)
    return [(row.stream, row.step) for row in rows]


def _window(keyed, window=beam.DoFn.WindowParam):
    stream, steps = keyed
    SEEN.setdefault("windows", []).append((stream, window.start.micros, sorted(steps)))


@pytest.mark.parametrize("grace,groups,closed", [(0.0, None, 100), (5.0, None, 99), (5.0, 3, 99)],
                         ids=["no-grace", "grace-5s", "grace-5s-by-3-groups"])
def test_downstream_fixed_windows_keep_every_release_after_a_catch_up(grace, groups, closed):
    SEEN.clear()
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, allowed_lateness=grace,
                                stream_groups=groups)
    events = [("a", 5.0, [0.5]), ("b", 7.0, [0.25]), ("a", 505.0, [1.0]), ("b", 995.0, [0.5])]
    stream = (TestStream().add_elements([TimestampedValue(e, e[1]) for e in events])
              .advance_watermark_to(25.0)       # closes step 1 (and step 2 without grace) one at a time
              .advance_watermark_to(1000.0)     # a jump: the ladder closes the rest in a few rounds
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        releases = p | stream | ContinualSum(params)
        (releases.releases
         | "Stamp" >> beam.FlatMap(_stamp)
         # the documented windowing: one window per step, [end(s) + g, end(s + 1) + g), late panes
         # kept for the largest watermark jump (990 s here)
         | "Window" >> beam.WindowInto(FixedWindows(CLOCK.period, offset=(CLOCK.start + grace) % CLOCK.period),
                                       trigger=AfterWatermark(late=AfterCount(1)), allowed_lateness=Duration(2000),
                                       accumulation_mode=AccumulationMode.DISCARDING)
         | "GroupByStream" >> beam.GroupByKey()
         | "Windows" >> beam.Map(_window))
    stamped = sorted(SEEN["stamped"])
    g = round(grace * 1_000_000)
    assert [t for _, _, t in stamped] == [CLOCK.step_end_micros(s) + g for _, s, _ in stamped]
    # W_last = 1000 s: the exact rule releases through step 100 (- 1 with the grace); Beam through the
    # furthest rung, step 112 (the first multiple of 16 at or after the first open step)
    assert sorted({s for _, s, _ in stamped}) == list(range(1, 113))
    # every release a finite watermark closed (steps 1..100, or 1..99 with the 5 s grace: end + 5 s <=
    # 1000 s) is kept, alone in its step's window, once
    windows = sorted(SEEN["windows"])
    assert windows == sorted((stream, CLOCK.step_end_micros(step) + g, [step])
                             for stream, step, _ in stamped if step <= closed)
