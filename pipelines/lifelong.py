"""Private lifelong learning on a stream of tasks: one model snapshot per task and stream (``LifelongLearner``).

Records: ``stream_id``, ``task_id``, ``x_0..x_{d-1}`` (clipped to [-1, 1]) and ``label`` (an integer
class in [0, ``--classes``)). Tasks arrive in the declared public order ``--tasks``; a batch replay
closes every task at the end of the input, a stream closes a task with a record
``{"stream_id": .., "task_id": .., "end_of_task": true}``. The default learner is the sound
``BoundedAGEMConfig`` (DP-SGD + A-GEM with bounded memory use: (epsilon, delta)-DP per example from
dp-accounting); ``--learner naive_gaussian`` is the paper's baseline and ``l2dp`` the paper's L2DP-ML
(its epsilon is the paper's claim, labelled ``paper_claim``). ``--eval-input`` (public test rows
with ``task_id``) adds ``meta["accuracy"]`` to each snapshot. Needs torch. With no ``--input`` the job
runs on scikit-learn's digits split into three tasks (classes 0-3, 4-6, 7-9; 20% held out for eval).

    python -m pipelines.lifelong --help
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

from beam_dp.beam import LifelongLearner, LifelongParams
from beam_dp.beam.lifelong import END_OF_TASK
from beam_dp.mechanisms.lifelong.config import BoundedAGEMConfig, L2DPConfig, NaiveGaussianConfig
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
from pipelines.records import ReadRecords, column_names, features_of, indexed_columns, number, read_rows

log = logging.getLogger("beam_dp.lifelong")

PROG = "python -m pipelines.lifelong"
LEARNERS = {"bounded_agem": BoundedAGEMConfig, "naive_gaussian": NaiveGaussianConfig, "l2dp": L2DPConfig}
DEMO_GROUPS = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))


class LifelongOptions(JobOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp lifelong")
        g.add_argument("--input", default=None,
                       help="CSV/Parquet/JSON-lines files with stream_id, task_id, x_0..x_{d-1}, label. "
                            "Default: scikit-learn's digits in three tasks.")
        add_source_flags(g)
        g.add_argument("--eval-input", "--eval_input", dest="eval_input", default=None,
                       help="Public evaluation rows (task_id, x_0.., label; >= 32 per task) for meta accuracy.")
        g.add_argument("--output", default="output/lifelong",
                       help="Output folder: models-*.parquet and dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--learner", choices=tuple(LEARNERS), default="bounded_agem",
                       help="bounded_agem (sound (epsilon, delta)-DP, default), naive_gaussian, or l2dp "
                            "(the paper's claim).")
        g.add_argument("--tasks", default=None,
                       help="Comma-separated task ids in their public order (required with --input or a stream).")
        g.add_argument("--classes", type=int, default=None, help="Number of classes K (required with --input).")
        g.add_argument("--dim", type=int, default=None,
                       help="Input dimension d (required with a streaming source; files: from the header).")
        g.add_argument("--epsilon", type=float, default=1.0, help="Privacy budget per example. Default: %(default)s")
        g.add_argument("--delta", type=float, default=1e-5, help="delta (DP-SGD learners). Default: %(default)s")
        g.add_argument("--clip-norm", "--clip_norm", dest="clip_norm", type=float, default=1.0,
                       help="DP-SGD per-example gradient clip norm. Default: %(default)s")
        g.add_argument("--memory-uses", "--memory_uses", dest="memory_uses", type=int, default=50,
                       help="bounded_agem: most times an example is replayed from memory. Default: %(default)s")
        g.add_argument("--hidden", type=int, default=32, help="Width of the input layer. Default: %(default)s")
        g.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32,
                       help="Batch size lambda. Default: %(default)s")
        g.add_argument("--epochs", type=int, default=1, help="Epochs per task. Default: %(default)s")
        g.add_argument("--steps-per-task", "--steps_per_task", dest="steps_per_task", type=int, default=None,
                       help="Fixed optimiser steps per task instead of epochs.")
        g.add_argument("--learning-rate", "--learning_rate", dest="learning_rate", type=float, default=1e-3,
                       help="Learning rate. Default: %(default)s")
        g.add_argument("--device", choices=("cpu", "auto"), default="auto",
                       help="auto: workers train on CUDA when present; cpu: never. Default: %(default)s")
        g.add_argument("--torch-threads", "--torch_threads", dest="torch_threads", type=int, default=None,
                       help="torch intra-op threads per worker.")
        g.add_argument("--streams", default=None, help="Comma-separated declared streams (each releases every task).")
        add_noise_key_flags(g)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: Path
    params: LifelongParams
    streaming: bool


def _eval_sets(pattern: str, dim: int, tasks: tuple[str, ...]) -> dict:
    by_task: dict[str, tuple[list, list]] = {}
    for row in read_rows(pattern, "--eval-input"):
        xs, ys = by_task.setdefault(str(row.get("task_id")), ([], []))
        xs.append(features_of(row, dim))
        ys.append(row.get("label"))
    unknown = set(by_task) - set(tasks)
    if unknown:
        raise UsageError(f"--eval-input has task ids that are not in --tasks: {sorted(unknown)[:3]}")
    try:
        return {t: (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)) for t, (x, y) in by_task.items()}
    except (TypeError, ValueError):
        raise UsageError("--eval-input: features and labels must be numbers") from None


def plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(LifelongOptions)
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    out_dir = Path(opts.output)
    demo = opts.input is None and opts.source == "files"
    if demo:
        pattern, eval_pattern = str(out_dir / "demo_tasks.csv"), str(out_dir / "demo_eval.csv")
        write_demo(pattern, eval_pattern)  # needed now: the eval sets are part of the params
        dim, classes, tasks = 64, 10, tuple(str(i) for i in range(len(DEMO_GROUPS)))
    else:
        missing = [f for f, v in (("--tasks", opts.tasks), ("--classes", opts.classes)) if v is None]
        if missing:
            raise UsageError(f"{', '.join(missing)} required: the task order and classes are public")
        pattern, eval_pattern = opts.input, opts.eval_input
        tasks = tuple(t for t in opts.tasks.split(",") if t)
        classes = opts.classes
        if opts.source == "files":
            dim = len(indexed_columns(column_names(pattern), "x"))
            if not dim:
                raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, task_id, label)")
            if opts.dim is not None and opts.dim != dim:
                raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
        elif opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        else:
            dim = opts.dim
    eval_sets = _eval_sets(eval_pattern, dim, tasks) if eval_pattern else None
    common: dict[str, Any] = dict(
        input_dim=dim, n_classes=classes, hidden=opts.hidden, batch_size=opts.batch_size, epochs=opts.epochs,
        steps_per_task=opts.steps_per_task, learning_rate=opts.learning_rate, task_ids=tasks, eval_sets=eval_sets,
        epsilon=opts.epsilon)
    if opts.learner == "bounded_agem":
        common.update(delta=opts.delta, clip_norm=opts.clip_norm, memory_uses=opts.memory_uses)
    elif opts.learner == "naive_gaussian":
        common.update(delta=opts.delta, clip_norm=opts.clip_norm, num_tasks=len(tasks))
    learner = params_or_usage_error(lambda: LEARNERS[opts.learner](**common), opts.learner)
    params = params_or_usage_error(lambda: LifelongParams(
        learner, streams=tuple(s for s in opts.streams.split(",") if s) if opts.streams else None,
        noise_key=noise_key_of(opts), allow_cuda=opts.device == "auto", torch_threads=opts.torch_threads),
        "lifelong")
    return Plan(demo, pattern, out_dir, params, streaming)


def _integer(value: Any) -> Any:
    value = number(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def to_task_row(row: dict, dim: int) -> tuple:
    """A row -> ``(stream_id, task_id, x, y)``, or ``(stream_id, task_id, END_OF_TASK)`` for an end marker."""
    task = row.get("task_id")
    task = str(_integer(task)) if isinstance(task, (int, float)) and not isinstance(task, bool) else task
    if row.get("end_of_task") is True:
        return row.get("stream_id"), task, END_OF_TASK
    return row.get("stream_id"), task, features_of(row, dim), _integer(row.get("label"))


def build(pipeline: beam.Pipeline, job: Plan, opts: LifelongOptions, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``."""
    records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages)
    out = (records
           | "ToTaskRows" >> beam.Map(to_task_row, job.params.learner.input_dim)
           | "LifelongLearner" >> LifelongLearner(job.params))
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, job.out_dir, job.streaming)
    return out


