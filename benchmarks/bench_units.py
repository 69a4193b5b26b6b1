"""Benchmark: what privacy units cost. ``python -m pipelines.continual_stats`` with unit-level bounding
(``--privacy-unit-column``) against the same job at event level, each in its own process. Run by hand
(not a test):

    OMP_NUM_THREADS=1 python benchmarks/bench_units.py --streams 10000 --steps 200 --units 100000 \\
        --events 5000000 [--event-groups 4,0] [--out docs/performance.md]

Writes ``--events`` synthetic events to one Parquet file (``bench_throughput.make_events``: uniform streams
and one-second steps, N(0, 0.5²) values, d = ``--dim``) with a unit column ``user`` drawn from ``--units``
ids (Zipf-like: a few heavy units, many light ones, so the bounding drops), then runs the job with
``--noise gaussian --delta 1e-6`` (the BLT counter): at event level with each ``--event-groups`` stream
group count (0 = keyed by stream), and at unit level (``--max-unit-steps``, ``--max-streams-per-step``,
``--max-contributions-per-step``; the job's default stream groups). Reports each run's wall and CPU seconds (user +
system of its process tree) and peak RSS (the job process's ``VmHWM``), and the unit-level CPU over each
event-level run's. ``--profile`` runs the unit-level job once more under cProfile in this process and
prints its top functions by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_main_job import _LAUNCH, KEY, _child  # noqa: E402
from bench_throughput import make_events  # noqa: E402
from report import emit_report  # noqa: E402


def unit_ids(n: int, units: int, seed: int = 1) -> np.ndarray:
    """``n`` unit ids from ``units`` ids, Zipf-like (exponent 1.2, folded onto the ids): heavy and light units."""
    rng = np.random.default_rng(seed)
    names = np.array([f"user-{i:07d}" for i in range(units)])
    return names[(rng.zipf(1.2, n) - 1) % units]


def write_events(path: Path, n: int, streams: int, steps: int, dim: int, units: int) -> None:
    ids, ts, values = make_events(n, streams, steps, dim)
    columns = {"stream_id": pa.array(ids.tolist()), "timestamp": pa.array(ts), "user": pa.array(unit_ids(n, units))}
    columns.update({f"value_{j}": pa.array(values[:, j]) for j in range(dim)})
    pq.write_table(pa.table(columns), path, row_group_size=65_536)


def job_argv(events: Path, out: Path, steps: int, groups: int | None, unit: list[str]) -> list[str]:
    argv = [f"--input={events}", f"--output={out}", "--start=0", "--period=1", f"--end={steps}", "--noise=gaussian",
            "--delta=1e-6", "--epsilon=1", "--clip-bound=1"]
    return argv + ([] if groups is None else [f"--stream-groups={groups}"]) + unit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=1)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--max-unit-steps", type=int, default=16)
    parser.add_argument("--max-streams-per-step", type=int, default=2)
    parser.add_argument("--max-contributions-per-step", type=int, default=4)
    parser.add_argument("--event-groups", default="4,0", help="event-level runs: stream group counts (0: by stream)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = parser.parse_args(argv)
    unit = ["--privacy-unit-column=user", f"--max-unit-steps={args.max_unit_steps}",
            f"--max-streams-per-step={args.max_streams_per_step}",
            f"--max-contributions-per-step={args.max_contributions_per_step}"]
    lines = [f"### {args.events:,} events of {args.units:,} units, {args.streams:,} streams × {args.steps:,} steps, "
             f"d = {args.dim}; unit bounds k = {args.max_unit_steps}, m = {args.max_streams_per_step}, "
             f"c = {args.max_contributions_per_step}\n",
             "| run | wall (s) | CPU (s) | peak RSS (MB) | unit-level CPU over this |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = tmp / "events.parquet"
        write_events(events, args.events, args.streams, args.steps, args.dim, args.units)
        runs = [(f"event level, {'keyed by stream' if g == 0 else f'{g} stream groups'}", int(g), [])
                for g in map(int, args.event_groups.split(","))]
        runs.append(("unit level, default stream groups", None, unit))
        measured = []
        for name, groups, flags in runs:
            wall, cpu, rss = _child([sys.executable, "-c", _LAUNCH,
                                     *job_argv(events, tmp / f"out{len(measured)}", args.steps, groups, flags)])
            measured.append((name, wall, cpu, rss))
        unit_cpu = measured[-1][2]
        for name, wall, cpu, rss in measured:
            ratio = "" if name.startswith("unit") else f"{unit_cpu / cpu:.2f}×"
            lines.append(f"| {name} | {wall:.1f} | {cpu:.1f} | {rss:,.0f} | {ratio} |")
        if args.profile:
            from pipelines import continual_stats

            os.environ.setdefault("BEAM_DP_NOISE_KEY", KEY)
            profile = cProfile.Profile()
            profile.runcall(continual_stats.main, job_argv(events, tmp / "profiled", args.steps, None, unit))
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
