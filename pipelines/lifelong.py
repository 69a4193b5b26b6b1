"""Private lifelong learning on a stream of tasks: one model snapshot per task and stream (``LifelongLearner``).

Records: ``stream_id``, ``task_id``, ``x_0..x_{d-1}`` (clipped to [-1, 1]) and ``label`` (an integer
class in [0, ``--classes``)). Tasks arrive in the declared public order ``--tasks``; a batch replay
closes every task at the end of the input, a stream closes a task with a record
``{"stream_id": .., "task_id": .., "end_of_task": true}``. The default learner is the sound
``BoundedAGEMConfig`` (DP-SGD + A-GEM with bounded memory use: (epsilon, delta)-DP per example from
dp-accounting); ``--learner naive_gaussian`` is the paper's baseline and ``l2dp`` the paper's L2DP-ML
(its epsilon is the paper's claim, labelled ``paper_claim``). The DP-SGD learners need ``--task-size``,
the public declared rows per task (it sets the sampling rate and the step count; the true count stays
private). ``--eval-input`` (public test rows
with ``task_id``) adds ``meta["accuracy"]`` to each snapshot. Needs torch. With no ``--input`` the job
runs a demo on *permuted digits*: scikit-learn's digits in three tasks of all ten classes, each task a
third of the training rows with its pixels shuffled by a fixed public permutation (task 0: none), 20% held
out for eval; it prints the non-private A-GEM reference beside the private accuracy.
``--privacy-unit-column COL --max-unit-records K`` (a batch replay of ``--input`` files; every task closes at
the end of the input, no end markers) protects one unit's whole contribution of at most K training rows
instead of one row (group privacy of the learner's guarantee, ``docs/lifelong.md``).

    python -m pipelines.lifelong --help
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipelines.outputs import private_dir
from pipelines.paths import join, write_text
from pipelines.record_units import record_unit, unit_id
from pipelines.rows import features_of, number, require_columns
from pipelines.runner import Job, UsageError, noise_key_of, options_class, params_or_usage_error, run_cli, split_list

NAME = "lifelong"
PROG = f"python -m pipelines.{NAME}"
#: --learner -> config class in beam_dp.mechanisms.lifelong.config
LEARNERS = {"bounded_agem": "BoundedAGEMConfig", "naive_gaussian": "NaiveGaussianConfig", "l2dp": "L2DPConfig"}
DEMO_TASKS = 3
#: demo settings where the flag keeps its default: ~480 rows per task need more passes and a larger step
#: than the defaults to learn under noise (values chosen on the demo data, see docs/lifelong.md)
DEMO_SETTINGS = {"epochs": 10, "learning_rate": 1e-2, "clip_norm": 0.5, "batch_size": 64, "memory_uses": 20}
END_OF_TASK_FIELD = "end_of_task"


def __getattr__(name: str):  # the options class needs Beam: built on first use, not at import (fast --help)
    if name == "LifelongOptions":
        return options_class(NAME)
    raise AttributeError(name)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: str
    params: Any
    streaming: bool
    classes: tuple[str, ...]
    outputs: tuple[str, ...] = ("models",)


def _eval_sets(pattern: str, dim: int, tasks: tuple[str, ...], classes: tuple[str, ...]) -> dict:
    import numpy as np

    from pipelines.records import read_rows

    by_task: dict[str, tuple[list, list]] = {}
    for row in read_rows(pattern, "--eval-input"):
        xs, ys = by_task.setdefault(str(row.get("task_id")), ([], []))
        xs.append(features_of(row, dim))
        ys.append(class_index(row.get("label"), classes))
        if ys[-1] < 0:
            raise UsageError(f"--eval-input has a label outside --classes: {row.get('label')!r}"[:200])
    unknown = set(by_task) - set(tasks)
    if unknown:
        raise UsageError(f"--eval-input has task ids that are not in --tasks: {sorted(unknown)[:3]}")
    try:
        return {t: (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)) for t, (x, y) in by_task.items()}
    except (TypeError, ValueError):
        raise UsageError("--eval-input: features and labels must be numbers") from None


def plan(options) -> Plan:
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.beam import LifelongParams
    from beam_dp.mechanisms.lifelong import config
    from pipelines.common import check_source
    from pipelines.records import column_names, indexed_columns

    opts = options.view_as(options_class(NAME))
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    out_dir = opts.output
    demo = opts.input is None and opts.source == "files"
    unit = record_unit(opts, demo, opts.input)
    if unit is not None and (streaming or opts.source != "files"):
        raise UsageError("--privacy-unit-column runs lifelong on a batch replay of --input files only: a unit's "
                         "tasks close at the end of the input (no END_OF_TASK markers)")
    if demo:
        pattern, eval_pattern = (join(private_dir(opts), name) for name in ("demo_tasks.csv", "demo_eval.csv"))
        demo_sizes = write_demo(pattern, eval_pattern)  # needed now: the eval sets are part of the params
        dim, classes, tasks = 64, tuple(str(i) for i in range(10)), tuple(str(i) for i in range(DEMO_TASKS))
    else:
        missing = [f for f, v in (("--tasks", opts.tasks), ("--classes", opts.classes)) if v is None]
        if missing:
            raise UsageError(f"{', '.join(missing)} required: the task order and classes are public")
        pattern, eval_pattern = opts.input, opts.eval_input
        tasks = split_list(opts.tasks, "--tasks")
        classes = split_list(opts.classes, "--classes")
        if opts.source == "files":
            header = column_names(pattern)
            require_columns(header, ("stream_id", "task_id", "label"), "--input")
            dim = len(indexed_columns(header, "x"))
            if not dim:
                raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, task_id, "
                                 "label)")
            if opts.dim is not None and opts.dim != dim:
                raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
        elif opts.dim is None:
            raise UsageError(f"--dim is required with --source {opts.source}")
        else:
            dim = opts.dim
    eval_sets = _eval_sets(eval_pattern, dim, tasks, classes) if eval_pattern else None
    learner_class = getattr(config, LEARNERS[opts.learner])
    given: dict[str, Any] = dict(
        input_dim=dim, n_classes=len(classes), task_ids=tasks, num_tasks=len(tasks), eval_sets=eval_sets,
        g_layers=_layers(opts.g_layers), **{name: getattr(opts, name) for name in _LEARNER_FLAGS})
    if demo:
        from pipelines.spec import job_params

        defaults = {p.name: p.default for p in job_params(NAME)}
        given.update({k: v for k, v in DEMO_SETTINGS.items() if getattr(opts, k) == defaults[k]})
    accepted = {f.name for f in dataclasses.fields(learner_class)}  # each learner takes its own subset
    kwargs = {k: v for k, v in given.items() if k in accepted and v is not None}
    if "task_size" in accepted and "task_size" not in kwargs:
        if not demo:
            raise UsageError(f"--task-size required with --learner {opts.learner}: the public, declared number of "
                             "rows per task (the sampling rate and step count come from it; the true count stays "
                             "private)")
        kwargs["task_size"] = demo_sizes  # the demo's data set is public, so are its task sizes
    learner = params_or_usage_error(lambda: learner_class(**kwargs), opts.learner)
    params = params_or_usage_error(lambda: LifelongParams(
        learner, streams=split_list(opts.streams, "--streams"), noise_key=noise_key_of(opts),
        allow_cuda=opts.device == "auto",
        torch_threads=opts.torch_threads or (1 if demo else None)), "lifelong")  # demo: a tiny network
    if unit is not None:
        params = params_or_usage_error(lambda: params.with_privacy_unit(unit), "privacy unit")
    return Plan(demo, pattern, out_dir, params, streaming, classes)


_LEARNER_FLAGS = ("task_size", "micro_batch", "hidden", "batch_size", "epochs", "steps_per_task", "learning_rate", "optimizer", "dtype",
                  "eval_batch", "agem_always_project", "epsilon", "delta", "clip_norm", "memory_uses", "memory_share",
                  "accountant", "noise_multiplier", "rho_s", "b_theta", "ae_mode", "label_path", "encoder_batch_norm")


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(w) for w in split_list(text, "--g-layers"))
    except ValueError:
        raise UsageError(f"--g-layers must be comma-separated positive integers, got {text!r}"[:200]) from None


def class_index(label: Any, classes: tuple[str, ...]) -> int:
    """A label -> its index in the public ``--classes`` (matched as text: 3, 3.0 and "3" are "3");
    -1 (dead-lettered by the learner as a bad label) for a label outside them."""
    label = _integer(label)
    text = str(label) if isinstance(label, (int, str)) and not isinstance(label, bool) else None
    return classes.index(text) if text in classes else -1


def _integer(value: Any) -> Any:
    value = number(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def to_task_row(row: dict, dim: int, classes: tuple[str, ...], unit_column: str | None = None) -> tuple:
    """A row -> ``(stream_id, task_id, x, class index)``, or ``(stream_id, task_id, END_OF_TASK)`` for an end
    marker; with ``unit_column``, that cell (the unit id) appended."""
    from beam_dp.beam.lifelong import END_OF_TASK

    task = row.get("task_id")
    task = str(_integer(task)) if isinstance(task, (int, float)) and not isinstance(task, bool) else task
    if row.get(END_OF_TASK_FIELD) is True:
        element: tuple = (row.get("stream_id"), task, END_OF_TASK)
    else:
        element = (row.get("stream_id"), task, features_of(row, dim), class_index(row.get("label"), classes))
    return element + ((unit_id(row.get(unit_column)),) if unit_column is not None else ())


def build(pipeline, job: Plan, opts, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``."""

    from beam_dp.beam import LifelongLearner
    from pipelines.common import write_dead_letters, write_releases
    from pipelines.records import ReadRecords, Records

    unit = job.params.privacy_unit
    to_row = partial(to_task_row, dim=job.params.learner.input_dim, classes=job.classes,
                     unit_column=None if unit is None else unit.column)
    if unit is not None:  # one row at a time, with its unit id, as the unit stage bounds them
        import apache_beam as beam

        rows, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern)
        records = rows | "ToUnitRows" >> beam.Map(to_row)
    else:
        records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages, Records(to_row))
    out = records | "LifelongLearner" >> LifelongLearner(job.params)
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, private_dir(opts), job.streaming)
    return out


