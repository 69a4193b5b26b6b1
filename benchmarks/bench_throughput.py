"""Benchmark: CPU per release of the main job's counters against a vectorised numpy floor.

Run by hand (not a test), on a quiet machine, one thread::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_throughput.py --streams 1000 --steps 200 --dim 8 \\
        [--events 1000000] [--modes floor,grouped,per_stream,releases] [--counters blt,kary] [--check] [--toeplitz]

The job (the pure path of ``continual_stats``'s sum): events ``(stream id, timestamp, d floats)`` in
memory -> clip to L2 norm 1 -> per-(stream, step) sums -> a continual counter per stream releasing at
every step -> releases written to Parquet, columnar (one record batch per group and step).

Modes, each timed in CPU seconds of this process (``time.process_time``):

* ``floor``: the same job written directly in numpy, no library code: ``np.unique`` of the ids, one
  clip of all events, per step a ``bincount`` per coordinate, the BLT recursion (the same fitted
  parameters as ``counter="blt"``) with one unkeyed ``default_rng`` Gaussian vector per release, and
  a columnar Parquet write;
* ``grouped``: ``replay_batches`` (group steps, keyed noise cells) into the same columnar writer, with
  ``--group-size`` streams per group (default: all);
* ``per_stream``: the same with one stream per group (each stream stepped on its own: the cost of the
  per-stream engine path, group of one);
* ``releases``: ``replay_event_time`` (a ``Release`` object per release, kept in memory) and the same
  columnar write. This API exists before and after the group-step change, so running this file with
  ``PYTHONPATH`` of an older checkout measures "before".

``--check`` replays a small job with 1, 7 and all streams per group and reports whether releases are
identical (same key) whatever the group count. ``--toeplitz`` times steps at ``t = 2^17`` of the
square-root Toeplitz counter and of BLT, for one stream (amortised over ``--toeplitz-steps`` steps);
``--toeplitz-stalls`` times each Toeplitz step around the span boundary at ``t = 2^17`` (median, max).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beam_dp.core import NoiseSource, StepClock  # noqa: E402
from beam_dp.mechanisms.replay import replay_event_time  # noqa: E402
from beam_dp.mechanisms.sums import make_counter  # noqa: E402

KEY = bytes(range(32))
EPSILON, DELTA, CLIP = 1.0, 1e-6, 1.0


def make_events(n: int, streams: int, steps: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    names = np.array([f"u{i:06d}" for i in range(streams)])
    ids = names[rng.integers(0, streams, n)]
    ts = rng.random(n) * steps  # clock: start 0, period 1 s
    return ids, ts, rng.normal(0, 0.5, size=(n, dim))


class ColumnarSink:
    """Releases -> Parquet, one record batch per call (stream, step, epsilon/delta spent, value list)."""

    def __init__(self, path: str, dim: int):
        self.dim = dim
        self.schema = pa.schema([("stream", pa.string()), ("step", pa.int64()), ("epsilon_spent", pa.float64()),
                                 ("delta_spent", pa.float64()), ("value", pa.list_(pa.float64(), dim))])
        self.writer = pq.ParquetWriter(path, self.schema, compression="none")
        self.rows = 0
        self.pending: list = []

    def write(self, streams, step: int, values: np.ndarray, eps: float, delta: float) -> None:
        n = len(values)
        batch = pa.record_batch([
            pa.array(streams, pa.string()), pa.array(np.full(n, step, np.int64)), pa.array(np.full(n, eps)),
            pa.array(np.full(n, delta)), pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), self.dim),
        ], schema=self.schema)
        self.writer.write_batch(batch)
        self.rows += n

    def batch(self, b) -> None:
        """One group's releases; small groups (one stream each) are buffered into one batch per step."""
        if self.pending and self.pending[0].step != b.step:
            self.flush()
        self.pending.append(b)
        if sum(len(p) for p in self.pending) >= 1024:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            first = self.pending[0]
            streams = [s for p in self.pending for s in p.streams]
            values = np.concatenate([p.values for p in self.pending])
            self.write(streams, first.step, values, first.epsilon_spent, first.delta_spent)
            self.pending = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


