"""Benchmark: ContinualSum on the FnApiRunner vs the pure mechanism loop, and state sizes.

Run by hand (not a test):

    .venv/bin/python benchmarks/bench_continual_sum.py [--events 1000000] [--streams 20] [--dim 16]
        [--steps 1000] [--state-steps 1000000] [--stream-groups 0,16,256] [--out docs/performance.md]

Part 1 writes the same synthetic events to Parquet, then times, in the same process:
  * Beam: ReadEventFiles (Parquet -> EventBatch blocks) | ContinualSum | WriteReleasesToParquet,
    on the FnApiRunner, keyed by stream (``--stream-groups`` 0) or by N groups of streams (columnar
    releases); wall and CPU time (this process: the FnApiRunner runs the pipeline in it);
  * Beam, per-event elements: the events as one Beam element each (the slow path);
  * pure: pyarrow read + the mechanism loop (``replay_event_time``) + releases to Parquet.
Both produce the same releases (checked). Part 2 runs the hybrid tree and the window tree for
``--state-steps`` steps and reports the encoded state size against the mechanisms' stated memory bounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions  # noqa: E402
from report import emit_report  # noqa: E402

from beam_dp.beam import ContinualSum, ContinualSumParams  # noqa: E402
from beam_dp.core import NoiseSource, StepClock  # noqa: E402
from beam_dp.io import WriteReleasesToParquet, read_releases, release_to_row  # noqa: E402
from beam_dp.io.schema import RELEASE_SCHEMA  # noqa: E402
from beam_dp.io.sources import ReadEventFiles  # noqa: E402
from beam_dp.mechanisms.replay import replay_event_time  # noqa: E402
from beam_dp.mechanisms.sums.tree import HybridTreeSum  # noqa: E402
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum  # noqa: E402
from beam_dp.steps.params import NoiseKey  # noqa: E402

KEY = bytes(range(32))


def make_events(n: int, streams: int, dim: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = np.array([f"s{i:02d}" for i in range(streams)])[rng.integers(0, streams, n)]
    ts = np.sort(rng.random(n)) * steps  # start 0, period 1 s
    values = rng.normal(0, 0.5, size=(n, dim))
    return ids, ts, values


def write_events(path: Path, ids, ts, values, row_group: int = 65536) -> None:
    cols = {"stream_id": pa.array(ids), "timestamp": pa.array(ts)}
    cols.update({f"value_{j}": pa.array(values[:, j]) for j in range(values.shape[1])})
    pq.write_table(pa.table(cols), path, row_group_size=row_group)


def options() -> PipelineOptions:
    opts = PipelineOptions([])
    opts.view_as(StandardOptions).runner = "FnApiRunner"
    return opts


def run_beam(pattern: str, params: ContinualSumParams, out: Path, pre_aggregate: bool | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of the Beam job (keyed by stream, or by ``params.stream_groups`` groups);
    ``pre_aggregate=False``: the path of an unbounded input (no combiner; blocks keep their rows)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=options()) as p:
        batches, _ = p | ReadEventFiles(pattern)
        (batches | ContinualSum(params, pre_aggregate=pre_aggregate)).releases | WriteReleasesToParquet(
            str(out), columnar=params.stream_groups is not None)
    return time.perf_counter() - t0, time.process_time() - c0


def run_beam_per_event(ids, ts, values, params: ContinualSumParams, out: Path, chunks: int = 200) -> float:
    bounds = np.linspace(0, len(ids), chunks + 1).astype(int)

    def events(i):
        lo, hi = bounds[i], bounds[i + 1]
        for sid, t, v in zip(ids[lo:hi].tolist(), ts[lo:hi].tolist(), values[lo:hi]):
            yield sid, t, v

    t0 = time.perf_counter()
    with beam.Pipeline(options=options()) as p:
        (p | beam.Create(range(chunks)) | beam.FlatMap(events) | ContinualSum(params)).releases \
            | WriteReleasesToParquet(str(out))
    return time.perf_counter() - t0


def run_pure(path: Path, params: ContinualSumParams, out: Path) -> float:
    t0 = time.perf_counter()
    table = pq.read_table(path)
    dim = params.dim
    ids = table.column("stream_id").to_numpy(zero_copy_only=False)
    ts = table.column("timestamp").to_numpy()
    values = np.stack([table.column(f"value_{j}").to_numpy() for j in range(dim)], axis=1)
    mech = params.build_mechanism()
    clock = params.clock
    by_stream = replay_event_time(mech, ids, ts, values, clock, NoiseSource(KEY).for_domain(params.noise_key.domain))
    rows = [release_to_row(r, mech.guarantee, clock.step_start_micros(r.step), clock.step_end_micros(r.step))._asdict()
            for rels in by_stream.values() for r in rels]
    pq.write_table(pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA), out)
    return time.perf_counter() - t0


def state_sizes(steps: int, dim: int) -> list[tuple[str, int, int, str]]:
    noise = NoiseSource(KEY)
    out = []
    for name, mech, bound in (
        ("hybrid tree (unbounded)", HybridTreeSum(dim=dim, epsilon=1.0, clip_bound=1.0), "O(log t)"),
        ("window tree W=100", WindowTreeSum(dim=dim, epsilon=1.0, clip_bound=1.0, window=100), "6B+1 = 769 vectors"),
    ):
        state = mech.init_state("s")
        block = mech.clip_and_sum(np.full((1, dim), 0.1))
        biggest = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            state, _ = mech.step(state, block, noise)
            if state.t & (state.t - 1) == 0 or state.t % 997 == 0:
                biggest = max(biggest, len(mech.encode_state(state)))
        elapsed = time.perf_counter() - t0
        size = len(mech.encode_state(state))
        vectors = (max(size, biggest)) // (8 * dim)
        out.append((name, size, max(size, biggest), f"~{vectors} vectors of d={dim} (bound {bound}); "
                    f"{steps / elapsed:,.0f} steps/s"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--state-steps", type=int, default=1_000_000)
    ap.add_argument("--skip-per-event", action="store_true")
    ap.add_argument("--stream-groups", default="0", help="comma list of group counts for the Beam path (0: by stream)")
    ap.add_argument("--streaming-path", action="store_true",
                    help="run the Beam path as for an unbounded input (no pre-aggregation), on the same files")
    ap.add_argument("--out", default=None, help="Markdown file to append the results to")
    args = ap.parse_args()
    os.environ["BEAM_DP_NOISE_KEY"] = KEY.hex()  # the Beam workers' key: the same as the pure path's

    ids, ts, values = make_events(args.events, args.streams, args.dim, args.steps)
    clock = StepClock(start=0.0, period=1.0, end=float(args.steps))
    params = ContinualSumParams(dim=args.dim, epsilon=1.0, clip_bound=1.0, clock=clock,
                                noise_key=NoiseKey(domain="bench/ContinualSum"))  # one domain for both paths
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_events(tmp / "events.parquet", ids, ts, values)
        t_pure = run_pure(tmp / "events.parquet", params, tmp / "pure.parquet")
        beam_runs = {}
        for groups in [int(g) for g in args.stream_groups.split(",")]:
            grouped = dataclasses.replace(params, stream_groups=groups or None)
            out = tmp / f"beam{groups}"
            beam_runs[groups] = run_beam(str(tmp / "events.parquet"), grouped, out,
                                         False if args.streaming_path else None)
            beam_rows = read_releases(str(out) + "-*")
            pure_rows = read_releases(str(tmp / "pure.parquet"))
            assert [(r["stream"], r["step"]) for r in beam_rows] == [(r["stream"], r["step"]) for r in pure_rows]
            worst = max(float(np.max(np.abs(np.subtract(a["value"], b["value"])))) for a, b in zip(beam_rows, pure_rows))
            if worst > 1e-6:  # the same noise cells; only the summation order of the data may differ
                raise SystemExit(f"Beam ({groups} groups) and pure releases differ by {worst:.3g}: not the same "
                                 "mechanism, key or domain")
        t_elem = None
        if not args.skip_per_event:
            t_elem = run_beam_per_event(ids, ts, values, params, tmp / "elem")
    n = args.events
    lines.append(f"### ContinualSum: {n:,} events, {args.streams} streams, dim {args.dim}, {args.steps} steps "
                 f"({args.streams * args.steps:,} releases)\n")
    releases = args.streams * args.steps
    lines.append("| path | wall (s) | CPU (s) | CPU µs per release | events/s (wall) | × pure (wall) |\n|---|---|---|---|---|---|")
    lines.append(f"| pure mechanism loop (pyarrow read + replay + Parquet write) | {t_pure:.2f} | | | {n / t_pure:,.0f} | 1.00 |")
    for groups, (wall, cpu) in beam_runs.items():
        keyed = "keyed by stream" if not groups else f"keyed by {groups} stream groups, columnar releases"
        keyed += ", unbounded-input path (no pre-aggregation)" if args.streaming_path else ""
        lines.append(f"| Beam FnApiRunner, Parquet → EventBatch blocks, {keyed} | {wall:.2f} | {cpu:.2f} | "
                     f"{1e6 * cpu / releases:.1f} | {n / wall:,.0f} | {wall / t_pure:.2f} |")
    if t_elem is not None:
        lines.append(f"| Beam FnApiRunner, one element per event | {t_elem:.2f} | {n / t_elem:,.0f} | {t_elem / t_pure:.2f} |")
    lines.append(f"\nBeam (every group count) and pure releases agree (max |difference| {worst:.2e} in the last run, "
                 "floating-point summation order).\n")
    lines.append(f"### State size after {args.state_steps:,} steps (dim {args.dim})\n")
    lines.append("| mechanism | final state (bytes) | largest seen (bytes) | notes |\n|---|---|---|---|")
    for name, size, biggest, note in state_sizes(args.state_steps, args.dim):
        lines.append(f"| {name} | {size:,} | {biggest:,} | {note} |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
