"""Streaming (TestStream on the BundleBasedDirectRunner): count steps of the ERM transforms close
as elements arrive across bundles, releases come from ``process()`` (no timers needed), state
persists between bundles, and the snapshots equal the pure mechanism's under the same key."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam.erm import ContinualModelParams, ContinualModelRelease
from tests.beam.helpers import assert_that, reasons_are, rows_match, streaming_options
from tests.mechanisms.erm.test_pipeline import COMMON, expected, make_events

pytestmark = pytest.mark.pipeline


def test_continual_model_release_streaming_equals_pure_mechanism():
    params = ContinualModelParams(update=2, base=4, **COMMON)
    events, data = make_events(11)  # 5 count steps per stream, one trailing element never used
    _, want = expected(params, data, "ContinualModelRelease")  # applied with its default label
    assert [r.step for r in want if r.stream == "s1"] == [2, 3, 4, 5]  # releases from t = B = 4
    # One element per bundle, watermark moved between them: the order within each stream is the
    # arrival order (what the pure mechanism sees) and every step spans several bundles.
    stream = TestStream()
    for i, event in enumerate(events):
        stream = stream.add_elements([TimestampedValue(event, i)]).advance_watermark_to(i + 1)
        if i == 4:  # a bad element mid-stream goes to the dead letters and does not count
            stream = stream.add_elements([TimestampedValue(("s1", [np.nan, 0.0, 0.0], "a"), i)])
    stream = stream.advance_watermark_to(len(events) + 10).advance_watermark_to_infinity()
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualModelRelease(params)
        assert_that(out.releases, rows_match(want), label="releases")
        assert_that(out.dead_letter, reasons_are({"non_finite": 1}), label="dead")
