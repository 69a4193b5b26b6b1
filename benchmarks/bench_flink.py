"""Benchmark: the native Flink job (``python -m beam_dp.flink.run``, a bounded replay on a local MiniCluster)
against the Beam batch path (``python -m pipelines.continual_stats``) on the same events. Run by hand
from the main venv (not a test; needs ``.venv-flink``, ``make flink-test`` creates it):

    OMP_NUM_THREADS=1 python benchmarks/bench_flink.py --streams 1000 --steps 200 --dim 8 --events 1000000 \\
        [--stream-groups 4] [--state-backend rocksdb] [--file-input blocks|lines] [--flink-python PATH] \
        [--skip-beam] [--out docs/performance.md]

The events of ``bench_throughput.make_events`` (N(0, 0.5²) coordinates, one-second steps) go to a CSV
file (Flink) and a Parquet file (Beam); both jobs run the BLT counter (``--noise gaussian --delta 1e-6``,
ε = 1, clip 1) with ``--stream-groups G``, each in its own process tree, under one noise key and one
noise domain (the Flink job's ``--noise-domain`` is the Beam job's); the benchmark checks that Flink
releases Beam's rows (stream, step). Their values are not compared: the Flink entry's
``FlinkReleaseParams`` bind another calibration than Beam's ``ContinualSumParams``, so the noise
differs. CPU is user + system of the whole process tree (Flink: the client, the JVM of the
MiniCluster and its Python workers), from start-up to exit (:func:`tree_run`). Peak RSS: the Beam job
process's ``VmHWM``; for Flink the peak of the whole tree's summed ``VmRSS`` (sampled every 0.25 s from
/proc). ``--file-input``: the Flink job reads the CSV file as blocks (the default) or one record per
line. Every job on Flink against its Beam job: ``bench_flink_families.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_main_job import KEY, releases_of, run_job, write_events  # noqa: E402
from bench_throughput import make_events  # noqa: E402
from report import emit_report  # noqa: E402

FLINK_PYTHON = ROOT / ".venv-flink" / "bin" / "python"


def write_csv(path: Path, ids, ts, values) -> None:
    with open(path, "w") as fh:
        for i in range(0, len(ids), 100_000):
            cols = [ids[i:i + 100_000], ts[i:i + 100_000].astype(str)] + [
                values[i:i + 100_000, j].astype(str) for j in range(values.shape[1])]
            fh.write("\n".join(",".join(row) for row in zip(*cols)) + "\n")


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_now(root: int) -> dict[int, tuple[int, float, str]]:
    """``pid -> (resident kB, own CPU seconds: user + system, command name)`` of ``root`` and its
    descendants now (/proc)."""
    children: dict[int, list[int]] = {}
    now: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                name, rest = fh.read().rsplit(")", 1)
            fields = rest.split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        now[int(entry)] = (int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 1024,
                           (int(fields[11]) + int(fields[12])) / _TICK, name.split("(", 1)[1])
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in now:
            tree[pid] = now[pid]
        todo += children.get(pid, [])
    return tree


class Run(NamedTuple):
    """One run's wall and CPU seconds (user + system of the whole process tree; ``jvm_cpu``: of its Java
    processes), the peak of the tree's summed resident memory (MB) and the peak size of a watched folder
    (MB: the checkpoints)."""

    wall: float
    cpu: float
    rss_mb: float
    folder_mb: float = 0.0
    jvm_cpu: float = 0.0


def _folder_bytes(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(parent, name))
            except OSError:  # removed while walked (an old checkpoint)
                pass
    return total


def tree_run(argv: list[str], watch: Path | None = None, env: dict[str, str] | None = None) -> Run:
    """Runs ``argv`` (the noise key and ``PYTHONPATH`` of this checkout in its environment, with ``env``)
    and measures it (:class:`Run`), sampling /proc every 0.25 s: the tree's summed RSS, each process's
    own CPU (the client does not reap the JVM nor the JVM its Python workers, so ``getrusage`` of the
    children misses them: the CPU is the larger of that and the sampled sum, which misses at most the
    last 0.25 s of each process) and ``watch``'s size (a folder: the checkpoints)."""
    env = {**os.environ, "BEAM_DP_NOISE_KEY": KEY, "PYTHONPATH": str(ROOT), **(env or {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    cpu_of: dict[int, tuple[float, str]] = {}
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        peak, folder = 0, 0
        while child.poll() is None:
            tree = _tree_now(child.pid)
            peak = max(peak, sum(rss for rss, _, _ in tree.values()))
            cpu_of.update((pid, (cpu, name)) for pid, (_, cpu, name) in tree.items())
            if watch is not None and watch.exists():
                folder = max(folder, _folder_bytes(watch))
            time.sleep(0.25)
        wall = time.perf_counter() - wall
        if child.returncode:
            stderr.seek(0)
            raise SystemExit(f"{' '.join(argv[:5])} failed ({child.returncode}): {stderr.read()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sampled = sum(cpu for cpu, _ in cpu_of.values())
    jvm = sum(cpu for cpu, name in cpu_of.values() if name == "java")
    return Run(wall, max(reaped, sampled), peak / 1024, folder / 2**20, jvm)


def run_flink(python: str, events: Path, out: Path, steps: int, dim: int, groups: int, backend: str, domain: str,
              parallelism: int, file_input: str, split_mib: int) -> tuple[float, float, float]:
    run = tree_run([python, "-m", "beam_dp.flink.run", "--input", str(events), "--output", str(out),
                        "--start", "0", "--period", "1", "--end", str(steps), "--dim", str(dim), "--noise",
                        "gaussian", "--delta", "1e-6", "--epsilon", "1", "--clip-bound", "1", "--stream-groups",
                        str(groups), "--state-backend", backend, "--noise-domain", domain,
                        "--parallelism", str(parallelism), "--file-input", file_input, "--split-mib", str(split_mib)])
    return run.wall, run.cpu, run.rss_mb


def flink_releases(out: Path) -> dict[tuple[str, int], list[float]]:
    rows = (json.loads(line) for f in sorted(out.rglob("*")) if f.is_file() and not f.name.startswith((".", "_"))
            for line in f.read_text().splitlines() if line)
    return {(r["stream"], r["step"]): r["value"] for r in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--stream-groups", type=int, default=4)
    parser.add_argument("--state-backend", default="rocksdb")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--file-input", default="blocks", choices=("blocks", "lines"),
                        help="the Flink job's file input (beam_dp.flink.run --file-input)")
    parser.add_argument("--split-mib", type=int, default=64, help="the block input's split size (run.py --split-mib)")
    parser.add_argument("--flink-python", default=str(FLINK_PYTHON), help="the Python of the PyFlink venv")
    parser.add_argument("--skip-beam", action="store_true", help="Flink only (no release check)")
    parser.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = parser.parse_args(argv)
    ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
    releases = args.streams * args.steps
    lines = [f"### Flink vs Beam batch: {args.events:,} events, {args.streams:,} streams × {args.steps:,} steps, "
             f"d = {args.dim} ({releases:,} releases), --stream-groups {args.stream_groups}\n",
             "| run | wall (s) | CPU (s) | CPU µs per release | events/s per CPU-second | peak RSS (MB) |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        domain = "Sum"
        if not args.skip_beam:
            write_events(tmp / "events.parquet", ids, ts, values)
            wall, cpu, rss = run_job(tmp / "events.parquet", tmp / "beam", args.steps, args.stream_groups)
            lines.append(f"| Beam batch (continual_stats, FnApiRunner) | {wall:.1f} | {cpu:.1f} | "
                         f"{1e6 * cpu / releases:.1f} | {args.events / cpu:,.0f} | {rss:,.0f} (the job process) |")
            beam = releases_of(tmp / "beam")
            import pyarrow.parquet as pq
            first = sorted((tmp / "beam").glob("sum-*.parquet"))[0]
            domain = pc.unique(pq.read_table(first, columns=["noise_domain"]).column("noise_domain"))[0].as_py()
        write_csv(tmp / "events.csv", ids, ts, values)
        wall, cpu, rss = run_flink(args.flink_python, tmp / "events.csv", tmp / "flink", args.steps, args.dim,
                                   args.stream_groups, args.state_backend, domain, args.parallelism, args.file_input,
                                   args.split_mib)
        lines.append(f"| Flink replay (beam_dp.flink.run, MiniCluster, parallelism {args.parallelism}, "
                     f"{args.state_backend}, --file-input {args.file_input}, --split-mib {args.split_mib}) | {wall:.1f} | {cpu:.1f} | "
                     f"{1e6 * cpu / releases:.1f} | {args.events / cpu:,.0f} | {rss:,.0f} (the process tree) |")
        got = flink_releases(tmp / "flink")
        if len(got) != releases:
            raise SystemExit(f"Flink released {len(got)} rows, expected {releases}")
        if not args.skip_beam:
            keys = set(zip(beam.column("stream").to_pylist(), beam.column("step").to_pylist()))
            if set(got) != keys:
                raise SystemExit("Flink's release rows differ from Beam's")
            lines.append("|  (Flink releases Beam's rows) | | | | | |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
