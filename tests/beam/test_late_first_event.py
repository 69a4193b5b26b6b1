"""A new stream whose first event is late, on Beam streaming (TestStream): the event is dead-lettered
and no release of any stream is behind the watermark, keyed by stream and by groups of streams, in
this process and on a fresh worker (a NEW process: no history in memory).

The release stage is the streaming one: :class:`~beam_dp.beam.shell.dofn.WatermarkGate`, then the
stateful shell ``gated``. "Behind the watermark" is Beam's own test: every release passes a
``GroupByKey`` in fixed windows whose last instant is its release time, so the runner drops a release
whose time the watermark had passed when it was emitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import FixedWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn, WatermarkGate
from beam_dp.beam.shell.parse import ParseEvents
from beam_dp.core import StepClock
from beam_dp.io import ReleaseColumns
from beam_dp.steps.events import DEAD_LETTER
from beam_dp.steps.params import NoiseKey
from tests.beam.helpers import streaming_options
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline
ROOT = Path(__file__).parents[2]
CLOCK = StepClock(start=0.0, period=10.0)  # open: no public end
SEEN: dict[str, list] = {}


def _release(item, timestamp=beam.DoFn.TimestampParam):
    rows = item.rows() if isinstance(item, ReleaseColumns) else [item]
    SEEN.setdefault("releases", []).extend([row.stream, row.step, timestamp.micros] for row in rows)


def _on_time(keyed):
    SEEN.setdefault("on_time", []).extend(keyed[1])


def _dead(letter):
    SEEN.setdefault("dead", []).append([letter.reason, letter.stream, list(letter.element or ())[:2]])


def run(groups: int | None) -> dict:
    """The scenario: stream ``a`` from the start; the watermark passes 65.5 s (steps 1..6 closed, one
    step at a time: the DirectRunner's timers hold no watermark, so a jump would leave even a known
    stream's catching-up releases behind it); then the first event of ``c`` at 15 s (step 2: late)
    and one at 65 s (step 7); the watermark to 100 s (steps 7..10 closed), then to +infinity (the end
    rule: through step 16)."""
    SEEN.clear()
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, stream_groups=groups,
                                noise_key=NoiseKey(domain="late-first-event"))
    stream = TestStream().add_elements([TimestampedValue(e, e[1]) for e in (("a", 5.0, [0.5]), ("a", 15.0, [0.5]))])
    for seconds in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 65.5):
        stream = stream.advance_watermark_to(seconds)
    stream = (stream.add_elements([TimestampedValue(("c", 15.0, [0.5]), 15.0)])
              .add_elements([TimestampedValue(("c", 65.0, [0.25]), 65.0)]))
    for seconds in (70.0, 80.0, 90.0, 100.0):
        stream = stream.advance_watermark_to(seconds)
    stream = stream.advance_watermark_to_infinity()
    grace = round(params.allowed_lateness * 1_000_000)
    last_instant = Timestamp(micros=(CLOCK.start_micros + grace) % CLOCK.period_micros + 1)  # a window ends at a release time
    with beam.Pipeline(options=streaming_options()) as p:
        parsed = (p | stream | "Parse" >> beam.ParDo(ParseEvents(params, False)).with_outputs(DEAD_LETTER, main="blocks"))
        released = (parsed.blocks | "Gate" >> WatermarkGate(params)
                    | "Release" >> beam.ParDo(ContinualReleaseDoFn(params, per_step_timers=True, gated=True))
                    .with_outputs(DEAD_LETTER, main="rows"))
        released.rows | "Releases" >> beam.ParDo(_release)
        (released.rows | "Keys" >> beam.Map(lambda r: (0, [[row.stream, row.step] for row in
                                                          (r.rows() if isinstance(r, ReleaseColumns) else [r])]))
         | "Windows" >> beam.WindowInto(FixedWindows(CLOCK.period, last_instant))
         | "OnTime" >> beam.GroupByKey() | "Flat" >> beam.Map(lambda kv: (kv[0], [x for xs in kv[1] for x in xs]))
         | "Seen" >> beam.Map(_on_time))
        (parsed[DEAD_LETTER], released[DEAD_LETTER]) | beam.Flatten() | "Dead" >> beam.Map(_dead)
    return SEEN


def _check(seen: dict) -> None:
    releases = seen["releases"]
    steps = {s: sorted(step for stream, step, _ in releases if stream == s) for s in ("a", "c")}
    assert steps["a"] == list(range(1, 17))
    assert steps["c"] == list(range(7, 17))  # opened at the first step the watermark had not closed
    assert all(t == CLOCK.step_end_micros(step) for _, step, t in releases)  # each at its public time
    assert seen["dead"] == [["late", "c", ["c", 15.0]]]  # the late first event, dead-lettered whole
    # no release behind the watermark: every one closed at a finite watermark (steps 1..10) got through
    # the GroupByKey (releases of the +infinity round are past the end of every window for the runner)
    finite = sorted([stream, step] for stream, step, _ in releases if step <= 10)
    assert sorted(x for x in seen.get("on_time", []) if x[1] <= 10) == finite


@pytest.fixture(autouse=True)
def _deadline():
    """A ladder of timers that re-arms at +infinity would fire forever: fail instead of hanging."""
    def boom(*_):
        raise TimeoutError("the streaming pipeline did not end")
    previous = signal.signal(signal.SIGALRM, boom)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("groups", [None, 2], ids=["by-stream", "by-2-groups"])
def test_a_late_first_event_is_dead_lettered_and_nothing_is_released_behind_the_watermark(groups):
    _check(run(groups))


@pytest.mark.parametrize("groups", [0, 256], ids=["by-stream", "by-256-groups"])
def test_the_same_on_a_fresh_worker(groups):
    env = dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.beam.test_late_first_event", str(groups)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    _check(json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:]))


if __name__ == "__main__":
    # through the module's importable name: its functions are pickled by reference, so outputs land in its SEEN
    from tests.beam.test_late_first_event import run as run_here

    print("RESULT " + json.dumps(run_here(int(sys.argv[1]) or None)))
