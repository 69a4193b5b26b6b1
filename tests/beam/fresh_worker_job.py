"""Run by ``test_fresh_worker.py`` in a NEW Python process (a fresh worker: no history in memory).

``python -m tests.beam.fresh_worker_job GROUPS``: the watermark passes 65.5 s before any element;
stream ``c`` then sends an event at 65 s (step 7, open) and, after the watermark passed 80 s, one at
30 s (step 4, closed). Prints one JSON object: the releases ``[stream, step, timestamp µs]`` and the
dead-letter reasons."""

from __future__ import annotations

import json
import sys

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.core import StepClock
from beam_dp.io import ReleaseColumns
from beam_dp.steps.params import NoiseKey
from tests.beam.helpers import streaming_options

SEEN: dict[str, list] = {}


def _release(item, timestamp=beam.DoFn.TimestampParam):
    rows = item.rows() if isinstance(item, ReleaseColumns) else [item]
    SEEN.setdefault("releases", []).extend([row.stream, row.step, timestamp.micros] for row in rows)


def _dead(letter):
    SEEN.setdefault("dead", []).append(letter.reason)


def main(groups: int | None) -> dict:
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=StepClock(start=0.0, period=10.0),
                                stream_groups=groups, noise_key=NoiseKey(domain="fresh"))
    stream = (TestStream().advance_watermark_to(65.5)
              .add_elements([TimestampedValue(("c", 65.0, [0.5]), 65.0)])
              .advance_watermark_to(80.0)
              .add_elements([TimestampedValue(("c", 30.0, [0.5]), 30.0)])
              .advance_watermark_to(100.0)
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualSum(params)
        out.releases | "Releases" >> beam.Map(_release)
        out.dead_letter | "Dead" >> beam.Map(_dead)
    return SEEN


if __name__ == "__main__":
    # run through the module's importable name: its functions are then pickled by reference, so the
    # outputs land in that module's SEEN (functions of __main__ would be pickled by value)
    from tests.beam.fresh_worker_job import main as run

    print("RESULT " + json.dumps(run(int(sys.argv[1]) or None)))
