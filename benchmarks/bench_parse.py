"""Benchmark: CPU time of the streaming parse stage (``ParseEvents``) on one columnar ``EventBatch``.

Run by hand (not a test), one thread::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_parse.py --rows 65536 --streams 20,1000 --steps 200

The unbounded path (``pre_aggregate=False``, what streaming jobs use) emits one block per
(stream, step) that carries its original rows, so a late step can still be dead-lettered whole.
Times are CPU seconds of this process (``time.process_time``) for validating, clipping and emitting
every block of the batch; ``--pre-aggregate`` times the batch path for comparison; ``--stream-groups G``
emits one block per (group of streams, step) instead of per (stream, step). The parse code
comes from ``PYTHONPATH``, so running this file against an older checkout measures "before".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

import beam_dp
from beam_dp.beam import ContinualSumParams, EventBatch
from beam_dp.beam.shell.parse import ParseEvents
from beam_dp.core import StepClock


def make_batch(rows: int, streams: int, steps: int, dim: int, seed: int = 0) -> EventBatch:
    rng = np.random.default_rng(seed)
    names = np.array([f"u{i:06d}" for i in range(streams)], dtype=object)
    return EventBatch(names[rng.integers(0, streams, rows)], rng.random(rows) * steps, rng.normal(0, 1, (rows, dim)))


def time_parse(batch: EventBatch, steps: int, dim: int, pre_aggregate: bool, repeats: int,
               stream_groups: int | None = None) -> dict:
    params = ContinualSumParams(dim=dim, epsilon=1.0, clip_bound=1.0, clock=StepClock(start=0.0, period=1.0, end=float(steps)),
                                stream_groups=stream_groups)
    parse = ParseEvents(params, pre_aggregate=pre_aggregate)
    parse.setup()
    best, blocks = float("inf"), 0
    for _ in range(repeats):
        start = time.process_time()
        parse.start_bundle()  # a batch replay keyed by groups sums the bundle and emits at its end
        blocks = sum(1 for _ in parse.process(batch)) + sum(1 for _ in parse.finish_bundle() or ())
        best = min(best, time.process_time() - start)
    return {"cpu_s": round(best, 4), "blocks": blocks, "rows_per_s": round(len(batch) / best)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--streams", default="20,1000")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--pre-aggregate", action="store_true")
    parser.add_argument("--stream-groups", type=int, default=None)
    args = parser.parse_args(argv)
    out = {"machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
           "code": os.path.dirname(os.path.dirname(beam_dp.__file__)), "runs": []}
    for streams in (int(s) for s in args.streams.split(",")):
        batch = make_batch(args.rows, streams, args.steps, args.dim)
        out["runs"].append({"streams": streams, "rows": args.rows, "steps": args.steps, "dim": args.dim,
                            "pre_aggregate": args.pre_aggregate, "stream_groups": args.stream_groups,
                            **time_parse(batch, args.steps, args.dim, args.pre_aggregate, args.repeats,
                                         args.stream_groups)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
