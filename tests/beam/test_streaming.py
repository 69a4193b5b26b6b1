"""Streaming tests with TestStream (BundleBasedDirectRunner): watermarks close steps, empty steps
release, late data is dead-lettered, and releases equal the pure mechanism on the on-time events."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import ContinualSum, ContinualSumParams, Reason, WindowedSum, WindowedSumParams
from beam_dp.core import StepClock
from tests.beam.helpers import expected_rows, reasons_are, rows_match, streaming_options

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=100.0)  # 10 steps


def _stream(on_time_batches, late):
    """TestStream: batches of (stream, ts, value) separated by watermark moves, then late events."""
    ts = TestStream()
    for watermark, events in on_time_batches:
        ts = ts.add_elements([TimestampedValue(e, e[1]) for e in events])
        ts = ts.advance_watermark_to(watermark)
    ts = ts.add_elements([TimestampedValue(e, e[1]) for e in late])
    return ts.advance_watermark_to(CLOCK.end + 1).advance_watermark_to_infinity()


def _batches():
    rng = np.random.default_rng(11)
    batches, flat = [], []
    lo = 0.0
    for w in (20, 35, 60, 100):  # steps 4-5 (30..50) get no data for stream "b"; step 6 (50..60) none at all
        events = [(s, float(t), [float(v)]) for s, t, v in zip(
            rng.choice(["a", "b"], 15), lo + rng.random(15) * (w - lo), rng.normal(0, 2, 15))
            if not (50 <= t < 60) and not (s == "b" and 30 <= t < 50)]
        batches.append((w, events))
        lo = float(w)
        flat.extend(events)
    return batches, flat


@pytest.mark.parametrize("kind", ["sum", "windowed"])
def test_streaming_releases_every_step_and_dead_letters_late_data(kind):
    batches, on_time = _batches()
    late = [("a", 12.0, [5.0]), ("b", 31.0, [5.0])]  # steps 2 and 4, closed by watermarks 20 / 35..60
    if kind == "sum":
        params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK)
        transform = ContinualSum(params)
    else:
        params = WindowedSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, window=4)
        transform = WindowedSum(params)
    ids = [e[0] for e in on_time]
    expected = expected_rows(params, ids, [e[1] for e in on_time], [e[2] for e in on_time])
    assert len(expected) == 2 * 10
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | _stream(batches, late) | transform
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, reasons_are({Reason.LATE: 2}), label="late")


def test_streaming_declared_stream_without_data_still_releases():
    batches, on_time = _batches()
    on_time = [e for e in on_time if e[0] == "a"]
    batches = [(w, [e for e in evs if e[0] == "a"]) for w, evs in batches]
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, streams=("a", "silent"))
    expected = expected_rows(params, [e[0] for e in on_time], [e[1] for e in on_time], [e[2] for e in on_time],
                             streams=("a", "silent"))
    assert {r.stream for r in expected} == {"a", "silent"}
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | _stream(batches, []) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected))
