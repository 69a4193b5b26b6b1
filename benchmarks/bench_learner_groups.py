"""Benchmark: CPU per release of the online learners, stream by stream vs one group step.

Run by hand (not a test), on a quiet machine, one thread::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_learner_groups.py \\
        --streams 1000 --steps 200 --dims 8,128 [--window 16] [--modes per_stream,grouped,rows]

Two learners, logistic loss (μ = 0.5), pure ε = 1 (Gamma / K-norm window-tree nodes), window W: WDP-COCOP
on the unit L2 ball and WDP-COCOL (paper constants) on the simplex. Records: features N(0, 1/d) per
coordinate, labels ±1 (made once, untimed, seed 0). Timed in CPU seconds of this process:

* ``per_stream``: ``mech.step(state, (a, b), noise)`` for every stream and step (a ``Release`` per call):
  the per-stream engine path (the group of one after the port; the only path before it).
* ``grouped``: ``mech.step_group`` on one group of all streams per step (a ``ReleaseBatch`` per step).
* ``rows``: ``grouped`` plus ``batch.rows()`` (one ``Release`` per stream, what a per-row sink needs).

This file runs against an older checkout too (copy it into that checkout's ``benchmarks/``): modes its
learners do not support are skipped, so the same command measures "before".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import machine_comment  # noqa: E402

from beam_dp.core import NoiseSource  # noqa: E402
from beam_dp.mechanisms.online.learners import WDPCOCOL, WDPCOCOP  # noqa: E402

KEY = bytes(range(32))


def build(name: str, dim: int, window: int):
    kw = dict(dim=dim, loss="logistic", mu=0.5, epsilon=1.0, window=window)
    if name == "cocop":
        return WDPCOCOP(constraint="l2_ball", **kw)
    return WDPCOCOL(constraint="simplex", **kw)


def make_records(streams: int, steps: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(0.0, dim**-0.5, (steps, streams, dim)), rng.choice([-1.0, 1.0], (steps, streams))


def run_per_stream(mech, names, A, b) -> int:
    noise, states, released = NoiseSource(KEY), [mech.init_state(s) for s in names], 0
    for t in range(A.shape[0]):
        for i in range(len(names)):
            states[i], out = mech.step(states[i], (A[t, i], float(b[t, i])), noise)
            released += len(out)
    return released


def run_grouped(mech, names, A, b, rows: bool) -> int:
    noise, group, released = NoiseSource(KEY), mech.init_group(names), 0
    for t in range(A.shape[0]):
        group, batch = mech.step_group(group, A[t], b[t], noise)
        released += len(batch.rows()) if rows else len(batch)
    return released


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("streams", 1000), ("steps", 200), ("window", 16)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--dims", default="8,128")
    parser.add_argument("--learners", default="cocop,cocol")
    parser.add_argument("--modes", default="per_stream,grouped,rows")
    args = parser.parse_args(argv)
    print(machine_comment(), flush=True)
    names = [f"user-{i}" for i in range(args.streams)]
    releases = args.streams * args.steps
    for dim in (int(d) for d in args.dims.split(",")):
        A, b = make_records(args.streams, args.steps, dim)
        for name in args.learners.split(","):
            mech = build(name, dim, args.window)
            run_per_stream(mech, names[:10], A[:4], b[:4])  # warm caches, imports
            for mode in args.modes.split(","):
                if mode != "per_stream" and not hasattr(mech, "step_group"):
                    continue
                cpu = time.process_time()
                rows = run_per_stream(mech, names, A, b) if mode == "per_stream" else run_grouped(mech, names, A, b, mode == "rows")
                cpu = time.process_time() - cpu
                assert rows == releases, (rows, releases)
                print(json.dumps({"learner": mech.name, "constraint": mech.constraint.kind, "mode": mode,
                                  "streams": args.streams, "steps": args.steps, "dim": dim, "cpu_s": round(cpu, 3),
                                  "us_per_release": round(cpu / releases * 1e6, 3)}), flush=True)


if __name__ == "__main__":
    main()
