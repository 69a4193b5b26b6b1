"""Benchmark: the main job (``python -m pipelines.continual_stats``) keyed by stream vs by stream groups,
against the vectorised numpy floor of the same job. Run by hand (not a test):

    OMP_NUM_THREADS=1 python benchmarks/bench_main_job.py --streams 1000 --steps 200 --dim 8 \\
        --events 1000000 --stream-groups 0,1,16,64 [--check] [--out docs/performance.md]

Writes the synthetic events of ``bench_throughput.make_events`` (N(0, 0.5²) coordinates, one-second
steps) to one Parquet file, then runs, each in its own process, the job on the DirectRunner's
FnApiRunner with ``--noise gaussian --delta 1e-6`` (the BLT counter) and ``--stream-groups G``
(0 = keyed by stream), and reports the CPU seconds of that process (user + system: reading, parsing,
the release stage, the Parquet sink, the verifier and the summary) per release, with and without the
CPU of a process that only starts the interpreter and imports the job's modules. The floor is
``fair_floor`` (issue 26.5) on the same file, in its own process: Arrow hashes the stream ids to
dense indices, ``np.bincount`` sums every (step, stream) cell (batches of 2^20 rows), ``np.cumsum`` makes
the prefix sums, the same 4-buffer BLT recurrence adds unkeyed Gaussian noise, and the releases are
written columnar (one record batch per step) to one Parquet file; its CPU is that of the floor only (no
interpreter start-up, best of ``--floor-repeats`` runs), its peak RSS the process's ``VmHWM``.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_throughput import CLIP, DELTA, EPSILON, ColumnarSink, build, make_events  # noqa: E402
from report import emit_report  # noqa: E402

from beam_dp.io.tables import iter_parquet_batches  # noqa: E402

KEY = bytes(range(32)).hex()


def write_events(path: Path, ids, ts, values) -> None:
    columns = {"stream_id": pa.array(ids.tolist()), "timestamp": pa.array(ts)}
    columns.update({f"value_{j}": pa.array(values[:, j]) for j in range(values.shape[1])})
    pq.write_table(pa.table(columns), path, row_group_size=65_536)


def fair_floor(events: str, out: str, steps: int, dim: int) -> int:
    """The main job in vectorised numpy over Arrow (module docstring); returns the number of releases."""
    mech = build("blt", steps, dim)
    m, omega, sigma = mech.blt.state_matrix_inverse(), mech.blt.arrays[1], mech.sigma
    with open(events, "rb") as fh:  # Arrow hashes the ids (no sort); then one batch of 2^20 rows at a time
        names = pa.chunked_array([b.column(0) for b in iter_parquet_batches(fh, columns=["stream_id"])]).unique()
        n = len(names)
        prefix = np.zeros((steps, n, dim))
        for batch in iter_parquet_batches(fh, 1 << 20):
            rows = pc.index_in(batch.column("stream_id"), value_set=names).to_numpy()
            cell = np.floor(batch.column("timestamp").to_numpy()).astype(np.int64) * n + rows  # 0-based step: start 0, period 1
            columns = [batch.column(f"value_{j}").to_numpy() for j in range(dim)]  # coordinate-major: no transpose
            scale = np.minimum(1.0, CLIP / np.maximum(np.sqrt(sum(c * c for c in columns)), 1e-300))  # L2 clip
            for j, column in enumerate(columns):
                prefix[:, :, j] += np.bincount(cell, weights=column * scale, minlength=steps * n).reshape(steps, n)
    np.cumsum(prefix, axis=0, out=prefix)
    g, noise = np.zeros((n, mech.blt.buffers, dim)), np.zeros((n, dim))
    rng = np.random.default_rng(1)
    sink = ColumnarSink(out, dim)
    for t in range(steps):
        z = rng.standard_normal((n, dim)) * sigma
        noise += z - omega @ g
        g = m @ g + z[:, None, :]
        sink.write(names, t + 1, prefix[t] + noise, EPSILON, DELTA)
    sink.close()
    return sink.rows


_FLOOR = ("import sys, time; sys.path.insert(0, 'benchmarks'); import bench_main_job as b; cpu = time.process_time(); "
          "b.fair_floor(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])); "
          "print('floor_cpu', time.process_time() - cpu, file=sys.stderr)")
_STARTUP = "import apache_beam, beam_dp.beam, beam_dp.io.sources, pipelines.common, pipelines.continual_stats"
# the job as `python -m pipelines.continual_stats ARGS`, reporting its own peak RSS on stderr at exit: VmHWM,
# not getrusage's ru_maxrss, which Linux carries over exec from the forked copy of this (large) parent
_PEAK_AT_EXIT = ("import atexit, sys; atexit.register(lambda: print('peak_rss_kb', next(int(line.split()[1]) "
                 "for line in open('/proc/self/status') if line.startswith('VmHWM')), file=sys.stderr)); ")
_LAUNCH = _PEAK_AT_EXIT + ("import runpy; sys.argv = ['continual_stats'] + sys.argv[1:]; "
                           "runpy.run_module('pipelines.continual_stats', run_name='__main__')")


def run_job(events: Path, out: Path, steps: int, groups: int) -> tuple[float, float, float]:
    """Wall and CPU seconds (the child process: user + system) and peak RSS (MB) of one run of the job."""
    return _child([sys.executable, "-c", _LAUNCH, f"--input={events}", f"--output={out}",
                   "--start=0", "--period=1", f"--end={steps}", "--noise=gaussian", "--delta=1e-6", "--epsilon=1",
                   "--clip-bound=1", f"--stream-groups={groups}"])


def run_floor_child(events: Path, out: Path, steps: int, dim: int) -> tuple[float, float, float]:
    """Wall seconds of the process, CPU seconds of the floor alone and the process's peak RSS (MB)."""
    return _child([sys.executable, "-c", _PEAK_AT_EXIT + _FLOOR, str(events), str(out), str(steps), str(dim)])


def _child(argv: list[str]) -> tuple[float, float, float]:
    env = {**os.environ, "BEAM_DP_NOISE_KEY": KEY, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak_rss_kb ")]
    floor = [float(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("floor_cpu ")]
    cpu = floor[-1] if floor else (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, (rss[-1] / 1024 if rss else 0.0)


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
        del ids, ts, values
        floor, floor_rss = float("inf"), 0.0
        for _ in range(args.floor_repeats):  # the floor is short: its best of a few runs, load being what it is
            _, cpu, floor_rss = run_floor_child(tmp / "events.parquet", tmp / "floor.parquet", args.steps, args.dim)
            floor = min(floor, cpu)
        lines.append(f"| fair numpy floor (fair_floor: Arrow ids, bincount, cumsum) | | {floor:.2f} | "
                     f"{1e6 * floor / releases:.1f} | 1.00 | | {args.events / floor:,.0f} | {floor_rss:,.0f} |")
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
