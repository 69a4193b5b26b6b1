"""Benchmark: the native Flink job (``python -m beam_dp.flink.run``, a bounded replay on a local MiniCluster)
against the Beam batch path (``python -m pipelines.continual_stats``) on the same events. Run by hand
from the main venv (not a test; needs ``.venv-flink``, ``make flink-test`` creates it):

    OMP_NUM_THREADS=1 python benchmarks/bench_flink.py --streams 1000 --steps 200 --dim 8 --events 1000000 \\
        [--stream-groups 4] [--state-backend rocksdb] [--file-input blocks|lines] [--flink-python PATH] \
        [--skip-beam] [--out docs/performance.md]

The events of ``bench_throughput.make_events`` (N(0, 0.5²) coordinates, one-second steps) go to a CSV
file (Flink) and a Parquet file (Beam); both jobs run the BLT counter (``--noise gaussian --delta 1e-6``,
ε = 1, clip 1) with ``--stream-groups G``, each in its own process tree, under one noise key and one
noise domain (the Flink job's ``--noise-domain`` is the Beam job's), so their releases agree up to
the noise scale: the Beam job's budget split leaves its one transform ε = 1 − 1.1e-6 (δ likewise),
Flink's takes ε = 1, so the noise differs by ~1e-6 relative; the benchmark checks rtol 1e-5. CPU is user + system of the whole process
tree (Flink: the client, the JVM of the MiniCluster and its Python workers), from start-up to exit.
Peak RSS: the Beam job process's ``VmHWM``; for Flink the peak of the whole tree's summed ``VmRSS``
(sampled every 0.25 s from /proc). ``--file-input``: the Flink job reads the CSV file as blocks (the
default) or one record per line.
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

import numpy as np
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


def _tree_rss_kb(root: int) -> int:
    """The summed resident memory (kB) of ``root`` and its descendants now (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        children.setdefault(int(fields["PPid"]), []).append(int(entry))
        rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def _tree_child(argv: list[str]) -> tuple[float, float, float]:
    """Wall and CPU seconds (user + system of the whole process tree) and the peak of the tree's summed
    resident memory (MB, sampled every 0.25 s) of one run."""
    env = {**os.environ, "BEAM_DP_NOISE_KEY": KEY, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while child.poll() is None:
        peak = max(peak, _tree_rss_kb(child.pid))
        time.sleep(0.25)
    stderr = child.stderr.read()
    if child.returncode:
        raise SystemExit(f"the Flink job failed ({child.returncode}): {stderr[-2000:]}")
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), peak / 1024


def run_flink(python: str, events: Path, out: Path, steps: int, dim: int, groups: int, backend: str, domain: str,
              parallelism: int, file_input: str, split_mib: int) -> tuple[float, float, float]:
    return _tree_child([python, "-m", "beam_dp.flink.run", "--input", str(events), "--output", str(out),
                        "--start", "0", "--period", "1", "--end", str(steps), "--dim", str(dim), "--noise",
                        "gaussian", "--delta", "1e-6", "--epsilon", "1", "--clip-bound", "1", "--stream-groups",
                        str(groups), "--state-backend", backend, "--noise-domain", domain,
                        "--parallelism", str(parallelism), "--file-input", file_input, "--split-mib", str(split_mib)])


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
            keys = list(zip(beam.column("stream").to_pylist(), beam.column("step").to_pylist()))
            want = np.array(beam.column("value").to_pylist())
            have = np.array([got[k] for k in keys])
            if not np.allclose(have, want, rtol=1e-5, atol=1e-4):
                raise SystemExit("Flink's releases differ from Beam's")
            lines.append(f"|  (Flink's releases equal Beam's: max abs difference {np.max(np.abs(have - want)):.1e}) "
                         "| | | | | |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