def write_demo(path: str, eval_path: str, seed: int = 0) -> int:
    """Digits (x / 8 - 1 in [-1, 1]) split 80/20 by a fixed permutation, tasks = class groups."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data / 8.0 - 1.0, digits.target
    perm = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    task_of = {c: i for i, group in enumerate(DEMO_GROUPS) for c in group}
    header = "stream_id,task_id," + ",".join(f"x_{i}" for i in range(x.shape[1])) + ",label"
    for target, idx in ((path, perm[:cut]), (eval_path, perm[cut:])):
        idx = sorted(idx, key=lambda i: (task_of[y[i]], i))  # tasks in order
        lines = [header] + [f"digits,{task_of[y[i]]}," + ",".join(f"{v:g}" for v in x[i]) + f",{y[i]}" for i in idx]
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text("\n".join(lines) + "\n")
    return cut


def run(options: PipelineOptions, job: Plan, messages=None) -> str:
    import json

    opts = options.view_as(LifelongOptions)
    prepare_output(job.out_dir)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, job, opts, messages)
    result = pipeline.run()
    result.wait_until_finish()
    source = "scikit-learn digits, 3 tasks" if job.demo else (opts.input or opts.source)
    lines = [f"beam_dp lifelong ({opts.learner}): releases written under {job.out_dir.resolve()}",
             f"  input: {source}; tasks {', '.join(job.params.learner.task_ids)}"]
    lines += output_summary(job.out_dir, ["models"])
    from beam_dp.io import read_releases

    try:
        rows = read_releases(str(job.out_dir / "models-*"))
    except FileNotFoundError:
        rows = []
    for row in rows:
        accuracy = (row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"])).get("accuracy")
        if accuracy:
            lines.append(f"  {row['stream']} after task {row['step']}: accuracy "
                         + ", ".join(f"{t}={a:.3f}" for t, a in sorted(accuracy.items())))
    return "\n".join(lines + [metrics_summary(result)])


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, prog=PROG, description=__doc__.split("\n\n")[0], options_class=LifelongOptions,
                   plan=plan, run=run)


if __name__ == "__main__":
    raise SystemExit(main())
