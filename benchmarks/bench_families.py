"""Benchmark: releases per CPU second of the per-record families' jobs against their numpy floors.

Run by hand (not a test), one thread::

    OMP_NUM_THREADS=1 python benchmarks/bench_families.py [--jobs model_release,online_learning,growing_db_queries]
        [--streams 4] [--rows 4096] [--dim 8] [--repeat 1]

Each job runs the CLI (``pipelines.<job>.main``) in its own process on a generated CSV input (``--rows``
examples or elements per stream, ``--streams`` streams, features in the unit ball) with a fixed noise key;
its CPU (user + system of the child, ``resource.getrusage``) is measured twice: over the input and over a
header-only input (start-up, pipeline construction, the runner's fixed cost). Reported: releases, CPU,
releases/s over the whole run and "marginal" releases/s (releases / (CPU − empty CPU)).

The floor of a job is its mechanism called directly on arrays, per stream, in this process, with nothing of
the pipeline: ``model_release`` (``ContinualModelParams``: ``update``/``base``) steps each stream on blocks of
``update`` rows; ``online_learning`` (WDP-COCOP, L2 ball) steps each record with ``mechanism.step``;
``growing_db_queries`` (PMWG) feeds each event-time step's element indices and queries (``plan_block``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY_HEX = bytes(range(32)).hex()
ERM = dict(update=64, base=256, classes=("a", "b", "c"), epsilon=1.0)
ONLINE = dict(window=16, epsilon=1.0)
GROWING = dict(universe='{"colour": ["red", "green", "blue", "grey"], "size": {"edges": [0, 1, 2, 5, 10]}}',
               steps=20, queries_per_step=4, epsilon=1.0, n=20)


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.normal(size=(n, dim))
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))


def make_examples(streams: int, rows: int, dim: int, labels: str, seed: int = 0) -> dict:
    """stream -> (features (rows, dim) of norm <= 1, labels): ``"classes"`` (ERM) or ``"pm1"`` (online)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in range(streams):
        x = _unit_rows(rng, rows, dim)
        y = (np.array(ERM["classes"])[rng.integers(0, 3, rows)] if labels == "classes"
             else np.where(rng.random(rows) < 0.5, -1.0, 1.0))
        out[f"s{s:03d}"] = (x, y)
    return out


