"""Benchmark: CPU per release of PRIVINCREG₁, stream by stream vs one group step.

Run by hand (not a test), on a quiet machine, one thread::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_regression_groups.py \\
        --streams 1000 --steps 100 --dims 8,32 [--epsilon 1] [--constraints l2_ball,l1_ball] [--modes per_stream,grouped,rows]

PRIVINCREG₁ (Gaussian hybrid trees, horizon unknown), δ = 1e-5, ``calibration="analytic"``, release every
step, on the unit L2 or L1 ball. ``r_t`` (NOISYPROJGRAD iterations) grows with ε and t: 2 at ε = 1 over
100 steps; ``--epsilon 1000`` gives tens to hundreds. Records: every stream gets 0 to 3 records a step
(features N(0, 1/d) per coordinate, labels uniform in [−1, 1]; made once, untimed, seed 0). Timed in CPU
seconds of this process:

* ``per_stream``: ``mech.step(state, RegressionBlock(X_i, y_i), noise)`` for every stream and step (a
  ``Release`` per call): the per-stream engine path (the group of one after the port).
* ``grouped``: ``mech.step_group(group, X, y, stream_of_row, noise)`` on one group of all streams per
  step (a ``ReleaseBatch`` per step).
* ``rows``: ``grouped`` plus ``batch.rows()`` (one ``Release`` per stream, what a per-row sink needs).

Runs against an older checkout too (copy it there): modes its mechanism lacks are skipped.
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
from beam_dp.mechanisms.online.regression import PrivIncReg1, RegressionBlock  # noqa: E402

KEY = bytes(range(32))


def make_steps(streams: int, steps: int, dim: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: ``X (n, d)``, ``y (n,)`` and the stream of each row (0 to 3 rows per stream)."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        rows = rng.permutation(np.repeat(np.arange(streams), rng.integers(0, 4, streams)))
        out.append((rng.normal(0.0, dim**-0.5, (len(rows), dim)), rng.uniform(-1.0, 1.0, len(rows)), rows))
    return out


def run_per_stream(mech, names, data) -> tuple[int, float]:
    blocks = [[RegressionBlock(X[rows == i], y[rows == i]) for i in range(len(names))] for X, y, rows in data]
    noise, states, released = NoiseSource(KEY), [mech.init_state(s) for s in names], 0
    cpu = time.process_time()
    for step in blocks:
        for i, block in enumerate(step):
            states[i], out = mech.step(states[i], block, noise)
            released += len(out)
    return released, time.process_time() - cpu


def run_grouped(mech, names, data, rows_out: bool) -> tuple[int, float]:
    noise, group, released = NoiseSource(KEY), mech.init_group(names), 0
    cpu = time.process_time()
    for X, y, rows in data:
        group, batch = mech.step_group(group, X, y, rows, noise)
        released += len(batch.rows()) if rows_out else len(batch)
    return released, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--dims", default="8,32")
    parser.add_argument("--constraints", default="l2_ball,l1_ball")
    parser.add_argument("--modes", default="per_stream,grouped,rows")
    args = parser.parse_args(argv)
    print(machine_comment(), flush=True)
    names = [f"user-{i}" for i in range(args.streams)]
    releases = args.streams * args.steps
    for dim in (int(d) for d in args.dims.split(",")):
        data = make_steps(args.streams, args.steps, dim)
        for constraint in args.constraints.split(","):
            mech = PrivIncReg1(dim=dim, constraint=constraint, epsilon=args.epsilon, delta=1e-5, calibration="analytic")
            run_per_stream(mech, names[:10], data[:4])  # warm caches, imports
            for mode in args.modes.split(","):
                if mode != "per_stream" and not hasattr(mech, "step_group"):
                    continue
                if mode == "per_stream":
                    rows, cpu = run_per_stream(mech, names, data)
                else:
                    rows, cpu = run_grouped(mech, names, data, mode == "rows")
                assert rows == releases, (rows, releases)
                print(json.dumps({"mechanism": mech.name, "constraint": constraint, "epsilon": args.epsilon,
                                  "r_t_last": mech.schedule(args.steps)["r_t"], "mode": mode, "streams": args.streams,
                                  "steps": args.steps, "dim": dim, "cpu_s": round(cpu, 3),
                                  "us_per_release": round(cpu / releases * 1e6, 3)}), flush=True)


if __name__ == "__main__":
    main()