def run_floor(ids, ts, values, steps: int, mech, path: str) -> int:
    """The vectorised numpy floor of the same job (BLT recursion, unkeyed Gaussian draws)."""
    names, rows = np.unique(ids, return_inverse=True)
    step_of = np.floor(ts).astype(np.int64) + 1
    order = np.argsort(step_of, kind="stable")
    norms = np.linalg.norm(values, axis=1)
    clipped = (values * np.minimum(1.0, CLIP / np.maximum(norms, 1e-300))[:, None])[order]
    rows, bounds = rows[order], np.searchsorted(step_of[order], np.arange(1, steps + 2))
    n_streams, d = len(names), values.shape[1]
    m, omega = mech.blt.state_matrix_inverse(), mech.blt.arrays[1]
    g, total = np.zeros((n_streams, mech.blt.buffers, d)), np.zeros((n_streams, d))
    rng = np.random.default_rng(1)
    sink = ColumnarSink(path, d)
    stream_col = pa.array(names.tolist(), pa.string())
    for step in range(1, steps + 1):
        lo, hi = bounds[step - 1], bounds[step]
        sums = np.stack([np.bincount(rows[lo:hi], weights=clipped[lo:hi, j], minlength=n_streams) for j in range(d)], axis=1)
        z = rng.standard_normal((n_streams, d)) * mech.sigma
        w = z - omega @ g
        g = m @ g + z[:, None, :]
        total += sums + w
        sink.write(stream_col, step, total, EPSILON, DELTA)
    sink.close()
    return sink.rows


def run_grouped(ids, ts, values, steps: int, mech, path: str, group_size: int | None) -> int:
    from beam_dp.mechanisms.replay import replay_batches

    sink = ColumnarSink(path, values.shape[1])
    replay_batches(mech, ids, ts, values, StepClock(0.0, 1.0, float(steps)), NoiseSource(KEY), sink.batch,
                   group_size=group_size)
    sink.close()
    return sink.rows


def run_releases(ids, ts, values, steps: int, mech, path: str) -> int:
    by_stream = replay_event_time(mech, ids, ts, values, StepClock(0.0, 1.0, float(steps)), NoiseSource(KEY))
    sink = ColumnarSink(path, values.shape[1])
    for stream, releases in by_stream.items():
        sink.write([stream] * len(releases), 0, np.stack([r.value for r in releases]), 0.0, 0.0)
    sink.close()
    return sink.rows


def build(counter: str, steps: int, dim: int):
    if counter == "blt":
        return make_counter("blt", noise="gaussian", horizon=steps, dim=dim, epsilon=EPSILON, delta=DELTA, clip_bound=CLIP)
    return make_counter("kary", noise="gamma", horizon=steps, dim=dim, epsilon=EPSILON, clip_bound=CLIP)


def timed(fn, *args) -> tuple[float, float, int]:
    cpu, wall = time.process_time(), time.perf_counter()
    rows = fn(*args)
    return time.process_time() - cpu, time.perf_counter() - wall, rows


def check_group_invariance(dim: int) -> dict:
    """Replay 60 streams x 40 steps with 1, 7 and 60 streams per group: are releases identical?"""
    from beam_dp.mechanisms.replay import replay_batches

    ids, ts, values = make_events(20_000, 60, 40, dim, seed=5)
    out = {}
    for counter in ("blt", "kary"):
        mech = build(counter, 40, dim)
        runs = []
        for size in (1, 7, None):
            got: dict = {}
            replay_batches(mech, ids, ts, values, StepClock(0.0, 1.0, 40.0), NoiseSource(KEY),
                           lambda b: got.update({(s, b.step): v for s, v in zip(b.streams, b.values)}), group_size=size)
            runs.append(got)
        keys = sorted(runs[0])
        ref = np.stack([runs[2][k] for k in keys])
        diffs = [float(np.max(np.abs(np.stack([r[k] for k in keys]) - ref))) for r in runs[:2]]
        bitwise = all(np.array_equal(np.stack([r[k] for k in keys]), ref) for r in runs[:2])
        out[counter] = {"bitwise_identical": bitwise, "max_abs_diff": max(diffs), "releases": len(keys)}
    return out


def toeplitz_steps(dim: int, t0: int = 2**17, steps: int = 65536) -> dict:
    """Amortised CPU per step from ``t0`` on, for one stream: square-root Toeplitz vs BLT. Toeplitz computes
    its noise in spans (65,536 steps here at d <= 128), so time at least one whole span."""
    from beam_dp.mechanisms.sums.blt import BLTState
    from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtState

    out = {}
    for counter, state in (("toeplitz", ToeplitzSqrtState("s", t0, np.zeros(dim))),
                           ("blt", None)):
        mech = make_counter(counter, noise="gaussian", horizon=2 * t0, dim=dim, epsilon=EPSILON, delta=DELTA, clip_bound=CLIP)
        if state is None:
            state = BLTState("s", t0, np.zeros((mech.blt.buffers, dim)), np.zeros(dim))
        noise = NoiseSource(KEY)
        cpu = time.process_time()
        for _ in range(steps):
            state, _ = mech.step(state, None, noise)
        out[counter] = (time.process_time() - cpu) / steps * 1e6
    return out


