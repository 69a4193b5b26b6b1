"""Streaming rules of the step driver on Beam (TestStream, BundleBasedDirectRunner): the grace,
a watermark at +infinity with an open clock, and a stream first seen after the watermark passed."""

from __future__ import annotations

import dataclasses
import signal

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import ContinualSum, ContinualSumParams, Reason
from beam_dp.core import StepClock
from beam_dp.mechanisms.replay import replay_event_time
from beam_dp.steps.schema import release_to_row
from tests.beam.helpers import domain_noise, labelled, reasons_are, rows_match, streaming_options

pytestmark = pytest.mark.pipeline

OPEN = StepClock(start=0.0, period=10.0)  # the documented streaming default: no public end


@pytest.fixture(autouse=True)
def _deadline():
    """An open clock at +infinity used to release steps forever: fail instead of hanging."""
    def boom(*_):
        raise TimeoutError("the streaming pipeline did not end")
    previous = signal.signal(signal.SIGALRM, boom)
    signal.alarm(180)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _expected(params, events, last_step, first_step=1):
    """Rows of the pure mechanism (built from ``params``: open clock) on ``events``, for steps
    ``first_step..last_step`` of the schedule (the mechanism's own steps ``1..``)."""
    mechanism = params.build_mechanism()
    offset = first_step - 1
    replay = StepClock(start=OPEN.start + offset * OPEN.period, period=OPEN.period,
                       end=OPEN.start + last_step * OPEN.period)
    by_stream = replay_event_time(mechanism, np.array([e[0] for e in events]), np.array([e[1] for e in events]),
                                  np.array([e[2] for e in events]), replay, domain_noise(params))
    return labelled([release_to_row(dataclasses.replace(r, step=r.step + offset), mechanism.guarantee,
                                    OPEN.step_start_micros(r.step + offset), OPEN.step_end_micros(r.step + offset))
                     for rels in by_stream.values() for r in rels], params)


_SEEN: dict[str, list] = {}


def _collect(item, kind: str) -> None:  # a module function: pickled by reference, so _SEEN is this module's
    _SEEN.setdefault(kind, []).append(item)


def _run(stream: TestStream, params, expected, reasons):
    """Runs to the end and checks every output. Outputs of the final (+infinity) timer round reach a
    ``Map`` but are behind the global window's end for a ``GroupByKey`` (``assert_that``) in the
    DirectRunner, so they are collected in this process instead."""
    _SEEN.clear()
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualSum(params)
        out.releases | "Releases" >> beam.Map(_collect, "releases")
        out.dead_letter | "Dead" >> beam.Map(_collect, "dead")
    rows_match(expected)(_SEEN.get("releases", []))
    reasons_are(reasons)(_SEEN.get("dead", []))


def _at(*events):
    return [TimestampedValue(e, e[1]) for e in events]


def test_data_within_the_grace_counts_and_later_data_is_dead_lettered():
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN, allowed_lateness=5.0)
    on_time = [("a", 1.0, [0.5]), ("a", 3.0, [0.25]), ("a", 12.0, [0.75])]
    stream = (TestStream().add_elements(_at(on_time[0], on_time[2]))
              .advance_watermark_to(12)           # past end(1) = 10 s, within its 5 s grace
              .add_elements(_at(on_time[1]))      # step 1, in the grace: counts
              .advance_watermark_to(16)           # step 1 closes (10 + 5 <= 16)
              .add_elements(_at(("a", 4.0, [9.0])))  # step 1 again: late, dead-lettered whole
              .advance_watermark_to(30)
              .advance_watermark_to_infinity())
    # steps 1-2 close by the grace; at the end step 3 began (20 s) before 30 s - grace = 25 s, step 4 did not
    _run(stream, params, _expected(params, on_time, 3), {Reason.LATE: 1})


def test_watermark_at_infinity_ends_an_open_clock_cleanly():
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    on_time = [("a", 5.0, [0.5]), ("a", 21.0, [0.5])]
    stream = (TestStream().add_elements(_at(*on_time, ("a", 95.0, [0.5])))  # step 10: never reached
              .advance_watermark_to(25)
              .advance_watermark_to_infinity())
    # released: steps 1-3 (3 began at 20 s < 25 s), nothing after; step 10's buffered data: unclosed
    _run(stream, params, _expected(params, on_time, 3), {Reason.UNCLOSED: 1})


def test_a_stream_first_seen_late_never_releases_behind_the_watermark():
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    a = [("a", 5.0, [0.5]), ("a", 15.0, [0.5])]
    late = [("late", 55.0, [0.5])]
    stream = (TestStream().add_elements(_at(*a))
              .advance_watermark_to(52)                          # closes steps 1..5
              .add_elements(_at(("late", 12.0, [1.0]), *late))  # step 2: late; step 6: its first release
              .advance_watermark_to(72)
              .advance_watermark_to_infinity())
    # "late" is first seen when steps 1..5 are closed: its releases are steps 6.. (its own steps 1..)
    expected = _expected(params, a, 8) + _expected(params, late, 8, first_step=6)
    assert sorted(r.step for r in expected if r.stream == "late") == [6, 7, 8]
    _run(stream, params, expected, {Reason.LATE: 1})
