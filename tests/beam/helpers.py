"""Shared helpers of the pipeline tests: run on the FnApiRunner, collect outputs, compare to the pure mechanism."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.beam.sums import _UnitCountSumParams
from beam_dp.core import NoiseSource
from beam_dp.core.budget import composition_of
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.io import ReleaseColumns, release_to_row
from beam_dp.io.schema import ReleaseLabels
from beam_dp.mechanisms.replay import replay_event_time
from tests.conftest import TEST_KEY


def batch_options() -> PipelineOptions:
    options = PipelineOptions([])
    options.view_as(StandardOptions).runner = "FnApiRunner"
    return options


def streaming_options() -> PipelineOptions:
    options = PipelineOptions([])
    options.view_as(StandardOptions).streaming = True
    return options


# the noise domain a transform applied with its default label binds (its full label in the test pipeline)
DEFAULT_DOMAINS = {ContinualSumParams: "ContinualSum", WindowedSumParams: "WindowedSum",
                   ContinualCountParams: "ContinualCount/Sum",
                   _UnitCountSumParams: "ContinualCount/Sum"}  # ContinualCountParams.as_sum_params()


def domain_of(params, domain: str | None = None) -> str:
    return domain or params.noise_key.domain or DEFAULT_DOMAINS[type(params)]


def bound_params(params):
    """The params a transform's workers draw under (a count's are its unit sum's)."""
    return params.as_sum_params() if isinstance(params, ContinualCountParams) else params


def domain_noise(params, domain: str | None = None) -> NoiseSource:
    """The test key's noise source in the transform's noise domain, bound to its calibration."""
    return NoiseSource(TEST_KEY).for_domain(domain_of(params, domain), calibration_binding(bound_params(params)))


def labelled(rows, params, domain: str | None = None) -> list:
    """Rows as the transform stamps them (noise domain, composition, budget)."""
    labels = ReleaseLabels(domain_of(params, domain), composition_of(params.build_mechanism()), params.budget)
    return [labels(row) for row in rows]


def expected_rows(params, stream_ids, timestamps, values, streams=None, domain=None):
    """Rows the pure mechanism releases on the same events with the test key, in the transform's noise
    domain (``domain``, else the params' explicit one, else the transform's default label)."""
    mechanism = params.build_mechanism()
    clock = params.clock
    domain = domain_of(params, domain)
    by_stream = replay_event_time(mechanism, np.asarray(stream_ids), np.asarray(timestamps, dtype=float),
                                  np.asarray(values, dtype=float).reshape(len(stream_ids), mechanism.dim),
                                  clock, domain_noise(params, domain), streams)
    labels = ReleaseLabels(domain, composition_of(mechanism), params.budget)
    return [
        labels(release_to_row(r, mechanism.guarantee, clock.step_start_micros(r.step), clock.step_end_micros(r.step)))
        for rels in by_stream.values() for r in rels
    ]


def rows_match(expected, rel_tol=1e-9):
    """A matcher for ``assert_that``: same (stream, step) set, values equal within ``rel_tol``, all else exact
    (release rows, or the ``ReleaseColumns`` of a transform keyed by stream groups)."""
    expected = sorted(expected, key=lambda r: (r.stream, r.step))

    def check(actual):
        actual = [row for item in actual for row in (item.rows() if isinstance(item, ReleaseColumns) else [item])]
        actual = sorted(actual, key=lambda r: (r.stream, r.step))
        if [(r.stream, r.step) for r in actual] != [(r.stream, r.step) for r in expected]:
            raise BeamAssertException(
                f"release keys differ: got {[(r.stream, r.step) for r in actual][:20]}..., "
                f"want {[(r.stream, r.step) for r in expected][:20]}... ({len(actual)} vs {len(expected)})")
        for a, e in zip(actual, expected):
            if not np.allclose(a.value, e.value, rtol=rel_tol, atol=rel_tol):
                raise BeamAssertException(f"value differs at {(a.stream, a.step)}: {a.value} vs {e.value}")
            if a._replace(value=e.value) != e:
                raise BeamAssertException(f"row differs at {(a.stream, a.step)}:\n{a}\n{e}")

    return check


def reasons_are(expected_counts: dict):
    def check(actual):
        counts = {}
        for letter in actual:
            counts[letter.reason] = counts.get(letter.reason, 0) + 1
        if counts != expected_counts:
            raise BeamAssertException(f"dead-letter reasons {counts} != {expected_counts}")

    return check


def run_and_check(build, label=None):
    """``build(pipeline)`` adds transforms and assertions; runs on the FnApiRunner."""
    with beam.Pipeline(options=batch_options()) as pipeline:
        build(pipeline)


__all__ = ["assert_that", "batch_options", "domain_noise", "domain_of", "expected_rows", "labelled", "reasons_are", "rows_match", "run_and_check",
           "streaming_options"]
