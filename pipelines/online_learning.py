"""Private online learning per stream: ``OnlineLearner`` (WDP-COCOP / WDP-COCOL) or ``IncrementalRegression``.

``--learner online``: one record per step in arrival order (count steps; arrival order and count are
public), releasing the next decision ``{"x": x}`` at every step, window-DP over the last ``--window``
records. ``--learner regression``: PRIVINCREG1/2 or PRIVINCERM, releasing ``{"theta": theta}`` every
``--release-every`` steps; steps are ``--block-size`` records, or event-time steps (``--start``,
``--period``, ``--end``; the records then need a ``timestamp``). Records: ``stream_id``,
[``timestamp``,] ``x_0..x_{d-1}``, ``label``. With no ``--input`` the job runs on scikit-learn's
breast-cancer data (online, labels -1/+1) or diabetes data (regression), rows scaled to norm <= 1.

    python -m pipelines.online_learning --help
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dp.beam import IncrementalRegression, IncrementalRegressionParams, OnlineLearner, OnlineLearnerParams
from beam_dp.core import StepClock
from pipelines.common import (
    JobOptions,
    UsageError,
    add_noise_key_flags,
    add_source_flags,
    check_source,
    metrics_summary,
    noise_key_of,
    output_summary,
    params_or_usage_error,
    prepare_output,
    run_cli,
    write_dead_letters,
    write_releases,
)
from pipelines.records import ReadRecords, column_names, features_of, indexed_columns, number

log = logging.getLogger("beam_dp.online_learning")

PROG = "python -m pipelines.online_learning"
ALGORITHMS = {"online": ("cocop", "cocol"), "regression": ("privincreg1", "privincreg2", "privincerm")}


class OnlineLearningOptions(JobOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp online_learning")
        g.add_argument("--input", default=None,
                       help="CSV/Parquet/JSON-lines files with stream_id, [timestamp,] x_0..x_{d-1}, label. "
                            "Default: scikit-learn's breast cancer (online) or diabetes (regression) data.")
        add_source_flags(g)
        g.add_argument("--output", default="output/online_learning",
                       help="Output folder: models-*.parquet and dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--learner", choices=tuple(ALGORITHMS), default="online",
                       help="online: OnlineLearner; regression: IncrementalRegression. Default: %(default)s")
        g.add_argument("--algorithm", choices=sum(ALGORITHMS.values(), ()), default=None,
                       help="online: cocop (default) or cocol; regression: privincreg1 (default), privincreg2, "
                            "privincerm.")
        g.add_argument("--dim", type=int, default=None,
                       help="Number of features d (required with a streaming source; files: from the header).")
        g.add_argument("--epsilon", type=float, default=1.0, help="Privacy budget per record. Default: %(default)s")
        g.add_argument("--delta", type=float, default=None,
                       help="delta: 0 by default for online gamma noise, 1e-6 for regression.")
        g.add_argument("--noise", choices=("gamma", "gaussian"), default="gamma",
                       help="online: gamma (K-norm, window epsilon-DP) or gaussian. Default: %(default)s")
        g.add_argument("--calibration", choices=("paper", "analytic"), default="paper",
                       help="Gaussian calibration: paper (certified or refused) or analytic. Default: %(default)s")
        g.add_argument("--constraint", choices=("l2_ball", "l1_ball", "simplex"), default="l2_ball",
                       help="Convex constraint set of the model. Default: %(default)s")
        g.add_argument("--radius", type=float, default=1.0, help="Radius of the constraint set. Default: %(default)s")
        g.add_argument("--loss", choices=("logistic", "squared"), default="logistic",
                       help="online: loss (labels -1/+1 for logistic). Default: %(default)s")
        g.add_argument("--mu", type=float, default=1.0, help="online: strong-convexity parameter. Default: %(default)s")
        g.add_argument("--window", type=int, default=64,
                       help="online: records a record stays protected (window DP). Default: %(default)s")
        g.add_argument("--horizon", type=int, default=None, help="regression: known number of steps (default: unbounded).")
        g.add_argument("--release-every", "--release_every", dest="release_every", type=int, default=1,
                       help="regression: release theta every k steps. Default: %(default)s")
        g.add_argument("--block-size", "--block_size", dest="block_size", type=int, default=None,
                       help="regression: records per step (count steps; default 16 unless --start/--period give "
                            "event-time steps).")
        g.add_argument("--start", type=float, default=None, help="regression: public start, epoch seconds.")
        g.add_argument("--period", type=float, default=None, help="regression: step length in seconds.")
        g.add_argument("--end", type=float, default=None, help="regression: public end (exclusive), epoch seconds.")
        g.add_argument("--streams", default=None, help="Comma-separated declared streams.")
        add_noise_key_flags(g)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: Path
    params: Any
    event_time: bool
    streaming: bool


def _dim(opts, pattern: str | None) -> int:
    if opts.source != "files":
        if opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        return opts.dim
    dim = len(indexed_columns(column_names(pattern), "x"))
    if not dim:
        raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, label)")
    if opts.dim is not None and opts.dim != dim:
        raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
    return dim


def plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(OnlineLearningOptions)
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    algorithm = opts.algorithm or ALGORITHMS[opts.learner][0]
    if algorithm not in ALGORITHMS[opts.learner]:
        raise UsageError(f"--algorithm {algorithm} is not a {opts.learner} learner: use one of "
                         f"{', '.join(ALGORITHMS[opts.learner])}")
    out_dir = Path(opts.output)
    demo = opts.input is None and opts.source == "files"
    pattern = str(out_dir / f"demo_{opts.learner}.csv") if demo else opts.input
    dim = (30 if opts.learner == "online" else 10) if demo else _dim(opts, pattern)
    streams = tuple(s for s in opts.streams.split(",") if s) if opts.streams else None
    constraint = {"kind": opts.constraint, "radius": opts.radius}
    common = dict(dim=dim, epsilon=opts.epsilon, streams=streams, noise_key=noise_key_of(opts))
    if opts.learner == "online":
        if opts.start is not None or opts.period is not None:
            raise UsageError("--learner online uses count steps (one record each): drop --start/--period")
        params = params_or_usage_error(lambda: OnlineLearnerParams(
            constraint=constraint, window=opts.window, algorithm=algorithm, loss=opts.loss, mu=opts.mu,
            delta=opts.delta or 0.0, noise=opts.noise, calibration=opts.calibration, **common), algorithm)
        return Plan(demo, pattern, out_dir, params, False, streaming)
    clock, block_size = None, opts.block_size
    if opts.start is not None or opts.period is not None:
        if opts.start is None or opts.period is None or (opts.end is None and opts.source == "files"):
            raise UsageError("event-time steps need --start, --period and (for a batch replay) --end")
        if block_size is not None:
            raise UsageError("give --block-size or --start/--period, not both")
        clock = params_or_usage_error(lambda: StepClock(start=opts.start, period=opts.period, end=opts.end),
                                      "step schedule")
    elif block_size is None:
        block_size = 16
    params = params_or_usage_error(lambda: IncrementalRegressionParams(
        algorithm=algorithm, delta=1e-6 if opts.delta is None else opts.delta, constraint=constraint,
        horizon=opts.horizon, release_every=opts.release_every, calibration=opts.calibration, clock=clock,
        block_size=block_size, **common), algorithm)
    return Plan(demo, pattern, out_dir, params, clock is not None, streaming)


def to_record(row: dict, dim: int, event_time: bool) -> tuple:
    """A row -> ``(stream_id, [timestamp,] features, label)``."""
    features, label = features_of(row, dim), number(row.get("label"))
    if event_time:
        return row.get("stream_id"), row.get("timestamp"), features, label
    return row.get("stream_id"), features, label


def build(pipeline: beam.Pipeline, job: Plan, opts: OnlineLearningOptions, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``."""
    records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages)
    transform = OnlineLearner if opts.learner == "online" else IncrementalRegression
    out = (records
           | "ToRecords" >> beam.Map(to_record, job.params.dim, job.event_time)
           | transform.__name__ >> transform(job.params))
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, job.out_dir, job.streaming)
    return out


