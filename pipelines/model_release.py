"""Release privately trained linear models from streams of labelled examples (the ERM family).

``--algorithm continual`` (Algorithm 4/8: a model over the whole stream so far, every ``--update-size``
examples from ``--base-size`` on), ``multiresolution`` (Algorithm 2/6: models on dyadic blocks of
``--block-size`` examples) or ``sliding`` (Algorithm 5: a model over the last ``--window`` examples, every
``--block-size``). ``--classes`` selects multiclass logistic regression; without it, Huber regression.
Steps are count steps per stream (arrival order and counts are public). With no ``--input`` the job
runs on scikit-learn's bundled digits (one stream, 10 classes, features scaled to [0, 1]). With
``--privacy-unit-column COL --max-unit-records K`` (files, or the messages' field COL) every model protects one
unit's at most ``K`` examples instead of one example (``pipelines.record_units``, ``docs/erm.md``).

    python -m pipelines.model_release --help
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pipelines.outputs import private_dir
from pipelines.paths import join, write_text
from pipelines.record_units import record_unit, unit_id, with_unit
from pipelines.rows import features_of, number, require_columns
from pipelines.runner import Job, UsageError, noise_key_of, options_class, params_or_usage_error, run_cli, split_list

NAME = "model_release"
PROG = f"python -m pipelines.{NAME}"
#: --algorithm -> (params class, transform class) in beam_dp.beam
ALGORITHMS = {
    "continual": ("ContinualModelParams", "ContinualModelRelease"),
    "multiresolution": ("MultiResolutionParams", "MultiResolutionRelease"),
    "sliding": ("SlidingWindowModelParams", "SlidingWindowModelRelease"),
}


def __getattr__(name: str):  # the options class needs Beam: built on first use, not at import (fast --help)
    if name == "ModelReleaseOptions":
        return options_class(NAME)
    raise AttributeError(name)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: str
    params: Any
    streaming: bool
    outputs: tuple[str, ...] = ("models",)


def plan(options) -> Plan:
    from apache_beam.options.pipeline_options import StandardOptions

    import beam_dp.beam as transforms
    from pipelines.common import check_source
    from pipelines.records import column_names, indexed_columns

    opts = options.view_as(options_class(NAME))
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    out_dir = opts.output
    demo = opts.input is None and opts.source == "files"
    classes = split_list(opts.classes, "--classes")
    if demo:
        dim, classes = 64, classes or tuple(str(i) for i in range(10))
        pattern = join(private_dir(opts), "demo_digits.csv")
    elif opts.source == "files":
        pattern = opts.input
        header = column_names(pattern)
        require_columns(header, ("stream_id", "label"), "--input")
        dim = len(indexed_columns(header, "x"))
        if not dim:
            raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, label)")
        if opts.dim is not None and opts.dim != dim:
            raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
    elif opts.dim is None:
        raise UsageError(f"--dim is required with --source {opts.source}")
    else:
        dim, pattern = opts.dim, None
    params_type = getattr(transforms, ALGORITHMS[opts.algorithm][0])
    common = dict(n_features=dim, classes=classes, lam=opts.lam, epsilon=opts.epsilon, delta=opts.delta,
                  noise=opts.noise, clip_bound=opts.clip_bound, huber=opts.huber, granularity=opts.granularity,
                  streams=split_list(opts.streams, "--streams"), noise_key=noise_key_of(opts))
    sampling = opts.sampling
    if opts.algorithm == "continual":
        extra = dict(update=opts.update_size, base=opts.base_size, variant=opts.variant, sampling=sampling,
                     base_fraction=opts.base_fraction)
    elif opts.algorithm == "multiresolution":
        extra = dict(block=opts.block_size, max_level=opts.max_level, sampling=sampling)
    else:
        extra = dict(block=opts.block_size, window=opts.window or 7 * opts.block_size, sampling=sampling)
    unit = record_unit(opts, demo, pattern)
    params = with_unit(params_or_usage_error(lambda: params_type(**common, **extra), opts.algorithm), unit,
                       "privacy unit")
    return Plan(demo, pattern, out_dir, params, streaming)


def _class_label(label: Any) -> Any:
    """Labels match the declared classes as text: 3, 3.0 and "3" are all the class "3"."""
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    if isinstance(label, int) and not isinstance(label, bool):
        return str(label)
    return label


def to_example(row: dict, dim: int, classification: bool) -> tuple:
    """A record ``{stream_id, x_0.. | features, label}`` -> the ERM element ``(stream_id, features, label)``."""
    label = row.get("label")
    return row.get("stream_id"), features_of(row, dim), _class_label(label) if classification else number(label)


def to_unit_example(row: dict, dim: int, classification: bool, column: str) -> tuple:
    """A record with a unit column -> ``(stream_id, features, label, unit id)`` (the unit stage strips the id)."""
    return to_example(row, dim, classification) + (unit_id(row.get(column)),)


def labelled(params: Any):
    """How the job reads its examples (``pipelines.records.Labelled``): files in columns, messages by ``to_example``."""
    from pipelines.records import Labelled

    classification = params.classes is not None
    return Labelled(params.n_features, partial(to_example, dim=params.n_features, classification=classification),
                    _class_label if classification else None)


def build(pipeline, job: Plan, opts, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``."""
    import apache_beam as beam

    import beam_dp.beam as transforms
    from pipelines.common import write_dead_letters, write_releases
    from pipelines.records import ReadRecords

    params = job.params
    if params.privacy_unit is None:
        examples, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages, labelled(params))
    else:  # one row at a time, with its unit id (the columnar blocks have no unit column)
        rows, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages)
        examples = rows | "ToUnitExamples" >> beam.Map(
            to_unit_example, dim=params.n_features, classification=params.classes is not None,
            column=params.privacy_unit.column)
    name = ALGORITHMS[opts.algorithm][1]
    out = examples | name >> getattr(transforms, name)(params)
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, private_dir(opts), job.streaming)
    return out


def write_demo(path: str) -> int:
    """scikit-learn's digits as a CSV of examples (stream ``digits``, features / 16, label 0..9)."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x, y = digits.data[order] / 16.0, digits.target[order]
    header = "stream_id," + ",".join(f"x_{i}" for i in range(x.shape[1])) + ",label"
    lines = [header] + ["digits," + ",".join(f"{v:g}" for v in row) + f",{label}" for row, label in zip(x, y)]
    write_text(path, "\n".join(lines) + "\n")
    return len(y)


def summary(job: Plan, opts) -> list[str]:
    source = "scikit-learn digits" if job.demo else (opts.input or opts.source)
    return [f"  {opts.algorithm}; input: {source}; {job.params.n_features} features; "
            + (f"{len(job.params.classes)} classes" if job.params.classes else "Huber regression")]


def _write_demo(job: Plan) -> str:
    return f"wrote scikit-learn's digits ({write_demo(job.pattern)} examples) to {job.pattern}"


JOB = Job(NAME, __doc__.split("\n\n")[0], plan, build, summary, _write_demo)


def run(options, job: Plan, messages=None) -> str:
    """Run a planned job (tests pass ``messages``, a ``TestStream`` in place of Pub/Sub or Kafka)."""
    from pipelines.runner import run as run_job

    return run_job(options, JOB, job, messages)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, JOB)


if __name__ == "__main__":
    raise SystemExit(main())
