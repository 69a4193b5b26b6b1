"""``python -m beam_dp.report`` on a large synthetic job folder: wall time and peak memory.

Writes a job folder of ``--streams`` x ``--steps`` releases (a ``kary_tree``-like continual sum of
dimension ``--dim``: its meta, noise declaration and labels as the demo job writes them) with the
project's writer (``release_table`` + ``release_parquet_writer``: the columnar sink's Parquet layout,
tables of 65,536 releases), in ``--shards`` files of equal groups of streams, plus its manifest;
then runs the report on the folder in a child process and prints its wall time and peak RSS
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``). The data is deleted afterwards (``--keep``
keeps it). Run by hand (not a test)::

    python benchmarks/bench_report.py --streams 20000 --steps 336      # 6.72M releases
    python benchmarks/bench_report.py --streams 3000 --steps 336       # ~1M releases
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.report import emit_report  # noqa: E402


def write_job(folder: str, streams: int, steps: int, shards: int, dim: int, seed: int = 0) -> int:
    """Write the synthetic job's release files and manifest into ``folder``; returns the bytes written."""
    from beam_dp.core.guarantee import Guarantee
    from beam_dp.core.release_batch import ReleaseBatch
    from beam_dp.io.manifest import JobManifest, ManifestTransform, write_manifest
    from beam_dp.io.sinks import ROWS_PER_TABLE, release_parquet_writer
    from beam_dp.steps.schema import ReleaseColumns, ReleaseLabels, release_table

    rng = np.random.default_rng(seed)
    epsilon = 0.5
    guarantee = Guarantee(epsilon)
    labels = ReleaseLabels("ContinualSum", "pure")
    names = [f"stream-{i:06d}" for i in rng.permutation(streams)]  # written in no particular name order
    groups = np.array_split(np.arange(streams), shards)
    hour = 3_600_000_000
    for shard, group in enumerate(groups):
        group_names = tuple(names[i] for i in group)
        totals = np.zeros((len(group), dim))
        path = os.path.join(folder, f"sum-{shard:05d}-of-{shards:05d}.parquet")
        with open(path, "wb") as fh:
            writer = release_parquet_writer(fh)
            parts, rows = [], 0
            for step in range(1, steps + 1):
                levels = int(np.ceil(np.log(step + 1) / np.log(14))) or 1
                std = 9.0 * np.sqrt(levels)
                totals += rng.poisson(5.0, totals.shape)
                meta = {"arity": 14, "calibration": "exact", "completed_nodes": step % 14, "fit_horizon": steps,
                        "levels": levels, "noise": "gamma", "noise_std": std, "window": None}
                noise = json.dumps({"terms": [["gamma", 2.0, 9.0, 1.0]] * levels})
                spent = epsilon * min(1.0, levels / 3)
                batch = ReleaseBatch(group_names, step, "kary_tree", totals + rng.normal(0, std, totals.shape),
                                     spent, 0.0, meta, noise=noise)
                parts.append(ReleaseColumns(batch, guarantee, step * hour, (step + 1) * hour, labels))
                rows += len(group)
                if rows >= ROWS_PER_TABLE or step == steps:
                    writer.write_table(release_table(parts))
                    parts, rows = [], 0
            writer.close()
    manifest = JobManifest("bench_report", epsilon, 0.0,
                           (ManifestTransform("ContinualSum", "kary_tree", "pure", epsilon, 0.0, ("sum",)),))
    write_manifest(folder, manifest)
    with open(os.path.join(folder, "summary.json"), "w") as fh:  # a JSON file a glob would also match
        fh.write("{}\n")
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=336)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dim", type=int, default=2)
    parser.add_argument("--data", default=None, help="folder for the generated job (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--out-md", default=None, help="append the result to this Markdown file")
    args = parser.parse_args()

    data = args.data or tempfile.mkdtemp(prefix="bench_report_")
    job = os.path.join(data, "job")
    os.makedirs(job, exist_ok=True)
    try:
        start = time.monotonic()
        size = write_job(job, args.streams, args.steps, args.shards, args.dim)
        written = time.monotonic() - start
        command = [sys.executable, "-m", "beam_dp.report", job, "--out", os.path.join(data, "report")]
        start = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mib, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
        if result.returncode != 0:
            raise SystemExit(f"the report failed ({result.returncode}): {result.stderr[-2000:]}")
        releases = args.streams * args.steps
        emit_report([
            f"Report on {releases:,} releases ({args.streams:,} streams x {args.steps} steps, dim {args.dim}, "
            f"{args.shards} Parquet files, {size / 1e6:.0f} MB; written in {written:.0f} s)",
            "",
            f"- wall time {wall:.1f} s (CPU {cpu:.1f} s), peak RSS {peak_mib:.0f} MiB",
            f"- stdout: `{result.stdout.splitlines()[0]}`",
        ], args.out_md)
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