def demo_tasks(seed: int = 0) -> tuple[list, dict]:
    """Permuted digits (x / 8 - 1 in [-1, 1]): a fixed 80/20 split; task t = the t-th third of the training rows
    with pixels permuted by a fixed public permutation (task 0: identity); its eval set = all held-out rows
    under the same permutation. Returns ``(tasks, eval_sets)``."""
    import numpy as np
    from sklearn.datasets import load_digits

    from beam_dp.mechanisms.lifelong import TaskData

    digits = load_digits()
    x, y = digits.data / 8.0 - 1.0, digits.target
    perm = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    tasks, evals = [], {}
    for t, rows in enumerate(np.array_split(perm[:cut], DEMO_TASKS)):
        pixels = np.arange(x.shape[1]) if t == 0 else np.random.default_rng(seed + 100 + t).permutation(x.shape[1])
        tasks.append(TaskData(str(t), x[rows][:, pixels], y[rows]))
        evals[str(t)] = (x[perm[cut:]][:, pixels], y[perm[cut:]])
    return tasks, evals


def write_demo(path: str, eval_path: str, seed: int = 0) -> dict[str, int]:
    """Write :func:`demo_tasks` as CSV; returns the training rows per task (public: the demo data set is)."""
    tasks, evals = demo_tasks(seed)
    header = "stream_id,task_id," + ",".join(f"x_{i}" for i in range(tasks[0].x.shape[1])) + ",label"
    for target, blocks in ((path, [(t.task_id, t.x, t.y) for t in tasks]),
                           (eval_path, [(t, x, y) for t, (x, y) in evals.items()])):
        lines = [header] + [f"digits,{task}," + ",".join(f"{v:g}" for v in row) + f",{label}"
                            for task, x, y in blocks for row, label in zip(x, y)]
        write_text(target, "\n".join(lines) + "\n")
    return {t.task_id: len(t) for t in tasks}


