"""Main job: continual private sums (and counts, windowed sums) per stream, batch or streaming.

Reads events ``stream_id, timestamp, value`` (or ``value_0..value_{d-1}``) from CSV/Parquet files
(batch replay on the FnApiRunner) or, with ``--streaming``, from Pub/Sub or Kafka (one JSON event
per message); runs ``ContinualSum`` (plus ``ContinualCount`` with ``--count`` and ``WindowedSum``
with ``--window``) per stream; writes the releases to Parquet (or JSON lines) and the dead letters
to JSON lines next to them, and prints a short summary.

With ``--privacy-unit-column`` (batch replay of ``--input``) every transform protects a privacy unit's
whole bounded contribution instead of one event (``docs/privacy_units.md``); without it the job is
event-level, exactly as before.

With no ``--input`` it runs on the embedded demo dataset (``pipelines/demo_data.py``).
``--epsilon``/``--delta`` are the job's total budget per contribution: a ``JobBudget`` splits them
equally between the transforms that run (pure epsilons add; Gaussian transforms compose exactly
through their ``mu``), each transform draws in its own noise domain, and the summary verifies the
total from the written release files (``python -m beam_dp.verify``).

    python -m pipelines.continual_stats --help
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelines import demo_data
from pipelines.outputs import private_dir
from pipelines.paths import join
from pipelines.rows import require_columns
from pipelines.runner import (
    Job,
    UsageError,
    budget_shares,
    lateness,
    noise_key_of,
    options_class,
    params_or_usage_error,
    run_cli,
    split_list,
    verified_lines,
)

if TYPE_CHECKING:
    from beam_dp.core.clock import StepClock
    from beam_dp.mechanisms.sums.unit_level import PrivacyUnit

log = logging.getLogger("beam_dp.continual_stats")

NAME = "continual_stats"
PROG = f"python -m pipelines.{NAME}"
_TRANSFORMS = {"sum": "ContinualSum", "count": "ContinualCount", "windowed": "WindowedSum"}


def __getattr__(name: str):  # the options class needs Beam: built on first use, not at import (fast --help)
    if name == "ContinualStatsOptions":
        return options_class(NAME)
    raise AttributeError(name)


@dataclass(frozen=True)
class Plan:
    """Everything validated before the pipeline is built."""

    demo: bool
    pattern: str | None
    out_dir: str
    dim: int
    clock: StepClock
    params: dict[str, Any]  # output name -> params object, in run order
    streaming: bool
    unit: PrivacyUnit | None = None  # the privacy unit (--privacy-unit-column); None: event level

    @property
    def outputs(self) -> list[str]:
        return list(self.params)


def plan(options) -> Plan:
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams
    from pipelines.common import check_source
    from pipelines.spec import step_clock

    opts = options.view_as(options_class(NAME))
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if not opts.epsilon > 0:  # the job's total (its transforms' params see their shares and the rest)
        raise UsageError("--epsilon must be > 0")
    out_dir = opts.output
    demo = opts.input is None and opts.source == "files"
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    if demo:
        given = [f for f, v in (("--start", opts.start), ("--period", opts.period), ("--end", opts.end)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} describe --input's clock; the embedded demo dataset has its own "
                             "(drop them, or give --input)")
        start, period, end = demo_data.DEMO_START, demo_data.DEMO_PERIOD, demo_data.DEMO_END
        pattern = join(private_dir(opts), "demo_events.csv")
        streams = split_list(opts.streams, "--streams") or demo_data.DEMO_STREAMS
        window, dim = 24 if opts.window is None else opts.window, 2
    else:
        missing = [f for f, v in (("--start", opts.start), ("--period", opts.period)) if v is None]
        if opts.source == "files" and opts.end is None:
            missing.append("--end")
        if missing:
            raise UsageError(f"{', '.join(missing)} required: the step schedule is public and never read from data")
        start, period, end = opts.start, opts.period, opts.end
        streams = split_list(opts.streams, "--streams")
        window = opts.window
        pattern = opts.input
        if opts.source == "files":
            dim = _dim_of(pattern)
            if opts.dim is not None and opts.dim != dim:
                raise UsageError(f"--dim {opts.dim} but the files have {dim} value columns")
        elif opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        else:
            dim = opts.dim
    unit = _privacy_unit(opts, demo)
    if unit is not None and opts.source == "files":
        _require_unit_column(pattern, unit.column)
    clock = params_or_usage_error(lambda: step_clock(opts, start, period, end), "step schedule")
    names = ["sum"] + ["count"] * bool(opts.count) + ["windowed"] * (window is not None)
    budget = budget_shares(opts, names)  # --epsilon/--delta are the job's total
    common = dict(noise=opts.noise, calibration=opts.calibration, clock=clock,
                  streams=tuple(streams) if streams else None, noise_key=noise_key_of(opts),
                  **lateness(opts, ContinualSumParams))
    vector = dict(dim=dim, clip_bound=opts.clip_bound, granularity=opts.granularity, **common)
    counter = dict(horizon=opts.horizon, unbounded=opts.unbounded, counter=opts.counter, blt_error=opts.blt_error)
    idle = dict(idle_steps=opts.idle_steps, idle_threshold=opts.idle_threshold)
    params: dict[str, Any] = {"sum": params_or_usage_error(
        lambda: ContinualSumParams(**counter, **vector, **idle, **budget["sum"].params()), "sum")}
    if opts.count:
        params["count"] = params_or_usage_error(
            lambda: ContinualCountParams(**counter, **common, **budget["count"].params()), "count")
    if window is not None:
        params["windowed"] = params_or_usage_error(
            lambda: WindowedSumParams(window=window, **vector, **idle, **budget["windowed"].params()), "windowed")
    groups = default_stream_groups(streaming) if opts.stream_groups is None else opts.stream_groups
    if groups < 0:
        raise UsageError(f"--stream-groups must be an integer >= 0, got {groups}")
    if unit is not None:
        params = {name: _unit_level(name, p, unit) for name, p in params.items()}
    if unit is None or not streaming:  # a stream's unit-level transforms release keyed by stream
        params = {name: _with_stream_groups(p, groups) for name, p in params.items()}
    warn_unspent(params)
    return Plan(demo, pattern, out_dir, dim, clock, params, streaming, unit)


_BOUNDING_FLAGS = (("--max-unit-steps", "max_unit_steps", None), ("--min-separation", "min_separation", 1),
                   ("--max-streams-per-step", "max_streams_per_step", 1),
                   ("--max-contributions-per-step", "max_contributions_per_step", 1))


def _privacy_unit(opts, demo: bool) -> PrivacyUnit | None:
    """The job's privacy unit from its flags (None: event level); a usage error for bounding flags without
    a unit column, a unit without ``--max-unit-steps`` or the demo dataset (a streaming job reads the unit
    field of each JSON message)."""
    from beam_dp.core.noise import KEY_ENV_VAR
    from beam_dp.mechanisms.sums.unit_level import PrivacyUnit

    given = [flag for flag, name, default in _BOUNDING_FLAGS if getattr(opts, name) != default]
    if opts.privacy_unit_column is None:
        if given:
            raise UsageError(f"{', '.join(given)} bound privacy units: give --privacy-unit-column (the column of the "
                             "unit ids), or leave them out for event-level privacy")
        return None
    if demo:
        raise UsageError("--privacy-unit-column needs --input: the embedded demo dataset has no unit ids")
    if opts.max_unit_steps is None:
        raise UsageError("--privacy-unit-column needs --max-unit-steps (the most steps a unit takes part in)")
    if not (opts.noise_key_file or opts.noise_key_secret or os.environ.get(opts.noise_key_env or KEY_ENV_VAR)):
        raise UsageError("--privacy-unit-column needs the noise key (--noise-key-file, --noise-key-secret or the key "
                         "env var): unit ids are hashed with it on every worker, never with a random key")
    return params_or_usage_error(lambda: PrivacyUnit(
        opts.privacy_unit_column, opts.max_streams_per_step, opts.max_contributions_per_step, opts.max_unit_steps,
        opts.min_separation), "privacy unit")


def _require_unit_column(pattern: str, column: str) -> None:
    from beam_dp.io.sources import value_columns
    from pipelines.common import input_header

    _, names, _ = input_header(pattern)
    require_columns(names, ("stream_id", "timestamp", column), "--input")
    if column in value_columns(names):
        raise UsageError(f"--privacy-unit-column {column!r} is a value column of --input: give the column of the "
                         "unit ids")


def _unit_level(name: str, params: Any, unit: PrivacyUnit) -> Any:
    """``params`` at the level of ``unit`` (a count's sum params are checked; its transform takes the unit)."""
    if name == "count":
        params_or_usage_error(lambda: params.as_sum_params().with_privacy_unit(unit), name)
        return params
    return params_or_usage_error(lambda: params.with_privacy_unit(unit), name)


def warn_unspent(params: dict[str, Any]) -> list[str]:
    """Say (a warning per share, returned too) which transforms can spend less than their budget share
    by the public last step (``beam_dp.core.budget.share_use``): e.g. ``--calibration paper``, whose
    certified sigma is far above the exact one, or a clock too short for the window tree's nodes."""
    from beam_dp.core.budget import share_use

    said = []
    for name, p in params.items():
        use = share_use(name, p)
        if use.unspent:
            said.append(f"{use.describe()} of its share: the rest of the job's budget is left unspent"
                        + (" (--calibration analytic spends it)" if getattr(p, "calibration", None) == "paper" else ""))
            log.warning("beam_dp: %s", said[-1])
    return said


def default_stream_groups(streaming: bool) -> int:
    """``--stream-groups`` when not given: 256 keys spread a streaming job's release stage over a cluster
    (fixed at launch); a batch replay on one machine pays a group's fixed cost per step, so 4."""
    return 256 if streaming else 4


def _with_stream_groups(params: Any, groups: int) -> Any:
    """``params`` keyed by ``groups`` groups of streams where its mechanism steps groups and no stream ends
    alone by the idle rule (else unchanged: keyed by stream)."""
    from beam_dp.mechanisms.stream_groups import groups_for

    if getattr(params, "idle_steps", None) is not None or groups_for(params.build_mechanism(), groups) is None:
        return params
    return params_or_usage_error(lambda: dataclasses.replace(params, stream_groups=groups), "stream groups")


def build(pipeline, job: Plan, opts, messages=None) -> dict:
    """Add the job to ``pipeline``; returns ``{output name: ContinualOutputs}``.

    ``messages``: a PTransform of raw JSON messages (a ``TestStream`` in tests) used in place of
    the Pub/Sub / Kafka source.
    """
    import beam_dp.beam as transforms
    from pipelines.common import ReadEvents, write_dead_letters, write_releases

    if job.unit is None:
        events, bad_rows = pipeline | "ReadEvents" >> ReadEvents(opts, job.pattern, messages)
    elif job.streaming or messages is not None:  # JSON messages with the unit field (the transforms check it)
        import apache_beam as beam

        from beam_dp.steps.events import DEAD_LETTER
        from pipelines.common import ReadMessages

        read = pipeline | "ReadEvents" >> ReadMessages(opts, messages, as_event=False)
        events = read.events | "UnitMessages" >> beam.Map(_unit_message, job.unit.column)
        bad_rows = read[DEAD_LETTER]
    else:
        from beam_dp.beam.shell.units import ReadUnitEventFiles

        events, bad_rows = pipeline | "ReadEvents" >> ReadUnitEventFiles(job.pattern, job.unit.column, batches=True)
    counted = {} if job.unit is None else {"privacy_unit": job.unit}  # the other params are unit-level already
    outputs = {name: events | _TRANSFORMS[name] >> getattr(transforms, _TRANSFORMS[name])(
        params, **(counted if name == "count" else {})) for name, params in job.params.items()}
    dead = {"read": bad_rows}
    for name, out in outputs.items():
        write_releases(out.releases, job.out_dir, name, opts.format, job.streaming,
                       columnar=job.params[name].stream_groups is not None)
        dead[name] = out.dead_letter
    write_dead_letters(dead, private_dir(opts), job.streaming)
    return outputs


def _unit_message(event: dict, column: str) -> dict:
    """A JSON message's event with its unit field: ``stream_id``, ``timestamp``, ``value`` (or
    ``value_0..value_{d-1}``, as ``ParseMessages`` reads them) and ``column``."""
    value = event.get("value")
    if value is None:
        columns = sorted((k for k in event if k.startswith("value_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        value = [event[k] for k in columns] if columns else None
    return {"stream_id": event.get("stream_id"), "timestamp": event.get("timestamp"), "value": value,
            column: event.get(column)}


def _dim_of(pattern: str) -> int:
    """The value dimension from the files' header (checked alike across the glob); a usage error for
    a header the job cannot use."""
    from beam_dp.io.sources import nested_value_column, value_columns
    from pipelines.common import input_header

    path, names, types = input_header(pattern)
    require_columns(names, ("stream_id", "timestamp"), "--input")
    try:
        columns = value_columns(names)
    except ValueError as exc:
        raise UsageError(f"--input {path}: {exc}") from None
    problem = nested_value_column(types, columns)
    if problem:
        raise UsageError(f"--input {path}: {problem}")
    return len(columns)


def summary(job: Plan, opts) -> list[str]:
    """The job's own summary lines: input, schedule, noise at the last step, the budget split and its
    verification from the written release files."""
    source = "embedded demo dataset" if job.demo else (opts.input or opts.source)
    lines = [f"  input: {source}; dim={job.dim}; steps of {job.clock.period:g}s, {job.clock.last_step} steps"]
    import json

    import pyarrow.compute as pc

    from beam_dp.core.budget import share_use
    from beam_dp.verify import VERIFIED_COLUMNS, JobVerifier
    from pipelines.common import release_tables

    verifier = JobVerifier()
    for name in job.params:
        noise_std = None
        for table in release_tables(job.out_dir, name, VERIFIED_COLUMNS):
            verifier.add(table)
            if noise_std is None and (at := pc.index(table.column("step"), job.clock.last_step).as_py()) >= 0:
                noise_std = json.loads(table.column("meta")[at].as_py()).get("noise_std")
        if noise_std:
            lines.append(f"  {name}: noise std at the last step {noise_std:.3g}")
    shares = ", ".join(f"{name} epsilon={params.epsilon:.4g}" for name, params in job.params.items())
    lines.append(f"  job budget: ({opts.epsilon:g}, {opts.delta:g}) per contribution, split as {shares}")
    uses = [share_use(name, params) for name, params in job.params.items()]
    lines.append("  share planned -> most spent: " + ", ".join(
        f"{u.name} {u.planned_epsilon:.4g} -> {u.spendable_epsilon:.4g} ({100 * u.ratio:.1f}%)" for u in uses))
    return lines + verified_lines(verifier)


def write_demo(job: Plan) -> str:
    return f"wrote the embedded demo dataset ({demo_data.write_demo_events(job.pattern)} events) to {job.pattern}"


JOB = Job(NAME, __doc__.split("\n\n")[0], plan, build, summary, write_demo)


def run(options, job: Plan, messages=None) -> str:
    """Run a planned job (tests pass ``messages``, a ``TestStream`` in place of Pub/Sub or Kafka)."""
    from pipelines.runner import run as run_job

    return run_job(options, JOB, job, messages)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, JOB)


if __name__ == "__main__":
    raise SystemExit(main())
