"""Benchmark: the main job (``python -m pipelines.continual_stats``) keyed by stream vs by stream groups,
against the vectorised numpy floor of the same job. Run by hand (not a test):

    OMP_NUM_THREADS=1 python benchmarks/bench_main_job.py --streams 1000 --steps 200 --dim 8 \\
        --events 1000000 --stream-groups 0,1,16,64 [--check] [--out docs/benchmarks.md]

Writes the synthetic events of ``bench_throughput.make_events`` (N(0, 0.5²) coordinates, one-second
steps) to one Parquet file, then runs, each in its own process, the job on the DirectRunner's
FnApiRunner with ``--noise gaussian --delta 1e-6`` (the BLT counter) and ``--stream-groups G``
(0 = keyed by stream), and reports the CPU seconds of that process (user + system: reading, parsing,
the release stage, the Parquet sink, the verifier and the summary) per release, with and without the
CPU of a process that only starts the interpreter and imports the job's modules. The floor is
``bench_throughput.run_floor`` on the same events in this process (CPU of the floor only, best of
``--floor-repeats`` runs).
``--check`` compares every run's releases with the first run's (same noise key: they must agree within
float summation order).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_throughput import build, make_events, run_floor  # noqa: E402
from report import emit_report  # noqa: E402

KEY = bytes(range(32)).hex()


def write_events(path: Path, ids, ts, values) -> None:
    columns = {"stream_id": pa.array(ids.tolist()), "timestamp": pa.array(ts)}
    columns.update({f"value_{j}": pa.array(values[:, j]) for j in range(values.shape[1])})
    pq.write_table(pa.table(columns), path, row_group_size=65_536)


_STARTUP = "import apache_beam, beam_dp.beam, beam_dp.io.sources, pipelines.common, pipelines.continual_stats"
# the job as `python -m pipelines.continual_stats ARGS`, reporting its own peak RSS on stderr at exit: VmHWM,
# not getrusage's ru_maxrss, which Linux carries over exec from the forked copy of this (large) parent
_LAUNCH = ("import atexit, runpy, sys; atexit.register(lambda: print('peak_rss_kb', next(int(line.split()[1]) "
           "for line in open('/proc/self/status') if line.startswith('VmHWM')), file=sys.stderr)); "
           "sys.argv = ['continual_stats'] + sys.argv[1:]; runpy.run_module('pipelines.continual_stats', run_name='__main__')")


def run_job(events: Path, out: Path, steps: int, groups: int) -> tuple[float, float, float]:
    """Wall and CPU seconds (the child process: user + system) and peak RSS (MB) of one run of the job."""
    return _child([sys.executable, "-c", _LAUNCH, f"--input={events}", f"--output={out}",
                   "--start=0", "--period=1", f"--end={steps}", "--noise=gaussian", "--delta=1e-6", "--epsilon=1",
                   "--clip-bound=1", f"--stream-groups={groups}"])


def _child(argv: list[str]) -> tuple[float, float, float]:
    env = {**os.environ, "BEAM_DP_NOISE_KEY": KEY, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak_rss_kb ")]
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), (rss[-1] / 1024 if rss else 0.0)


def releases_of(out: Path) -> pa.Table:
    files = sorted(str(p) for p in out.glob("sum-*.parquet"))
    table = pa.concat_tables([pq.read_table(f, columns=["stream", "step", "value"]) for f in files])
    return table.sort_by([("stream", "ascending"), ("step", "ascending")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--stream-groups", default="0,16")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--floor-repeats", type=int, default=3, help="the floor's CPU is its best of this many runs")
    parser.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = parser.parse_args(argv)
    ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
    releases = args.streams * args.steps
    lines = [f"### Main job: {args.events:,} events, {args.streams:,} streams × {args.steps:,} steps, d = {args.dim} "
             f"({releases:,} releases)\n",
             "| run | wall (s) | CPU (s) | CPU µs per release | × floor | without start-up: µs per release, × floor "
             "| events/s per CPU-second | peak RSS (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_events(tmp / "events.parquet", ids, ts, values)
        floor = float("inf")
        for _ in range(args.floor_repeats):  # the floor is short: its best of a few runs, load being what it is
            cpu = time.process_time()
            run_floor(ids, ts, values, args.steps, build("blt", args.steps, args.dim), str(tmp / "floor.parquet"))
            floor = min(floor, time.process_time() - cpu)
        lines.append(f"| numpy floor (bench_throughput.run_floor) | | {floor:.2f} | {1e6 * floor / releases:.1f} | 1.00 "
                     f"| | {args.events / floor:,.0f} | |")
        _, startup, _ = _child([sys.executable, "-c", _STARTUP])
        lines.append(f"| start-up only (interpreter + imports of the job) | | {startup:.1f} | | | | | |")
        first = None
        for groups in [int(g) for g in args.stream_groups.split(",")]:
            out = tmp / f"job{groups}"
            wall, cpu, rss = run_job(tmp / "events.parquet", out, args.steps, groups)
            keyed = "keyed by stream" if groups == 0 else f"--stream-groups {groups}"
            lines.append(f"| continual_stats, {keyed} | {wall:.1f} | {cpu:.1f} | {1e6 * cpu / releases:.1f} | "
                         f"{cpu / floor:.1f} | {1e6 * (cpu - startup) / releases:.1f}, {(cpu - startup) / floor:.1f} | "
                         f"{args.events / cpu:,.0f} | {rss:,.0f} |")
            if args.check:
                table = releases_of(out)
                if first is None:
                    first = table
                else:
                    same = table.column("stream").equals(first.column("stream")) and table.column("step").equals(
                        first.column("step"))
                    got = np.asarray(table.column("value").combine_chunks().flatten())
                    want = np.asarray(first.column("value").combine_chunks().flatten())
                    if not same or not np.allclose(got, want, rtol=1e-9, atol=1e-9):
                        raise SystemExit(f"releases with --stream-groups {groups} differ from the first run's")
                    lines.append(f"|  (releases equal the first run's: max abs difference "
                                 f"{np.max(np.abs(got - want)):.1e}) | | | | | | | |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
