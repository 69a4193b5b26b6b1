"""Growing databases fed in blocks, streaming (TestStream): late elements that arrive in one bundle form
one block, and the block's ``late`` dead letter still leaves as one letter per element, each with its element."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import BeamAssertException, assert_that
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import Reason
from beam_dp.beam.growing_db import GrowingDatabaseParams, GrowingDatabaseQueries
from beam_dp.core import StepClock
from beam_dp.mechanisms.growing_db.universe import Categorical, Universe
from tests.beam.helpers import streaming_options

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=50.0)  # 5 steps
ON_TIME = [("a", 2.0, "x"), ("a", 15.0, "y"), ("a", 25.0, "x")]
LATE = [("a", 3.0, "y"), ("a", 6.0, "x")]  # step 1, after the watermark passed 30: in one bundle


def test_a_late_block_is_dead_lettered_one_element_at_a_time():
    params = GrowingDatabaseParams(universe=Universe([Categorical("c", ("x", "y"))]), n=1, epsilon=1.0, clock=CLOCK)
    events = (TestStream()
              .add_elements([TimestampedValue(e, e[1]) for e in ON_TIME]).advance_watermark_to(30.0)
              .add_elements([TimestampedValue(e, e[1]) for e in LATE])
              .advance_watermark_to(CLOCK.end + 1).advance_watermark_to_infinity())

    def check(letters):
        got = sorted((x.reason, x.element) for x in letters)
        if got != [(Reason.LATE, e) for e in sorted(LATE)]:
            raise BeamAssertException(f"dead letters {got}")

    with beam.Pipeline(options=streaming_options()) as p:
        out = {"elements": p | "E" >> events,
               "queries": p | "Q" >> beam.Create([("a", "q", 2, [1.0, 0.0])])} | GrowingDatabaseQueries(params)
        assert_that(out.dead_letter, check)
