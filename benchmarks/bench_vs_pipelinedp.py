"""Peer comparison: PipelineDP's Beam ``Sum`` per key vs beam_dp's ``ContinualSum`` (final release).

Both read the same Parquet file of N events (default 1,000,000; 100 streams; values in [-1, 1];
one privacy unit per event) on the same runner (FnApiRunner, Apache Beam 2.77 in both venvs) and
report events/s (wall time of the whole pipeline, reading included).

* ``pipelinedp``: ``MakePrivate`` (privacy id = event id) -> ``private_beam.Sum`` with public
  partitions (the streams), Laplace noise, epsilon 1, each event in one partition once, values
  clamped to [-1, 1]: one release per stream.
* ``beam_dp-batched``: ``ReadEventFiles`` (columnar ``EventBatch`` blocks, the fast path) ->
  ``ContinualSum`` (epsilon 1, K-norm noise, clip bound 1, ``--steps`` event-time steps):
  a release per stream per step; the final step's release is the comparable one.
* ``beam_dp-per-element``: ``ReadFromParquet`` (one dict per event, as PipelineDP reads) ->
  ``ContinualSum``.

PipelineDP lives in its own venv (its releases have pinned numpy<2 / Python<3.12; 0.3.1 installs
with numpy 2.4 and Beam 2.77 here, see docs/performance.md)::

    python3 -m venv .venv-pipelinedp
    .venv-pipelinedp/bin/pip install pipeline-dp==0.3.1 apache-beam==2.77.0 pyarrow
    nice -n 10 .venv/bin/python benchmarks/bench_vs_pipelinedp.py            # all three, 1M events
    nice -n 10 .venv/bin/python benchmarks/bench_vs_pipelinedp.py --events 100000 --repeats 1

The ``pipelinedp`` run is a subprocess in ``--pipelinedp-python`` (default
``.venv-pipelinedp/bin/python``); the beam_dp runs use the current interpreter.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = 1767225600.0, 1767225600.0 + 86400.0  # one day of event time
EPSILON = 1.0


def make_data(path: Path, events: int, streams: int = 100, seed: int = 0) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists() and pq.ParquetFile(path).metadata.num_rows == events:
        return path
    rng = np.random.default_rng(seed)
    table = pa.table({
        "event_id": np.arange(events, dtype=np.int64),
        "stream_id": np.char.add("s", rng.integers(0, streams, events).astype(str)),
        "timestamp": np.sort(START + rng.random(events) * (END - START)),
        "value": np.clip(rng.normal(0.2, 0.5, events), -1.0, 1.0),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=65536)
    return path


def _options():
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(runner="FnApiRunner")


def _count(out_dir: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in out_dir.glob("out*"))


def run_pipelinedp(data: Path, out_dir: Path) -> dict:
    import apache_beam as beam
    import pipeline_dp
    import pyarrow.parquet as pq
    from pipeline_dp import private_beam

    streams = sorted(set(pq.read_table(data, columns=["stream_id"]).column(0).to_pylist()))
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
    params = pipeline_dp.SumParams(
        max_partitions_contributed=1, max_contributions_per_partition=1, min_value=-1.0, max_value=1.0,
        partition_extractor=lambda row: row["stream_id"], value_extractor=lambda row: row["value"],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE)
    start = time.perf_counter()
    with beam.Pipeline(options=_options()) as p:
        rows = p | beam.io.ReadFromParquet(str(data))
        private = rows | private_beam.MakePrivate(budget_accountant=accountant,
                                                  privacy_id_extractor=lambda row: row["event_id"])
        sums = private | private_beam.Sum(params, public_partitions=streams)
        accountant.compute_budgets()
        sums | beam.Map(repr) | beam.io.WriteToText(str(out_dir / "out"))
    return {"seconds": time.perf_counter() - start, "releases": _count(out_dir)}


def run_beam_dp(data: Path, out_dir: Path, steps: int, per_element: bool) -> dict:
    import apache_beam as beam

    from beam_dp.beam import ContinualSum, ContinualSumParams
    from beam_dp.core import StepClock
    from beam_dp.io.sources import ReadEventFiles

    clock = StepClock(start=START, period=(END - START) / steps, end=END)
    params = ContinualSumParams(dim=1, epsilon=EPSILON, clip_bound=1.0, clock=clock)
    last = clock.last_step
    start = time.perf_counter()
    with beam.Pipeline(options=_options()) as p:
        if per_element:
            events = p | beam.io.ReadFromParquet(str(data), columns=["stream_id", "timestamp", "value"])
        else:
            events, _bad = p | ReadEventFiles(str(data))
        out = events | ContinualSum(params)
        (out.releases
         | beam.Filter(lambda row: row.step == last)  # the final release, comparable to a one-shot Sum
         | beam.Map(lambda row: f"{row.stream},{row.value[0]!r}")
         | beam.io.WriteToText(str(out_dir / "out")))
    return {"seconds": time.perf_counter() - start, "releases": _count(out_dir)}


def _one(args) -> dict:
    out_dir = Path(args.work) / f"out-{args.engine}-{time.time_ns()}"
    out_dir.mkdir(parents=True)
    if args.engine == "pipelinedp":
        result = run_pipelinedp(Path(args.data), out_dir)
    else:
        result = run_beam_dp(Path(args.data), out_dir, args.steps, args.engine == "beam_dp-per-element")
    import apache_beam

    result.update(engine=args.engine, events=args.events, beam=apache_beam.__version__,
                  python=platform.python_version(), events_per_s=args.events / result["seconds"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=24, help="ContinualSum steps over the day (default 24).")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engine", choices=("all", "pipelinedp", "beam_dp-batched", "beam_dp-per-element"),
                        default="all")
    parser.add_argument("--work", default=str(ROOT / "output" / "bench_vs_pipelinedp"))
    parser.add_argument("--data", default=None, help="Event Parquet file (default: generated under --work).")
    parser.add_argument("--pipelinedp-python", dest="pipelinedp_python",
                        default=str(ROOT / ".venv-pipelinedp" / "bin" / "python"))
    args = parser.parse_args(argv)
    args.data = args.data or str(Path(args.work) / f"events-{args.events}.parquet")
    if args.engine != "all":
        print(json.dumps(_one(args)))
        return 0
    make_data(Path(args.data), args.events)
    results = []
    for _ in range(args.repeats):
        for engine in ("beam_dp-batched", "beam_dp-per-element", "pipelinedp"):
            python = args.pipelinedp_python if engine == "pipelinedp" else sys.executable
            if not Path(python).exists():
                print(f"skipping {engine}: {python} not found (see the module docstring)", file=sys.stderr)
                continue
            cmd = [python, __file__, "--engine", engine, "--events", str(args.events), "--steps", str(args.steps),
                   "--work", args.work, "--data", args.data]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                  env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
            if done.returncode:
                print(done.stderr[-3000:], file=sys.stderr)
                continue
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    print("\n| engine | events | releases | wall s | events/s | Beam |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['engine']} | {r['events']:,} | {r['releases']} | {r['seconds']:.1f} | "
              f"{r['events_per_s']:,.0f} | {r['beam']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
