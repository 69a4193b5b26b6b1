"""Main job: continual private sums (and counts, windowed sums) per stream, batch or streaming.

Reads events ``stream_id, timestamp, value`` (or ``value_0..value_{d-1}``) from CSV/Parquet files
(batch replay on the FnApiRunner) or, with ``--streaming``, from Pub/Sub or Kafka (one JSON event
per message); runs ``ContinualSum`` (plus ``ContinualCount`` with ``--count`` and ``WindowedSum``
with ``--window``) per stream; writes the releases to Parquet (or JSON lines) and the dead letters
to JSON lines next to them, and prints a short summary.

With no ``--input`` it runs on the embedded demo dataset (``pipelines/demo_data.py``).
``--epsilon``/``--delta`` are the job's total budget per contribution: a ``JobBudget`` splits them
equally between the transforms that run (pure epsilons add; Gaussian transforms compose exactly
through their ``mu``), each transform draws in its own noise domain, and the summary verifies the
total from the written release files (``python -m beam_dp.verify``).

    python -m pipelines.continual_stats --help
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.core import StepClock
from beam_dp.core.budget import JobBudget
from beam_dp.io import read_releases
from beam_dp.io.sources import value_columns
from beam_dp.verify import verify_job
from pipelines import demo_data
from pipelines.common import (
    ReadEvents,
    UsageError,
    add_noise_key_flags,
    add_source_flags,
    check_source,
    match_files,
    metrics_summary,
    noise_key_of,
    params_or_usage_error,
    run_cli,
    write_dead_letters,
    write_releases,
)

log = logging.getLogger("beam_dp.continual_stats")

PROG = "python -m pipelines.continual_stats"


class ContinualStatsOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp continual_stats")
        g.add_argument("--input", default=None,
                       help="CSV/Parquet event file or glob with columns stream_id, timestamp (epoch seconds or "
                            "ISO-8601), value or value_0..value_{d-1}. Default: the embedded demo dataset.")
        add_source_flags(g)
        g.add_argument("--output", default="output/continual_stats",
                       help="Output folder; releases go to <output>/sum-*.parquet (count-*, windowed-*), dead "
                            "letters to <output>/dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--dim", type=int, default=None,
                       help="Dimension of the values (required with a streaming source; files: from the header).")
        g.add_argument("--epsilon", type=float, default=1.0,
                       help="Total privacy budget epsilon of the job per contribution. Default: %(default)s")
        g.add_argument("--delta", type=float, default=0.0,
                       help="Total delta; must be > 0 with --noise gaussian and 0 with gamma. Default: %(default)s")
        g.add_argument("--noise", choices=("gamma", "gaussian"), default="gamma",
                       help="gamma: K-norm noise, pure epsilon-DP under the L2 bound; gaussian: (epsilon, delta)-DP.")
        g.add_argument("--calibration", choices=("paper", "analytic"), default="paper",
                       help="Gaussian only: the paper's sigma (certified exactly, refused if it fails) or the "
                            "smallest exact (analytic) sigma.")
        g.add_argument("--clip-bound", "--clip_bound", dest="clip_bound", type=float, default=1.0,
                       help="L2 norm bound R each contribution is clipped to (sensitivity 2R). Default: %(default)s")
        g.add_argument("--start", type=float, default=None,
                       help="Public start of the step schedule, epoch seconds (required with --input or a stream).")
        g.add_argument("--period", type=float, default=None,
                       help="Step length in seconds (required with --input or a stream).")
        g.add_argument("--end", type=float, default=None,
                       help="Public end (exclusive), epoch seconds (required for a batch replay; optional when "
                            "streaming: without it the job releases a step per period until cancelled).")
        g.add_argument("--horizon", type=int, default=None,
                       help="Known horizon in steps for ContinualSum (binary tree); default: unbounded.")
        g.add_argument("--unbounded", choices=("hybrid", "doubling"), default="hybrid",
                       help="Unbounded-horizon construction when --horizon is not given. Default: %(default)s")
        g.add_argument("--window", type=int, default=None,
                       help="Also run WindowedSum protecting the last W steps (privacy expiration).")
        g.add_argument("--granularity", type=float, default=None,
                       help="Release sums on the grid g = the power of two >= this value, with exact arithmetic and "
                            "data-independent noise (defends the floating-point attack; the mechanism is calibrated "
                            "for clip bound R + sqrt(dim)*g). Counts are always released as exact integers.")
        g.add_argument("--count", action="store_true",
                       help="Also run ContinualCount (private running number of events per stream).")
        g.add_argument("--streams", default=None,
                       help="Comma-separated list of declared streams: only these are released, from step 1, "
                            "and events of other streams are dead-lettered.")
        add_noise_key_flags(g)


@dataclass(frozen=True)
class Plan:
    """Everything validated before the pipeline is built."""

    demo: bool
    pattern: str | None
    out_dir: Path
    dim: int
    clock: StepClock
    params: dict[str, Any]  # output name -> params object, in run order
    streaming: bool


def plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(ContinualStatsOptions)
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if not opts.epsilon > 0 or not opts.clip_bound > 0:
        raise UsageError("--epsilon and --clip-bound must be > 0")
    out_dir = Path(opts.output)
    demo = opts.input is None and opts.source == "files"
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    if demo:
        start, period, end = demo_data.DEMO_START, demo_data.DEMO_PERIOD, demo_data.DEMO_END
        pattern = str(out_dir / "demo_events.csv")
        streams = opts.streams.split(",") if opts.streams else list(demo_data.DEMO_STREAMS)
        window, dim = opts.window or 24, 2
    else:
        missing = [f for f, v in (("--start", opts.start), ("--period", opts.period)) if v is None]
        if opts.source == "files" and opts.end is None:
            missing.append("--end")
        if missing:
            raise UsageError(f"{', '.join(missing)} required: the step schedule is public and never read from data")
        start, period, end = opts.start, opts.period, opts.end
        streams = [s for s in opts.streams.split(",") if s] if opts.streams else None
        window = opts.window
        pattern = opts.input
        if opts.source == "files":
            dim = _dim_of(match_files(pattern)[0])
            if opts.dim is not None and opts.dim != dim:
                raise UsageError(f"--dim {opts.dim} but the files have {dim} value columns")
        elif opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        else:
            dim = opts.dim
    clock = params_or_usage_error(lambda: StepClock(start=start, period=period, end=end), "step schedule")
    # one budget for the job, split among its transforms (Gaussian ones compose exactly through their mu)
    names = ["sum"] + ["count"] * bool(opts.count) + ["windowed"] * bool(window)
    composition = "gaussian" if opts.noise == "gaussian" else "pure"
    budget = params_or_usage_error(
        lambda: JobBudget(opts.epsilon, opts.delta).split({name: composition for name in names}), "job budget")
    common = dict(noise=opts.noise, calibration=opts.calibration, clock=clock,
                  streams=tuple(streams) if streams else None, noise_key=noise_key_of(opts))
    vector = dict(dim=dim, clip_bound=opts.clip_bound, granularity=opts.granularity, **common)
    params: dict[str, Any] = {"sum": params_or_usage_error(lambda: ContinualSumParams(
        horizon=opts.horizon, unbounded=opts.unbounded, **vector, **budget["sum"].params()), "sum")}
    if opts.count:
        params["count"] = params_or_usage_error(lambda: ContinualCountParams(
            horizon=opts.horizon, unbounded=opts.unbounded, **common, **budget["count"].params()), "count")
    if window:
        params["windowed"] = params_or_usage_error(
            lambda: WindowedSumParams(window=window, **vector, **budget["windowed"].params()), "windowed")
    return Plan(demo, pattern, out_dir, dim, clock, params, streaming)


_TRANSFORMS = {"sum": ContinualSum, "count": ContinualCount, "windowed": WindowedSum}


def build(pipeline: beam.Pipeline, job: Plan, opts: ContinualStatsOptions, messages=None) -> dict:
    """Add the job to ``pipeline``; returns ``{output name: ContinualOutputs}``.

    ``messages``: a PTransform of raw JSON messages (a ``TestStream`` in tests) used in place of
    the Pub/Sub / Kafka source.
    """
    events, bad_rows = pipeline | "ReadEvents" >> ReadEvents(opts, job.pattern, messages)
    outputs = {name: events | _TRANSFORMS[name].__name__ >> _TRANSFORMS[name](params)
               for name, params in job.params.items()}
    dead = {"read": bad_rows}
    for name, out in outputs.items():
        write_releases(out.releases, job.out_dir, name, opts.format, job.streaming)
        dead[name] = out.dead_letter
    write_dead_letters(dead, job.out_dir, job.streaming)
    return outputs


def _dim_of(path: str) -> int:
    from apache_beam.io.filesystems import FileSystems
    import pyarrow.parquet as pq

    with FileSystems.open(path) as fh:
        try:
            if path.endswith(".parquet"):
                names = pq.ParquetFile(fh).schema_arrow.names
            else:
                names = [n.strip() for n in fh.readline().decode("utf-8").split(",")]
            return len(value_columns(names))
        except Exception as exc:  # unreadable header or file
            raise UsageError(f"cannot read the header of {path}: {exc}") from None


def summarize(job: Plan, opts: ContinualStatsOptions) -> str:
    out_dir = job.out_dir
    lines = [f"beam_dp continual_stats: releases written under {out_dir.resolve()}"]
    last_step = job.clock.last_step
    source = "embedded demo dataset" if job.demo else (opts.input or opts.source)
    lines.append(f"  input: {source}; dim={job.dim}; steps of {job.clock.period:g}s, {last_step} steps")
    for name in job.params:
        rows = _read_or_empty(out_dir, name)
        if not rows:
            lines.append(f"  {name}: no releases (no valid events and no declared streams)")
            continue
        streams = sorted({r["stream"] for r in rows})
        eps = max(r["epsilon_spent"] for r in rows)
        budget = rows[0]["epsilon_budget"]
        last = [r for r in rows if r["step"] == last_step]
        noise_std = last[0]["meta"].get("noise_std") if last else None
        lines.append(f"  {name}: {len(rows)} releases, {len(streams)} streams, mechanism {rows[0]['mechanism']}, "
                     f"max epsilon_spent {eps:.4g} of budget {budget:g}"
                     + (f", noise std at the last step {noise_std:.3g}" if noise_std else ""))
    dead_files = sorted(out_dir.glob("dead_letter-*.jsonl"))
    letters = [json.loads(line) for f in dead_files for line in f.read_text().splitlines() if line]
    reasons = Counter(f"{d['stage']}:{d['reason']}" for d in letters)
    lines.append(f"  dead letters: {len(letters)} {dict(sorted(reasons.items())) if reasons else ''}".rstrip())
    shares = ", ".join(f"{name} epsilon={params.epsilon:.4g}" for name, params in job.params.items())
    lines.append(f"  job budget: ({opts.epsilon:g}, {opts.delta:g}) per contribution, split as {shares}")
    all_rows = [row for name in job.params for row in _read_or_empty(out_dir, name)]
    if all_rows:
        verdict = verify_job(all_rows)
        lines.append(f"  verified from the release files: worst contribution spends epsilon "
                     f"{verdict.worst_epsilon:.4g} of {verdict.epsilon:g}" if verdict.ok else
                     "  NOT verified: " + "; ".join(verdict.problems))
    return "\n".join(lines)


def _read_or_empty(out_dir: Path, name: str) -> list[dict]:
    try:
        return read_releases(str(out_dir / f"{name}-*"))
    except FileNotFoundError:
        return []


def run(options: PipelineOptions, job: Plan, messages=None) -> str:
    opts = options.view_as(ContinualStatsOptions)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    for old in job.out_dir.glob("*-of-*"):
        old.unlink()
    if job.demo:
        n_events = demo_data.write_demo_events(job.pattern)
        log.info("wrote the embedded demo dataset (%d events) to %s", n_events, job.pattern)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, job, opts, messages)
    result = pipeline.run()
    result.wait_until_finish()
    return summarize(job, opts) + "\n" + metrics_summary(result)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, prog=PROG, description=__doc__.split("\n\n")[0], options_class=ContinualStatsOptions,
                   plan=plan, run=run)


if __name__ == "__main__":
    raise SystemExit(main())
