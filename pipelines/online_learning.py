"""Private online learning per stream: ``OnlineLearner`` (WDP-COCOP / WDP-COCOL) or ``IncrementalRegression``.

``--learner online``: one record per step in arrival order (count steps; arrival order and count are
public), releasing the next decision ``{"x": x}`` at every step, window-DP over the last ``--window``
records. ``--learner regression``: PRIVINCREG1/2 or PRIVINCERM, releasing ``{"theta": theta}`` every
``--release-every`` steps; steps are ``--block-size`` records, or event-time steps (``--start``,
``--period``, ``--end``; the records then need a ``timestamp``). Records: ``stream_id``,
[``timestamp``,] ``x_0..x_{d-1}``, ``label``. With no ``--input`` the job runs on scikit-learn's
breast-cancer data (online, labels -1/+1) or diabetes data (regression), rows scaled to norm <= 1.
``--privacy-unit-column COL --max-unit-records K`` (files, or the messages' field COL) protects one unit's
whole contribution of at most K records instead of one record (group privacy, ``docs/online.md``).

    python -m pipelines.online_learning --help
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pipelines.outputs import private_dir
from pipelines.paths import join, write_text
from pipelines.record_units import record_unit, unit_id, with_unit
from pipelines.rows import features_of, number, require_columns
from pipelines.runner import (
    Job,
    UsageError,
    lateness,
    noise_key_of,
    options_class,
    params_or_usage_error,
    run_cli,
    split_list,
)

NAME = "online_learning"
PROG = f"python -m pipelines.{NAME}"
ALGORITHMS = {"online": ("cocop", "cocol"), "regression": ("privincreg1", "privincreg2", "privincerm")}


def __getattr__(name: str):  # the options class needs Beam: built on first use, not at import (fast --help)
    if name == "OnlineLearningOptions":
        return options_class(NAME)
    raise AttributeError(name)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: str
    params: Any
    event_time: bool
    streaming: bool
    learner: str
    outputs: tuple[str, ...] = ("models",)


def _dim(opts, pattern: str | None) -> int:
    from pipelines.records import column_names, indexed_columns

    if opts.source != "files":
        if opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        return opts.dim
    header = column_names(pattern)
    event_time = opts.learner == "regression" and opts.start is not None
    require_columns(header, ("stream_id", "label") + (("timestamp",) if event_time else ()), "--input")
    dim = len(indexed_columns(header, "x"))
    if not dim:
        raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, label)")
    if opts.dim is not None and opts.dim != dim:
        raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
    return dim


def plan(options) -> Plan:
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.beam import IncrementalRegressionParams, OnlineLearnerParams
    from pipelines.common import check_source
    from pipelines.spec import step_clock

    opts = options.view_as(options_class(NAME))
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    algorithm = opts.algorithm or ALGORITHMS[opts.learner][0]
    if algorithm not in ALGORITHMS[opts.learner]:
        owner = next(learner for learner, names in ALGORITHMS.items() if algorithm in names)  # argparse's choices
        raise UsageError(f"--algorithm {algorithm} needs --learner {owner} (--learner {opts.learner} takes "
                         f"{', '.join(ALGORITHMS[opts.learner])})")
    out_dir = opts.output
    demo = opts.input is None and opts.source == "files"
    pattern = join(private_dir(opts), f"demo_{opts.learner}.csv") if demo else opts.input
    unit = record_unit(opts, demo, pattern)
    dim = (30 if opts.learner == "online" else 10) if demo else _dim(opts, pattern)
    streams = split_list(opts.streams, "--streams")
    constraint = {"kind": opts.constraint, "radius": opts.radius}
    common = dict(dim=dim, epsilon=opts.epsilon, streams=streams, noise_key=noise_key_of(opts))
    if opts.learner == "online":
        if opts.start is not None or opts.period is not None:
            raise UsageError("--learner online uses count steps (one record each): drop --start/--period")
        params = params_or_usage_error(lambda: OnlineLearnerParams(
            constraint=constraint, window=opts.window, algorithm=algorithm, loss=opts.loss, mu=opts.mu,
            delta=opts.delta or 0.0, noise=opts.noise, calibration=opts.calibration, beta=opts.beta,
            alpha=opts.alpha, C0=opts.c0, **common), algorithm)
        return Plan(demo, pattern, out_dir, with_unit(params, unit, "privacy unit"), False, streaming, opts.learner)
    clock, block_size = None, opts.block_size
    if opts.start is not None or opts.period is not None:
        if opts.start is None or opts.period is None or (opts.end is None and opts.source == "files"):
            raise UsageError("event-time steps need --start, --period and (for a batch replay) --end")
        if block_size is not None:
            raise UsageError("give --block-size or --start/--period, not both")
        clock = params_or_usage_error(lambda: step_clock(opts, opts.start, opts.period, opts.end),
                                      "step schedule")
    elif block_size is None:
        block_size = 16
    params = params_or_usage_error(lambda: IncrementalRegressionParams(
        algorithm=algorithm, delta=1e-6 if opts.delta is None else opts.delta, constraint=constraint,
        horizon=opts.horizon, release_every=opts.release_every, calibration=opts.calibration, clock=clock,
        block_size=block_size, options=_regression_options(opts, algorithm), **common,
        **lateness(opts, IncrementalRegressionParams)), algorithm)
    return Plan(demo, pattern, out_dir, with_unit(params, unit, "privacy unit"), clock is not None, streaming, opts.learner)


def _regression_options(opts, algorithm: str) -> dict:
    """The mechanism's own options that a flag sets: ``m`` (PRIVINCREG2 only), ``iterations`` (PRIVINCERM only)."""
    if opts.m is not None and algorithm != "privincreg2":
        raise UsageError("--m is the projection dimension of privincreg2: drop it or use --algorithm privincreg2")
    if opts.iterations is not None and algorithm != "privincerm":
        raise UsageError("--iterations sets the solver of privincerm: drop it or use --algorithm privincerm")
    return {k: v for k, v in (("m", opts.m), ("iterations", opts.iterations)) if v is not None}