def demo_reference(learner_config, threads: int | None) -> float:
    """Average accuracy after the last demo task of non-private A-GEM with the private learner's network,
    schedule and optimiser (a reference line: NOT private, computed on the public demo data only)."""
    import dataclasses

    import numpy as np

    from beam_dp.core import NoiseSource
    from beam_dp.mechanisms.lifelong import AGEMConfig, LifelongConfig, build_learner, set_threads

    set_threads(threads)
    shared = {f.name: getattr(learner_config, f.name) for f in dataclasses.fields(LifelongConfig)}
    learner = build_learner(AGEMConfig(**{**shared, "device": "cpu"}))
    state, release = learner.init_state("digits"), None
    noise = NoiseSource(b"public demo reference, not a key")
    for task in demo_tasks()[0]:
        state, (release,) = learner.step(state, learner.merge_blocks([task]), noise)
    return float(np.mean(list(release.meta["accuracy"].values())))


def summary(job: Plan, opts) -> list[str]:
    """Input, tasks, and the public accuracy of each task snapshot (with --eval-input); the demo adds the
    non-private reference and what the numbers mean."""
    from beam_dp.io import read_releases

    source = f"permuted digits, {DEMO_TASKS} tasks" if job.demo else (opts.input or opts.source)
    lines = [f"  {opts.learner}; input: {source}; tasks {', '.join(job.params.learner.task_ids)}"]
    try:
        rows = read_releases(join(job.out_dir, "models-*"))
    except FileNotFoundError:
        rows = []
    average = None
    for row in rows:
        accuracy = row["meta"].get("accuracy")
        if accuracy:
            average = row["meta"].get("average_accuracy")
            lines.append(f"  {row['stream']} after task {row['step']}: accuracy "
                         + ", ".join(f"{t}={a:.3f}" for t, a in sorted(accuracy.items()))
                         + (f" (average {average:.3f})" if average is not None else ""))
    if job.demo and average is not None:
        reference, chance = demo_reference(job.params.learner, job.params.torch_threads), 0.1
        lines.append(f"  non-private A-GEM on the same tasks and settings (reference, NOT private): average "
                     f"{reference:.3f}; chance: {chance:.2f}")
        verdict = ("learns well above chance" if average >= 2 * chance else
                   "does NOT learn visibly above chance at this size")
        rows_per_task = min(len(task) for task in demo_tasks()[0])  # public: the demo data set is (any learner)
        lines.append(f"  The private model (epsilon {job.params.learner.epsilon:g} for each example over all tasks) "
                     f"{verdict}; the gap to the non-private reference is the price of privacy with ~"
                     f"{rows_per_task} rows per task (more rows per task narrow it).")
    return lines


JOB = Job(NAME, __doc__.split("\n\n")[0], plan, build, summary)


def run(options, job: Plan, messages=None) -> str:
    """Run a planned job (tests pass ``messages``, a ``TestStream`` in place of Pub/Sub or Kafka)."""
    from pipelines.runner import run as run_job

    return run_job(options, JOB, job, messages)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, JOB)


if __name__ == "__main__":
    raise SystemExit(main())
