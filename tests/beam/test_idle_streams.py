"""The idle rule (``idle_steps``, ``idle_threshold``) on Beam streaming: an idle open-clock stream ends
by rule 6, a busy one does not, and the decision equals the one recomputed from the release rows alone
(tests/beam/idle_cases.py); params that have no such rule are refused."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import ContinualSum, ContinualSumParams, Reason
from beam_dp.core import StepClock
from tests.beam.helpers import streaming_options
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

OPEN = StepClock(start=0.0, period=PERIOD)
_SEEN: dict[str, list] = {}


def _collect(item, kind: str) -> None:  # a module function: pickled by reference
    _SEEN.setdefault(kind, []).append(item)


def _params(**kwargs):
    return ContinualSumParams(**{**dict(dim=1, epsilon=EPSILON, clip_bound=1.0, clock=OPEN, idle_steps=IDLE_STEPS,
                                        idle_threshold=IDLE_THRESHOLD), **kwargs})


@pytest.mark.pipeline
def test_an_idle_stream_ends_a_busy_one_does_not_and_the_rows_alone_give_the_same_decision():
    params = _params()
    assert margin_holds(params.build_mechanism())
    _SEEN.clear()
    stream = (TestStream().add_elements([TimestampedValue(e, e[1]) for e in EVENTS])
              .advance_watermark_to(STEPS * PERIOD)
              .add_elements([TimestampedValue(("idle", STEPS * PERIOD + 1.0, [1.0]), STEPS * PERIOD + 1.0)])
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualSum(params)
        out.releases | "Releases" >> beam.Map(_collect, "releases")
        out.dead_letter | "Dead" >> beam.Map(_collect, "dead")
    rows = {s: [(r.step, r.value) for r in _SEEN["releases"] if r.stream == s] for s in ("busy", "idle")}
    ended = idle_end_from_rows(rows["idle"])
    assert ended is not None and ended >= IDLE_STEPS
    assert max(step for step, _ in rows["idle"]) == ended  # nothing released after the idle end
    assert idle_end_from_rows(rows["busy"]) is None and len(rows["busy"]) > STEPS  # busy runs to the end rule
    dead = sorted((d.reason, d.stream) for d in _SEEN["dead"])
    # one stream_ended when it went idle, one for its item after that (its element kept)
    assert dead == [(Reason.STREAM_ENDED, "idle"), (Reason.STREAM_ENDED, "idle")]


@pytest.mark.parametrize("kwargs,why", [
    (dict(idle_threshold=None), "both"),
    (dict(stream_groups=4), "key by stream"),
    (dict(idle_steps=0), "idle_steps"),
    (dict(idle_threshold=-1.0), "idle_threshold"),
])
def test_idle_params_that_have_no_rule_are_refused(kwargs, why):
    with pytest.raises(ValueError, match=why):
        _params(**kwargs)


def test_a_windowed_sum_has_the_rule_its_releases_are_prefix_sums_too():
    from beam_dp.beam import WindowedSumParams

    params = WindowedSumParams(dim=1, window=4, clock=OPEN, idle_steps=3, idle_threshold=0.5)
    assert (params.idle_steps, params.idle_threshold) == (3, 0.5)
    with pytest.raises(ValueError, match="key by stream"):
        WindowedSumParams(dim=1, window=4, clock=OPEN, idle_steps=3, idle_threshold=0.5, stream_groups=2)


def test_a_batch_clock_free_schedule_is_refused():
    with pytest.raises(ValueError, match="clock"):
        ContinualSumParams(dim=1, block_size=4, idle_steps=2, idle_threshold=1.0)