def to_record(row: dict, dim: int, event_time: bool, unit_column: str | None = None) -> tuple:
    """A row -> ``(stream_id, [timestamp,] features, label[, unit id])`` (the unit id: ``unit_column``'s cell)."""
    features, label = features_of(row, dim), number(row.get("label"))
    head = (row.get("stream_id"), row.get("timestamp")) if event_time else (row.get("stream_id"),)
    return (*head, features, label) + ((unit_id(row.get(unit_column)),) if unit_column is not None else ())


def labelled(dim: int):
    """How the job reads count-step records (``pipelines.records.Labelled``): files in columns, messages by ``to_record``."""
    from pipelines.records import Labelled

    return Labelled(dim, partial(to_record, dim=dim, event_time=False))


def build(pipeline, job: Plan, opts, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``. Event-time records
    (with a timestamp) and records with a privacy unit are read row by row."""

    from beam_dp.beam import IncrementalRegression, OnlineLearner
    from pipelines.common import write_dead_letters, write_releases
    from pipelines.records import ReadRecords, Records

    transform = OnlineLearner if opts.learner == "online" else IncrementalRegression
    unit = job.params.privacy_unit
    if unit is not None:  # one row at a time, with its unit id (the columnar blocks have no unit column)
        import apache_beam as beam

        rows, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages)
        records = rows | "ToUnitRecords" >> beam.Map(to_record, dim=job.params.dim, event_time=job.event_time,
                                                    unit_column=unit.column)
    elif job.event_time:
        records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(
            opts, job.pattern, messages, Records(partial(to_record, dim=job.params.dim, event_time=True)))
    else:
        records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages,
                                                                   labelled(job.params.dim))
    out = records | transform.__name__ >> transform(job.params)
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, private_dir(opts), job.streaming)
    return out


def write_demo(path: str, learner: str) -> int:
    """Breast cancer (labels -1/+1) or diabetes (target scaled to [-1, 1]); standardised rows of norm <= 1."""
    import numpy as np
    from sklearn.datasets import load_breast_cancer, load_diabetes

    data = load_breast_cancer() if learner == "online" else load_diabetes()
    x = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    x /= np.linalg.norm(x, axis=1).max()
    y = 2.0 * data.target - 1.0 if learner == "online" else data.target / np.abs(data.target).max()
    order = np.random.default_rng(0).permutation(len(y))
    lines = ["stream_id," + ",".join(f"x_{i}" for i in range(x.shape[1])) + ",label"]
    lines += ["demo," + ",".join(f"{v:.6g}" for v in x[i]) + f",{y[i]:.6g}" for i in order]
    write_text(path, "\n".join(lines) + "\n")
    return len(y)


def summary(job: Plan, opts) -> list[str]:
    source = "scikit-learn demo data" if job.demo else (opts.input or opts.source)
    return [f"  {opts.learner}; input: {source}; {job.params.dim} features"]


def _write_demo(job: Plan) -> str:
    return f"wrote the demo data ({write_demo(job.pattern, job.learner)} records) to {job.pattern}"


JOB = Job(NAME, __doc__.split("\n\n")[0], plan, build, summary, _write_demo)


def run(options, job: Plan, messages=None) -> str:
    """Run a planned job (tests pass ``messages``, a ``TestStream`` in place of Pub/Sub or Kafka)."""
    from pipelines.runner import run as run_job

    return run_job(options, JOB, job, messages)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, JOB)


if __name__ == "__main__":
    raise SystemExit(main())
