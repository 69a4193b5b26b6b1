"""Benchmark: the native Flink job (``python -m beam_dp.flink.run``, a bounded replay on a local MiniCluster)
against the Beam batch path (``python -m pipelines.continual_stats``) on the same events. Run by hand
from the main venv (not a test; needs ``.venv-flink``, ``make flink-test`` creates it):

    OMP_NUM_THREADS=1 python benchmarks/bench_flink.py --streams 1000 --steps 200 --dim 8 --events 1000000 \\
        [--stream-groups 4] [--state-backend rocksdb] [--skip-beam] [--out docs/benchmarks.md]

The events of ``bench_throughput.make_events`` (N(0, 0.5²) coordinates, one-second steps) go to a CSV
file (Flink) and a Parquet file (Beam); both jobs run the BLT counter (``--noise gaussian --delta 1e-6``,
ε = 1, clip 1) with ``--stream-groups G``, each in its own process tree, under one noise key and one
noise domain (the Flink job's ``--noise-domain`` is the Beam job's), so their releases agree up to
the noise scale: the Beam job's budget split leaves its one transform ε = 1 − 1.1e-6 (δ likewise),
Flink's takes ε = 1, so the noise differs by ~1e-6 relative; the benchmark checks rtol 1e-5. CPU is user + system of the whole process
tree (Flink: the client, the JVM of the MiniCluster and its Python workers), from start-up to exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_main_job import _child, releases_of, run_job, write_events  # noqa: E402
from bench_throughput import make_events  # noqa: E402
from report import emit_report  # noqa: E402

FLINK_PYTHON = ROOT / ".venv-flink" / "bin" / "python"


def write_csv(path: Path, ids, ts, values) -> None:
    with open(path, "w") as fh:
        for i in range(0, len(ids), 100_000):
            cols = [ids[i:i + 100_000], ts[i:i + 100_000].astype(str)] + [
                values[i:i + 100_000, j].astype(str) for j in range(values.shape[1])]
            fh.write("\n".join(",".join(row) for row in zip(*cols)) + "\n")


def run_flink(events: Path, out: Path, steps: int, dim: int, groups: int, backend: str, domain: str,
              parallelism: int) -> tuple[float, float]:
    wall, cpu, _ = _child([str(FLINK_PYTHON), "-m", "beam_dp.flink.run", "--input", str(events), "--output", str(out),
                           "--start", "0", "--period", "1", "--end", str(steps), "--dim", str(dim), "--noise",
                           "gaussian", "--delta", "1e-6", "--epsilon", "1", "--clip-bound", "1", "--stream-groups",
                           str(groups), "--state-backend", backend, "--noise-domain", domain,
                           "--parallelism", str(parallelism)])
    return wall, cpu


def flink_releases(out: Path) -> dict[tuple[str, int], list[float]]:
    rows = (json.loads(line) for f in sorted(out.rglob("*")) if f.is_file() and not f.name.startswith(".")
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
    parser.add_argument("--skip-beam", action="store_true", help="Flink only (no release check)")
    parser.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = parser.parse_args(argv)
    ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
    releases = args.streams * args.steps
    lines = [f"### Flink vs Beam batch: {args.events:,} events, {args.streams:,} streams × {args.steps:,} steps, "
             f"d = {args.dim} ({releases:,} releases), --stream-groups {args.stream_groups}\n",
             "| run | wall (s) | CPU (s) | CPU µs per release | events/s per CPU-second |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        domain = "Sum"
        if not args.skip_beam:
            write_events(tmp / "events.parquet", ids, ts, values)
            wall, cpu, _ = run_job(tmp / "events.parquet", tmp / "beam", args.steps, args.stream_groups)
            lines.append(f"| Beam batch (continual_stats, FnApiRunner) | {wall:.1f} | {cpu:.1f} | "
                         f"{1e6 * cpu / releases:.1f} | {args.events / cpu:,.0f} |")
            beam = releases_of(tmp / "beam")
            import pyarrow.parquet as pq
            first = sorted((tmp / "beam").glob("sum-*.parquet"))[0]
            domain = pc.unique(pq.read_table(first, columns=["noise_domain"]).column("noise_domain"))[0].as_py()
        write_csv(tmp / "events.csv", ids, ts, values)
        wall, cpu = run_flink(tmp / "events.csv", tmp / "flink", args.steps, args.dim, args.stream_groups,
                              args.state_backend, domain, args.parallelism)
        lines.append(f"| Flink replay (beam_dp.flink.run, MiniCluster, parallelism {args.parallelism}, "
                     f"{args.state_backend}) | {wall:.1f} | {cpu:.1f} | {1e6 * cpu / releases:.1f} | "
                     f"{args.events / cpu:,.0f} |")
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
                         "| | | | |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