def write_demo(path: str, learner: str) -> int:
    """Breast cancer (labels -1/+1) or diabetes (target scaled to [-1, 1]); standardised rows of norm <= 1."""
    from sklearn.datasets import load_breast_cancer, load_diabetes

    data = load_breast_cancer() if learner == "online" else load_diabetes()
    x = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    x /= np.linalg.norm(x, axis=1).max()
    y = 2.0 * data.target - 1.0 if learner == "online" else data.target / np.abs(data.target).max()
    order = np.random.default_rng(0).permutation(len(y))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    lines = ["stream_id," + ",".join(f"x_{i}" for i in range(x.shape[1])) + ",label"]
    lines += ["demo," + ",".join(f"{v:.6g}" for v in x[i]) + f",{y[i]:.6g}" for i in order]
    Path(path).write_text("\n".join(lines) + "\n")
    return len(y)


def run(options: PipelineOptions, job: Plan, messages=None) -> str:
    opts = options.view_as(OnlineLearningOptions)
    prepare_output(job.out_dir)
    if job.demo:
        log.info("wrote the demo data (%d records) to %s", write_demo(job.pattern, opts.learner), job.pattern)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, job, opts, messages)
    result = pipeline.run()
    result.wait_until_finish()
    source = "scikit-learn demo data" if job.demo else (opts.input or opts.source)
    lines = [f"beam_dp online_learning ({opts.learner}): releases written under {job.out_dir.resolve()}",
             f"  input: {source}; {job.params.dim} features"]
    return "\n".join(lines + output_summary(job.out_dir, ["models"]) + [metrics_summary(result)])


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, prog=PROG, description=__doc__.split("\n\n")[0], options_class=OnlineLearningOptions,
                   plan=plan, run=run)


if __name__ == "__main__":
    raise SystemExit(main())