def toeplitz_stalls(dim: int, t0: int = 2**17, window: int = 4096) -> dict:
    """CPU of each step of one square-root Toeplitz stream (empty data) from ``t0 / 2 + 1`` (the first step of the
    span before ``t0``: that span's noise is computed there, at once) to ``t0 + window``; the median and the max
    over the steps ``t0 − window .. t0 + window`` (the span boundary at ``t0`` in the middle), the max over those
    steps during which Python's cyclic garbage collector made no full (generation 2) collection, the slowest
    steps, and the max over all steps after the first."""
    import gc

    from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtState

    mech = make_counter("toeplitz", noise="gaussian", horizon=2 * t0, dim=dim, epsilon=EPSILON, delta=DELTA, clip_bound=CLIP)
    state, noise = ToeplitzSqrtState("s", t0 // 2, np.zeros(dim)), NoiseSource(KEY)
    times = np.empty(t0 // 2 + window, np.int64)
    full_gc = np.zeros(len(times), bool)
    collections = [0]

    def count_full(phase: str, info: dict) -> None:
        collections[0] += phase == "start" and info["generation"] == 2

    gc.callbacks.append(count_full)
    try:
        for i in range(len(times)):
            seen, cpu = collections[0], time.process_time_ns()
            state, _ = mech.step(state, None, noise)
            times[i] = time.process_time_ns() - cpu
            full_gc[i] = collections[0] > seen
    finally:
        gc.callbacks.remove(count_full)
    steps = np.arange(t0 // 2 + 1, t0 + window + 1)
    sel = (steps >= t0 - window) & (steps <= t0 + window)
    near, median = times[sel] / 1e3, float(np.median(times[sel] / 1e3))
    no_gc = near[~full_gc[sel]]
    slowest = np.argsort(near)[::-1][:5]
    return {"dim": dim, "median_us": round(median, 1), "max_us": round(float(near.max()), 1),
            "max_over_median": round(float(near.max() / median), 1),
            "max_without_full_gc_us": round(float(no_gc.max()), 1),
            "max_without_full_gc_over_median": round(float(no_gc.max() / median), 1),
            "full_gc_steps": int(full_gc[sel].sum()),
            "slowest_steps": [(int(steps[sel][i]), round(float(near[i]))) for i in slowest],
            "max_after_first_us": round(float(times[1:].max()) / 1e3, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--modes", default="floor,grouped,per_stream,releases")
    parser.add_argument("--counters", default="blt,kary")
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--toeplitz", action="store_true")
    parser.add_argument("--toeplitz-steps", type=int, default=65536, help="steps timed from t = 2^17 (amortise a span)")
    parser.add_argument("--toeplitz-stalls", action="store_true", help="per-step CPU around the span boundary t = 2^17")
    args = parser.parse_args(argv)
    print(f"# {platform.platform()}; {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, numpy {np.__version__}, "
          f"pyarrow {pa.__version__}; load {os.getloadavg()[0]:.1f}", flush=True)
    if args.modes:
        warm_ids, warm_ts, warm_values = make_events(2000, 10, 5, args.dim, seed=9)  # imports, first writer
        with tempfile.TemporaryDirectory() as tmp:
            run_floor(warm_ids, warm_ts, warm_values, 5, build("blt", 5, args.dim), os.path.join(tmp, "w.parquet"))
            run_releases(warm_ids, warm_ts, warm_values, 5, build("blt", 5, args.dim), os.path.join(tmp, "w.parquet"))
        ids, ts, values = make_events(args.events, args.streams, args.steps, args.dim)
        releases = args.streams * args.steps
        with tempfile.TemporaryDirectory() as tmp:
            for mode in args.modes.split(","):
                for counter in (("blt",) if mode == "floor" else args.counters.split(",")):
                    mech = build(counter, args.steps, args.dim)
                    path = os.path.join(tmp, f"{mode}-{counter}.parquet")
                    fn = {"floor": lambda: run_floor(ids, ts, values, args.steps, mech, path),
                          "grouped": lambda: run_grouped(ids, ts, values, args.steps, mech, path, args.group_size),
                          "per_stream": lambda: run_grouped(ids, ts, values, args.steps, mech, path, 1),
                          "releases": lambda: run_releases(ids, ts, values, args.steps, mech, path)}[mode]
                    cpu, wall, rows = timed(fn)
                    assert rows == releases, (rows, releases)
                    row = {"mode": mode, "counter": counter, "streams": args.streams, "steps": args.steps, "dim": args.dim,
                           "events": args.events, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                           "us_per_release": round(cpu / releases * 1e6, 3), "events_per_s": round(args.events / cpu)}
                    print(json.dumps(row), flush=True)
                    os.remove(path)
    if args.check:
        print(json.dumps({"group_invariance": check_group_invariance(args.dim)}), flush=True)
    if args.toeplitz:
        print(json.dumps({"toeplitz_vs_blt_us_per_step_at_2^17": toeplitz_steps(args.dim, steps=args.toeplitz_steps), "dim": args.dim}), flush=True)
    if args.toeplitz_stalls:
        print(json.dumps({"toeplitz_steps_around_2^17": toeplitz_stalls(args.dim)}), flush=True)


if __name__ == "__main__":
    main()
