"""Benchmark: every job on native Flink (``python -m pipelines.flink_job --job <job>``, a local MiniCluster)
against the Beam batch job (``python -m pipelines.<job>``, FnApiRunner) on the same input file. Run by
hand from the main venv (not a test; needs ``.venv-flink``, ``make flink-test`` creates it):

    OMP_NUM_THREADS=1 python benchmarks/bench_flink_families.py [--jobs continual_stats,model_release,...]
        [--parallelism 1,4] [--flink-python PATH] [--out docs/performance.md]

Inputs (one CSV file per input, written once; sizes by the flags): ``continual_stats`` the events of
``bench_throughput.make_events`` sorted by time (BLT, ``--noise gaussian --delta 1e-6``, ε = 1, clip 1,
``--stream-groups 4``); ``model_release`` (ERM ``continual``, update 64 / base 256), ``online_learning``
(WDP-COCOP, window 16) and ``growing_db_queries`` (PMWG, 20 steps, 4 queries a step) the inputs of
``bench_families``; ``lifelong`` (the bounded A-GEM learner, torch on CPU, one thread) 2 tasks of
``--task-rows`` rows per stream. Each job runs on Beam and on Flink (file replay at each
``--parallelism``; ``continual_stats`` also ``--streaming``, one record per line, whose watermark
follows the time-sorted events), each in its own process tree; Flink checkpoints every 2 s with RocksDB.
Measured per run: CPU (user + system of the whole process tree, start-up included), the start-up
alone (the same command on the first ``--tiny`` rows of the input, parallelism 1), peak RSS (the
tree's summed ``VmRSS``) and, for Flink, the peak size of ``--checkpoint-dir`` (RocksDB incremental
checkpoints: the state checkpointed, all ``chk-*`` and ``shared/`` files), all sampled every 0.25 s
(:func:`bench_flink.tree_run`: /proc, since the JVM and the Python workers are not reaped by the client). Every Flink replay's releases are checked against Beam's: the same
rows, values within 1e-9 (``continual_stats``: the rows only, :func:`check_same`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, cast

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_families import (  # noqa: E402
    ERM,
    GROWING,
    ONLINE,
    make_examples,
    make_growing,
    write_examples,
    write_growing,
)
from bench_flink import FLINK_PYTHON, Run, flink_releases, tree_run, write_csv  # noqa: E402
from bench_main_job import KEY  # noqa: E402
from bench_throughput import make_events  # noqa: E402
from report import emit_report  # noqa: E402

JOBS = ("continual_stats", "model_release", "online_learning", "growing_db_queries", "lifelong")
TASKS = ("t0", "t1")


@dataclass(frozen=True)
class Inputs:
    """A job's input files, their rows (events), its Beam flags (the Flink entry takes the same) and the
    Flink-only flags."""

    files: list[Path]
    rows: int
    flags: Callable[[list[Path]], list[str]]
    flink_flags: list[str]


def _sums(folder: Path, args: argparse.Namespace) -> Inputs:
    ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
    order = np.argsort(ts, kind="stable")  # time order: the streaming run's watermark follows the file
    path = folder / "events.csv"
    write_csv(path, ids[order], ts[order], values[order])
    header = "stream_id,timestamp," + ",".join(f"value_{j}" for j in range(args.dim)) + "\n"
    path.write_text(header + path.read_text())  # Beam reads the header; Flink dead-letters it (one line)
    common = ["--start=0", "--period=1", f"--end={args.steps}", "--noise=gaussian", "--delta=1e-6", "--epsilon=1",
              "--clip-bound=1", "--stream-groups=4"]
    return Inputs([path], args.events, lambda files: [f"--input={files[0]}", *common],
                  [f"--dim={args.dim}", "--noise-domain=ContinualSum"])


def _models(folder: Path, args: argparse.Namespace) -> Inputs:
    write_examples(folder / "examples.csv", make_examples(args.family_streams, args.rows, args.dim, "classes"), args.dim)
    return Inputs([folder / "examples.csv"], args.family_streams * args.rows, lambda files: [
        f"--input={files[0]}", "--algorithm=continual", f"--classes={','.join(cast(tuple, ERM['classes']))}",
        f"--update-size={ERM['update']}", f"--base-size={ERM['base']}", f"--epsilon={ERM['epsilon']}"], [])


def _online(folder: Path, args: argparse.Namespace) -> Inputs:
    write_examples(folder / "online.csv", make_examples(args.family_streams, args.online_rows, args.dim, "pm1"),
                   args.dim)
    return Inputs([folder / "online.csv"], args.family_streams * args.online_rows, lambda files: [
        f"--input={files[0]}", "--learner=online", "--algorithm=cocop", f"--dim={args.dim}",
        f"--window={ONLINE['window']}", f"--epsilon={ONLINE['epsilon']}"], [])


def _growing(folder: Path, args: argparse.Namespace) -> Inputs:
    elements, queries = make_growing(args.family_streams, args.rows)
    write_growing(folder / "elements.csv", folder / "queries.jsonl", elements, queries)
    return Inputs([folder / "elements.csv", folder / "queries.jsonl"], args.family_streams * args.rows,
                  lambda files: [f"--input={files[0]}", f"--queries={files[1]}", f"--universe={GROWING['universe']}",
                                 "--start=0", "--period=1", f"--end={GROWING['steps']}",
                                 f"--epsilon={GROWING['epsilon']}", f"--n={GROWING['n']}"], [])


def _lifelong(folder: Path, args: argparse.Namespace) -> Inputs:
    rng = np.random.default_rng(5)
    lines = ["stream_id,task_id," + ",".join(f"x_{i}" for i in range(args.dim)) + ",label"]
    for task in TASKS:
        for s in range(args.family_streams):
            x = rng.uniform(-1, 1, (args.task_rows, args.dim))
            labels = (x[:, 0] > 0).astype(int)
            lines += [f"s{s:03d},{task}," + ",".join(f"{v:.17g}" for v in row) + f",{y}" for row, y in zip(x, labels)]
    (folder / "tasks.csv").write_text("\n".join(lines) + "\n")
    return Inputs([folder / "tasks.csv"], len(lines) - 1, lambda files: [
        f"--input={files[0]}", f"--tasks={','.join(TASKS)}", "--classes=0,1", f"--task-size={args.task_rows}",
        "--steps-per-task=4", "--device=cpu", "--torch-threads=1"], [])


MAKERS = {"continual_stats": _sums, "model_release": _models, "online_learning": _online,
          "growing_db_queries": _growing, "lifelong": _lifelong}


def tiny(inputs: Inputs, folder: Path, rows: int) -> list[Path]:
    """The first ``rows`` rows of each input file (its header kept): what the start-up runs read."""
    heads = []
    for path in inputs.files:
        lines = path.read_text().splitlines(keepends=True)
        head = folder / f"tiny-{path.name}"
        head.write_text("".join(lines[:rows + 1]))
        heads.append(head)
    return heads


def beam_run(job: str, flags: list[str], out: Path) -> Run:
    return tree_run([str(ROOT / ".venv" / "bin" / "python"), "-m", f"pipelines.{job}", *flags, f"--output={out}",
                     "--runner=FnApiRunner", "--format=jsonl" if job != "continual_stats" else "--format=parquet"])


def flink_run(python: str, job: str, flags: list[str], out: Path, parallelism: int, streaming: bool) -> Run:
    extra = ["--streaming", "--file-input=lines"] if streaming else []
    return tree_run([python, "-m", "pipelines.flink_job", "--job", job, *flags, f"--output={out}",
                     f"--parallelism={parallelism}", "--checkpoint-ms=2000", *extra],
                    watch=Path(f"{out}.checkpoints"))


def _place(row: dict) -> tuple:
    return row["stream"], row["step"], json.dumps(row.get("meta"), sort_keys=True)


def release_rows(out: Path, flink: bool) -> dict[tuple, np.ndarray]:
    """Every release row of a run, by its place (stream, step, meta)."""
    if flink:
        files = [f for f in out.rglob("part-*") if f.is_file()]
    else:
        files = [f for f in out.glob("*.jsonl") if not f.name.startswith("_")]
    if not flink and not files:  # continual_stats on Beam: Parquet
        from bench_main_job import releases_of

        table = releases_of(out)
        return {(s, t, "null"): np.asarray(v, dtype=float) for s, t, v in
                zip(table.column("stream").to_pylist(), table.column("step").to_pylist(),
                    table.column("value").to_pylist())}
    rows = (json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip())
    return {_place(r): np.asarray(r["value"], dtype=float).ravel() for r in rows}


def check_same(job: str, got: dict, want: dict) -> str:
    """What Flink's releases share with Beam's (a missing or extra row, or another value, ends the benchmark).

    ``continual_stats``: the same rows only. Its Flink entry builds ``FlinkReleaseParams``, Beam's job
    ``ContinualSumParams``: the calibration bindings differ, so the noise does (the other jobs run the
    Beam job's own params object on Flink: the same noise)."""
    if set(got) != set(want):
        raise SystemExit(f"{job}: Flink released {len(got)} rows, Beam {len(want)} ({len(set(got) ^ set(want))} differ)")
    if job == "continual_stats":
        return "Beam's rows"
    have, ref = (np.concatenate([d[k] for k in sorted(want)]) for d in (got, want))
    if not np.allclose(have, ref, rtol=1e-9, atol=1e-9):
        raise SystemExit(f"{job}: Flink's releases differ from Beam's")
    return f"Beam's releases, max abs difference {float(np.max(np.abs(have - ref))) if len(ref) else 0.0:.0e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--parallelism", default="1,4")
    parser.add_argument("--events", type=int, default=200_000, help="continual_stats: events")
    parser.add_argument("--streams", type=int, default=1000, help="continual_stats: streams")
    parser.add_argument("--steps", type=int, default=50, help="continual_stats: steps")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--family-streams", type=int, default=4, help="streams of the other jobs")
    parser.add_argument("--rows", type=int, default=4096, help="model_release / growing_db_queries rows per stream")
    parser.add_argument("--online-rows", type=int, default=1024, help="online_learning rows per stream")
    parser.add_argument("--task-rows", type=int, default=256, help="lifelong rows per task and stream")
    parser.add_argument("--tiny", type=int, default=20, help="rows of the start-up runs' input")
    parser.add_argument("--flink-python", default=str(FLINK_PYTHON))
    parser.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    lines = ["| job | run | events | releases | wall (s) | CPU (s) (of which JVM) | start-up CPU (s) | CPU µs per event | CPU µs per release "
             "| ÷ Beam | ÷ Beam without start-up | peak RSS (MB) | checkpoints (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "noise.key").write_text(KEY)
        for job in args.jobs.split(","):
            folder = tmp / job
            folder.mkdir()
            inputs = MAKERS[job](folder, args)
            flags = inputs.flags(inputs.files) + [f"--noise-key-file={tmp / 'noise.key'}"] * (job != "continual_stats")
            small = inputs.flags(tiny(inputs, folder, args.tiny)) + flags[len(inputs.flags(inputs.files)):]
            beam = beam_run(job, flags, folder / "beam")
            beam_start = beam_run(job, small, folder / "beam-tiny")
            want = release_rows(folder / "beam", flink=False)
            runs = [("Beam batch (FnApiRunner)", beam, beam_start, len(want), "")]
            flink_flags = flags + inputs.flink_flags
            flink_start = flink_run(args.flink_python, job, small + inputs.flink_flags, folder / "flink-tiny", 1, False)
            modes = [(int(p), False) for p in args.parallelism.split(",")]
            modes += [(int(p), True) for p in args.parallelism.split(",")] if job == "continual_stats" else []
            for parallelism, streaming in modes:
                out = folder / f"flink-{parallelism}-{'s' if streaming else 'r'}"
                run = flink_run(args.flink_python, job, flink_flags, out, parallelism, streaming)
                got = release_rows(out, flink=True) if job != "continual_stats" else {
                    (s, t, "null"): np.asarray(v, dtype=float) for (s, t), v in flink_releases(out).items()}
                note = "" if streaming else f" (= {check_same(job, got, want)})"
                name = f"Flink {'streaming, lines' if streaming else 'file replay'}, parallelism {parallelism}{note}"
                runs.append((name, run, flink_start, len(got), f"{run.folder_mb:.1f}"))
            beam_release = beam.cpu / max(len(want), 1)
            beam_marginal = (beam.cpu - beam_start.cpu) / max(len(want), 1)
            for name, run, start, releases, state in runs:
                per_release = run.cpu / max(releases, 1)
                marginal = (run.cpu - start.cpu) / max(releases, 1)
                lines.append(f"| {job} | {name} | {inputs.rows:,} | {releases:,} | {run.wall:.0f} | "
                             f"{run.cpu:.1f} ({run.jvm_cpu:.1f}) | {start.cpu:.1f} | {1e6 * run.cpu / inputs.rows:.1f} | {1e6 * per_release:,.1f} | "
                             f"{per_release / beam_release:.2f} | {marginal / beam_marginal:.2f} | "
                             f"{run.rss_mb:,.0f} | {state} |")
            print("\n".join(lines[-len(runs):]), flush=True)
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
