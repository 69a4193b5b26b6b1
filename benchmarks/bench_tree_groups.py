"""Benchmark: CPU per release of the trees and the window tree, stream by stream vs one group step.

Run by hand (not a test), on a quiet machine, one thread::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_tree_groups.py --streams 1000 --steps 200 --dim 8 \\
        [--events 1000000] [--window 64] [--mechanisms tree,hybrid,doubling,window] [--modes per_stream,grouped,replay]

The events of ``bench_throughput.py`` (``--events`` rows over ``--streams`` streams and ``--steps`` steps) are
clipped and summed per (stream, step) once, untimed. Then, timed in CPU seconds of this process:

* ``per_stream``: ``mech.step(state, ClippedSum)`` for every stream and step (a ``Release`` per call): the
  per-stream engine path. Before the group port this was the only path; after it, it is the group of one.
* ``grouped``: ``mech.step_group`` on one group of all streams per step (needs ``GroupSteppedSum``).
* ``replay``: ``replay_batches`` from the raw events into a sink that only counts rows (clipping and
  summing included; it steps a group when the mechanism is a ``GroupSteppedSum``, else stream by stream).

This file runs against an older checkout too (copy it into that checkout's ``benchmarks/``): modes its
mechanisms do not support are skipped, so the same command measures "before".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_throughput import KEY, make_events  # noqa: E402

from beam_dp.core import NoiseSource, StepClock  # noqa: E402
from beam_dp.mechanisms.base import ClippedSum  # noqa: E402
from beam_dp.mechanisms.replay import replay_batches  # noqa: E402
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum  # noqa: E402
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum  # noqa: E402

EPSILON, CLIP = 1.0, 1.0


def build(name: str, steps: int, dim: int, window: int):
    kw = dict(dim=dim, epsilon=EPSILON, clip_bound=CLIP)
    if name == "tree":
        return BinaryTreeSum(horizon=steps, **kw)
    if name == "hybrid":
        return HybridTreeSum(**kw)
    if name == "doubling":
        return DoublingTreeSum(**kw)
    return WindowTreeSum(window=window, **kw)


def step_sums(mech, ids, ts, values, steps: int):
    """Stream names and, per step, ``(sums (streams, d), counts, clipped)`` of the clipped events."""
    names, rows = np.unique(ids, return_inverse=True)
    step_of = np.floor(ts).astype(np.int64) + 1
    per_step = []
    for step in range(1, steps + 1):
        mask = step_of == step
        per_step.append(mech.clip_and_sum_groups(values[mask], rows[mask], len(names)))
    return names.tolist(), per_step


def run_per_stream(mech, names, per_step) -> int:
    noise, states, released = NoiseSource(KEY), [mech.init_state(s) for s in names], 0
    for sums, counts, clipped in per_step:
        for i in range(len(names)):
            states[i], out = mech.step(states[i], ClippedSum(sums[i], int(counts[i]), int(clipped[i])), noise)
            released += len(out)
    return released


def run_grouped(mech, names, per_step) -> int:
    noise, group, released = NoiseSource(KEY), mech.init_group(names), 0
    for sums, counts, _ in per_step:
        group, batch = mech.step_group(group, sums, counts, noise)
        released += len(batch)
    return released


def run_replay(mech, ids, ts, values, steps: int) -> int:
    released = [0]

    def sink(batch) -> None:
        released[0] += len(batch)

    replay_batches(mech, ids, ts, values, StepClock(0.0, 1.0, float(steps)), NoiseSource(KEY), sink)
    return released[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("streams", 1000), ("steps", 200), ("dim", 8), ("events", 1_000_000), ("window", 64)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--mechanisms", default="tree,hybrid,doubling,window")
    parser.add_argument("--modes", default="per_stream,grouped,replay")
    args = parser.parse_args(argv)
    print(f"# {platform.platform()}; {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
          f"numpy {np.__version__}; load {os.getloadavg()[0]:.1f}; beam_dp at {Path(__file__).resolve().parents[1]}", flush=True)
    ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
    releases = args.streams * args.steps
    for name in args.mechanisms.split(","):
        mech = build(name, args.steps, args.dim, args.window)
        names, per_step = step_sums(mech, ids, ts, values, args.steps)
        run_per_stream(build(name, 4, args.dim, args.window), names[:10], per_step[:4])  # warm caches, imports
        for mode in args.modes.split(","):
            if mode == "grouped" and not hasattr(mech, "step_group"):
                continue
            fn = {"per_stream": lambda: run_per_stream(mech, names, per_step),
                  "grouped": lambda: run_grouped(mech, names, per_step),
                  "replay": lambda: run_replay(mech, ids, ts, values, args.steps)}[mode]
            cpu = time.process_time()
            rows = fn()
            cpu = time.process_time() - cpu
            assert rows == releases, (rows, releases)
            print(json.dumps({"mechanism": mech.name, "mode": mode, "grouped": hasattr(mech, "step_group"),
                              "streams": args.streams, "steps": args.steps, "dim": args.dim, "cpu_s": round(cpu, 3),
                              "us_per_release": round(cpu / releases * 1e6, 3)}), flush=True)


if __name__ == "__main__":
    main()