def write_examples(path: Path, data: dict, dim: int) -> None:
    lines = ["stream_id," + ",".join(f"x_{i}" for i in range(dim)) + ",label"]
    for stream, (x, y) in data.items():
        lines += [f"{stream}," + ",".join(f"{v:.17g}" for v in row) + f",{lab}" for row, lab in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")


def make_growing(streams: int, rows: int, seed: int = 0) -> tuple[dict, dict]:
    """stream -> (timestamps, colours, sizes) sorted by time over ``steps`` 1-second steps, and
    stream -> [(query_id, t, predicate)]: ``queries_per_step`` per step at sizes the database reaches."""
    rng = np.random.default_rng(seed)
    colours = ("red", "green", "blue", "grey")
    steps, per = GROWING["steps"], GROWING["queries_per_step"]
    elements, queries = {}, {}
    for s in range(streams):
        name = f"shop{s:03d}"
        ts = np.sort(rng.uniform(0, steps, rows))
        elements[name] = (ts, np.array(colours)[rng.integers(0, 4, rows)], rng.uniform(0, 10, rows))
        sizes = np.linspace(rows / steps, rows, steps * per).astype(int)
        queries[name] = [(f"q{k:04d}", int(t), {"colour": [colours[k % 4]]} if k % 2 else {"size": [0, 2]})
                         for k, t in enumerate(sizes)]
    return elements, queries


def write_growing(elements_path: Path, queries_path: Path, elements: dict, queries: dict) -> None:
    lines = ["stream_id,timestamp,colour,size"]
    for stream, (ts, colour, size) in elements.items():
        lines += [f"{stream},{t:.6f},{c},{z:.6f}" for t, c, z in zip(ts, colour, size)]
    elements_path.write_text("\n".join(lines) + "\n")
    queries_path.write_text("\n".join(json.dumps({"stream_id": stream, "query_id": q, "t": t, "predicate": p})
                                      for stream, qs in queries.items() for q, t, p in qs) + "\n")


def job_argv(job: str, folder: Path, dim: int, empty: bool) -> list[str]:
    """The CLI flags of ``job`` over the inputs in ``folder`` (``empty``: the header-only inputs)."""
    tag = "empty_" if empty else ""
    common = [f"--output={folder / (tag + 'out')}", f"--dead-letter-output={folder / (tag + 'dead')}",
              f"--noise-key-file={folder / 'noise.key'}", "--runner=FnApiRunner"]
    if job == "model_release":
        return common + [f"--input={folder / (tag + 'examples.csv')}", "--algorithm=continual",
                         f"--classes={','.join(ERM['classes'])}", f"--update-size={ERM['update']}",
                         f"--base-size={ERM['base']}", f"--epsilon={ERM['epsilon']}"]
    if job == "online_learning":
        return common + [f"--input={folder / (tag + 'online.csv')}", "--learner=online", "--algorithm=cocop",
                         f"--dim={dim}", f"--window={ONLINE['window']}", f"--epsilon={ONLINE['epsilon']}"]
    return common + [f"--input={folder / (tag + 'elements.csv')}", f"--queries={folder / (tag + 'queries.jsonl')}",
                     f"--universe={GROWING['universe']}", "--start=0", "--period=1", f"--end={GROWING['steps']}",
                     f"--epsilon={GROWING['epsilon']}", f"--n={GROWING['n']}"]


def run_job(job: str, argv: list[str]) -> float:
    """CPU seconds (user + system) of ``python -m pipelines.<job> argv`` in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", f"pipelines.{job}", *argv], cwd=ROOT, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{job} failed: {done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def count_releases(folder: Path) -> int:
    from beam_dp.io import read_releases

    return len(read_releases(str(folder / "*-*")))


# -- floors: the mechanism on arrays ------------------------------------------------------------------
def floor_model_release(data: dict, dim: int) -> tuple[int, float]:
    from beam_dp.beam import ContinualModelParams
    from beam_dp.core import NoiseSource
    from beam_dp.mechanisms.erm import LabelledRows

    params = ContinualModelParams(n_features=dim, classes=ERM["classes"], epsilon=ERM["epsilon"],
                                  update=ERM["update"], base=ERM["base"])
    mech, noise, unit = params.build_mechanism(), NoiseSource(bytes(range(32))), ERM["update"]
    releases, t0 = 0, time.process_time()
    for stream, (x, y) in data.items():
        state, labels = mech.init_state(stream), np.array([ERM["classes"].index(v) for v in y])
        for lo in range(0, len(x) - unit + 1, unit):
            state, out = mech.step(state, LabelledRows(x[lo:lo + unit], labels[lo:lo + unit]), noise)
            releases += len(out)
    return releases, time.process_time() - t0


def floor_online_learning(data: dict, dim: int) -> tuple[int, float]:
    from beam_dp.beam import OnlineLearnerParams
    from beam_dp.core import NoiseSource

    params = OnlineLearnerParams(dim=dim, constraint="l2_ball", epsilon=ONLINE["epsilon"], window=ONLINE["window"])
    mech, noise = params.build_mechanism(), NoiseSource(bytes(range(32)))
    releases, t0 = 0, time.process_time()
    for stream, (x, y) in data.items():
        state = mech.init_state(stream)
        for row, label in zip(x, y):
            state, out = mech.step(state, (row, label), noise)
            releases += len(out)
    return releases, time.process_time() - t0


def floor_growing_db(elements: dict, queries: dict) -> tuple[int, float]:
    from beam_dp.beam import GrowingDatabaseParams
    from beam_dp.core import NoiseSource, StepClock
    from beam_dp.steps.policies import plan_block
    from pipelines.growing_db_queries import parse_universe

    universe = parse_universe(GROWING["universe"])
    params = GrowingDatabaseParams(universe=universe, n=GROWING["n"], epsilon=GROWING["epsilon"],
                                   clock=StepClock(0.0, 1.0, end=float(GROWING["steps"])))
    mech, noise = params.build_mechanism(), NoiseSource(bytes(range(32)))
    releases, t0 = 0, time.process_time()
    for stream, (ts, colour, size) in elements.items():
        index, _ = universe.encode({"colour": colour, "size": size})
        weights = {q: universe.predicate(p) for q, _, p in queries[stream]}
        pending = [(t, q, weights[q]) for q, t, _ in queries[stream]]
        step_of = np.floor(ts).astype(int) + 1
        state = mech.init_state(stream)
        for step in range(1, GROWING["steps"] + 1):
            rows = np.flatnonzero(step_of == step)
            block, pending, _ = plan_block(state.t, zip((ts[rows] * 1e6).astype(int).tolist(), index[rows].tolist()),
                                           pending)
            state, out = mech.step(state, block, noise)
            releases += len(out)
    return releases, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="model_release,online_learning,growing_db_queries")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096, help="examples / records / elements per stream")
    ap.add_argument("--online-rows", type=int, default=1024, help="records per stream of online_learning")
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each job (best CPU kept)")
    args = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"numpy {np.__version__}, load {os.getloadavg()[0]:.1f}; streams={args.streams} dim={args.dim}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "noise.key").write_text(KEY_HEX)
        for job in args.jobs.split(","):
            if job == "model_release":
                data = make_examples(args.streams, args.rows, args.dim, "classes")
                write_examples(folder / "examples.csv", data, args.dim)
                write_examples(folder / "empty_examples.csv", {}, args.dim)
                floor = floor_model_release(data, args.dim)
            elif job == "online_learning":
                data = make_examples(args.streams, args.online_rows, args.dim, "pm1")
                write_examples(folder / "online.csv", data, args.dim)
                write_examples(folder / "empty_online.csv", {}, args.dim)
                floor = floor_online_learning(data, args.dim)
            elif job == "growing_db_queries":
                elements, queries = make_growing(args.streams, args.rows)
                write_growing(folder / "elements.csv", folder / "queries.jsonl", elements, queries)
                write_growing(folder / "empty_elements.csv", folder / "empty_queries.jsonl", {},
                              {"none": [("q", 10**6, {"size": [0]})]})  # a header needs one row: never answered
                floor = floor_growing_db(elements, queries)
            else:
                raise SystemExit(f"unknown job {job!r}")
            cpu = min(run_job(job, job_argv(job, folder, args.dim, False)) for _ in range(args.repeat))
            empty = min(run_job(job, job_argv(job, folder, args.dim, True)) for _ in range(args.repeat))
            releases = count_releases(folder / "out")
            if releases != floor[0]:
                print(f"  ! {job}: the job made {releases} releases, the floor {floor[0]}")
            marginal = releases / max(cpu - empty, 1e-9)
            floor_rate = floor[0] / max(floor[1], 1e-9)
            print(f"{job}: {releases} releases, CPU {cpu:.2f} s (empty input {empty:.2f} s): "
                  f"{releases / cpu:.0f} releases/s, marginal {marginal:.0f}/s; floor {floor[1]:.3f} s, "
                  f"{floor_rate:.0f}/s; marginal job / floor = {floor_rate / marginal:.1f}x", flush=True)


if __name__ == "__main__":
    main()
