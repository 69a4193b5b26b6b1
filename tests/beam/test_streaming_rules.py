"""Streaming rules of the step driver on Beam (TestStream, BundleBasedDirectRunner): the grace,
a watermark at +infinity with an open clock, a stream first seen after the watermark passed, and a
watermark jump closed by the ladder of close timers.

The end rule (``StepDriver.end_step``, the same on Flink): at +infinity a key releases through the
first multiple of 16 after the first step the last finite watermark had not closed.

Every rule is checked keyed by stream and keyed by groups of streams (``stream_groups``): the
releases must be the same."""

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
from beam_dp.io import ReleaseColumns
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
    _SEEN.setdefault(kind, []).extend(item.rows() if isinstance(item, ReleaseColumns) else [item])


@pytest.fixture(params=[None, 2], ids=["by-stream", "by-2-groups"])
def groups(request):
    return request.param


def _run(stream: TestStream, params, expected, reasons, groups=None):
    """Runs to the end (keyed by stream, or by ``groups`` groups of streams) and checks every output.
    Outputs of the final (+infinity) timer round reach a ``Map`` but are behind the global window's
    end for a ``GroupByKey`` (``assert_that``) in the DirectRunner, so they are collected in this
    process instead."""
    _SEEN.clear()
    params = dataclasses.replace(params, stream_groups=groups)
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualSum(params)
        out.releases | "Releases" >> beam.Map(_collect, "releases")
        out.dead_letter | "Dead" >> beam.Map(_collect, "dead")
    rows_match(expected)(_SEEN.get("releases", []))
    reasons_are(reasons)(_SEEN.get("dead", []))


def _at(*events):
    return [TimestampedValue(e, e[1]) for e in events]


def test_data_within_the_grace_counts_and_later_data_is_dead_lettered(groups):
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN, allowed_lateness=5.0)
    on_time = [("a", 1.0, [0.5]), ("a", 3.0, [0.25]), ("a", 12.0, [0.75])]
    stream = (TestStream().add_elements(_at(on_time[0], on_time[2]))
              .advance_watermark_to(12)           # past end(1) = 10 s, within its 5 s grace
              .add_elements(_at(on_time[1]))      # step 1, in the grace: counts
              .advance_watermark_to(16)           # step 1 closes (10 + 5 <= 16)
              .add_elements(_at(("a", 4.0, [9.0])))  # step 1 again: late, dead-lettered whole
              .advance_watermark_to(30)
              .advance_watermark_to_infinity())
    # steps 1-2 close by the grace (step 3 ends at 30 s + 5 s grace > 30 s); at the end the first open
    # step is 3: through step 16
    _run(stream, params, _expected(params, on_time, 16), {Reason.LATE: 1}, groups)


def test_watermark_at_infinity_ends_an_open_clock_cleanly(groups):
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    on_time = [("a", 5.0, [0.5]), ("a", 21.0, [0.5]), ("a", 95.0, [0.5])]
    stream = (TestStream().add_elements(_at(*on_time, ("a", 175.0, [0.5])))  # step 18: never reached
              .advance_watermark_to(25)
              .advance_watermark_to_infinity())
    # steps 1-2 closed by the watermark; at the end steps 3..16 (the end rule), nothing after;
    # step 18's buffered data: unclosed
    _run(stream, params, _expected(params, on_time, 16), {Reason.UNCLOSED: 1}, groups)


def test_the_end_rule_holds_when_the_first_open_step_is_a_multiple_of_16(groups):
    """The watermark stops inside step 16: its three rungs sit on step 16 and fire (in timestamp order)
    before ``end``; the end rule releases through step 32 (tests/beam/test_end_rule.py: ``end`` first
    too), and step 33's data is unclosed."""
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    on_time = [("a", 5.0, [0.5]), ("a", 152.0, [0.25]), ("a", 315.0, [1.0])]
    stream = (TestStream().add_elements(_at(*on_time, ("a", 325.0, [0.5])))  # step 33: beyond the rule
              .advance_watermark_to(155)
              .advance_watermark_to_infinity())
    _run(stream, params, _expected(params, on_time, 32), {Reason.UNCLOSED: 1}, groups)


def test_a_stream_first_seen_late_never_releases_behind_the_watermark(groups):
    """A new stream opens at the lowest step of the items it gets before its first close timer fires
    (keyed state and timers only: no worker memory); an item for a step before that is late."""
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    a = [("a", 5.0, [0.5]), ("a", 15.0, [0.5])]
    late = [("late", 61.0, [0.5]), ("late", 55.0, [0.25])]
    stream = (TestStream().add_elements(_at(*a))
              .advance_watermark_to(52)                          # closes steps 1..5
              .add_elements(_at(*late))                          # steps 7 then 6: "late" opens at step 6
              .advance_watermark_to(62)                          # its first firing closes step 6
              .add_elements(_at(("late", 12.0, [1.0]), ("late", 58.0, [1.0])))  # steps 2 and 6: late
              .advance_watermark_to(72)
              .advance_watermark_to_infinity())
    # "late"'s releases are steps 6.. (its own steps 1..), through step 16 at the end (the end rule)
    expected = _expected(params, a, 16) + _expected(params, late, 16, first_step=6)
    assert sorted(r.step for r in expected if r.stream == "late") == list(range(6, 17))
    _run(stream, params, expected, {Reason.LATE: 2}, groups)


def test_a_watermark_jump_closes_every_passed_step_in_few_firing_rounds(groups):
    """A jump of 100 steps closes steps 1..100 in order, each once, through the rungs (1, 4, 16)."""
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=OPEN)
    events = [("a", 5.0, [0.5]), ("a", 505.0, [0.25]), ("a", 995.0, [1.0])]
    stream = (TestStream().add_elements(_at(*events))
              .advance_watermark_to(1000.0)  # closes steps 1..100 (step 100 ends at 1,000 s)
              .add_elements(_at(("a", 999.0, [1.0])))  # step 100: closed, late
              .advance_watermark_to_infinity())
    # at the end: through step 112, the first multiple of 16 at or after step 101
    _run(stream, params, _expected(params, events, 112), {Reason.LATE: 1}, groups)
