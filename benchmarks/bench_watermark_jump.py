"""Benchmark: a streaming run (TestStream, BundleBasedDirectRunner) whose watermark jumps 1,000 steps.

Run by hand (not a test), with the beam_dp to measure on PYTHONPATH:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_watermark_jump.py [--steps 1000] [--streams 4] [--repeats 3]

Events for ``--streams`` streams land in step 1 of a clock of ``--steps`` steps (public end, so the
base commit's per-step timers also stop); the watermark then jumps to the end in one move and on to
+infinity (``--steady``: it moves one step at a time, the cost of the extra ladder firings). Every stream releases every step. Prints the best wall time of ``--repeats`` runs and the
release count. Works on the base commit (66fafec) and after the step driver.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.core import StepClock


def _count(row, path: str) -> None:
    with open(path, "a") as f:  # the DirectRunner runs in this process: a local tally file
        f.write("1\n")


def run(steps: int, streams: int, steady: bool = False) -> tuple[float, int]:
    clock = StepClock(start=0.0, period=10.0, end=10.0 * steps)
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=clock)
    events = [TimestampedValue((f"s{i}", 1.0 + j, [0.5]), 1.0 + j) for i in range(streams) for j in range(3)]
    stream = TestStream().add_elements(events)
    for step in range(1, steps) if steady else ():  # the watermark moves one step at a time
        stream = stream.advance_watermark_to(clock.start + step * clock.period)
    stream = stream.advance_watermark_to(clock.end).advance_watermark_to_infinity()
    options = PipelineOptions([])
    options.view_as(StandardOptions).streaming = True
    start = time.perf_counter()
    p = beam.Pipeline(options=options)
    tally = tempfile.NamedTemporaryFile(delete=False).name
    _ = (p | stream | ContinualSum(params)).releases | beam.Map(_count, tally)
    result = p.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - start
    with open(tally) as f:
        count = len(f.read().split())
    os.unlink(tally)
    return elapsed, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady", action="store_true", help="move the watermark one step at a time instead")
    args = parser.parse_args()
    results = [run(args.steps, args.streams, args.steady) for _ in range(args.repeats)]
    best = min(t for t, _ in results)
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}, beam {beam.__version__}")
    print(f"watermark {'one step at a time over' if args.steady else 'jump of'} {args.steps} steps, {args.streams} streams: best of {args.repeats} = {best:.2f} s, "
          f"{results[0][1]} releases (all runs: {', '.join(f'{t:.2f}' for t, _ in results)} s)")


if __name__ == "__main__":
    main()
