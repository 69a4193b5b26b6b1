"""Release privately trained linear models from streams of labelled examples (the ERM family).

``--algorithm continual`` (Algorithm 4/8: a model over the whole stream so far, every ``--update-size``
examples from ``--base-size`` on), ``multiresolution`` (Algorithm 2/6: models on dyadic blocks of
``--block-size`` examples) or ``sliding`` (Algorithm 5: a model over the last ``--window`` examples, every
``--block-size``). ``--classes`` selects multiclass logistic regression; without it, Huber regression.
Steps are count steps per stream (arrival order and counts are public). With no ``--input`` the job
runs on scikit-learn's bundled digits (one stream, 10 classes, features scaled to [0, 1]).

    python -m pipelines.model_release --help
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dp.beam import (
    ContinualModelParams,
    ContinualModelRelease,
    MultiResolutionParams,
    MultiResolutionRelease,
    SlidingWindowModelParams,
    SlidingWindowModelRelease,
)
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

log = logging.getLogger("beam_dp.model_release")

PROG = "python -m pipelines.model_release"
ALGORITHMS = {
    "continual": (ContinualModelParams, ContinualModelRelease),
    "multiresolution": (MultiResolutionParams, MultiResolutionRelease),
    "sliding": (SlidingWindowModelParams, SlidingWindowModelRelease),
}


class ModelReleaseOptions(JobOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp model_release")
        g.add_argument("--input", default=None,
                       help="CSV/Parquet/JSON-lines files (or glob) with columns stream_id, x_0..x_{d-1}, label. "
                            "Default: scikit-learn's digits.")
        add_source_flags(g)
        g.add_argument("--output", default="output/model_release",
                       help="Output folder: models-*.parquet and dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="continual",
                       help="continual (Alg. 4/8), multiresolution (Alg. 2/6) or sliding (Alg. 5). Default: %(default)s")
        g.add_argument("--dim", type=int, default=None,
                       help="Number of features d (required with a streaming source; files: from the header).")
        g.add_argument("--classes", default=None,
                       help="Comma-separated public class labels (logistic regression; labels match as text). "
                            "Without it: Huber regression on numeric labels.")
        g.add_argument("--epsilon", type=float, default=1.0, help="Privacy budget per example. Default: %(default)s")
        g.add_argument("--delta", type=float, default=0.0,
                       help="> 0 with --noise gaussian, 0 with gamma. Default: %(default)s")
        g.add_argument("--noise", choices=("gamma", "gaussian"), default="gamma",
                       help="gamma: K-norm noise, pure epsilon-DP; gaussian: (epsilon, delta)-DP.")
        g.add_argument("--clip-bound", "--clip_bound", dest="clip_bound", type=float, default=1.0,
                       help="L2 bound each feature vector is clipped to. Default: %(default)s")
        g.add_argument("--lam", type=float, default=1.0, help="Regularisation strength lambda. Default: %(default)s")
        g.add_argument("--huber", type=float, default=1.0, help="Huber threshold (regression). Default: %(default)s")
        g.add_argument("--update-size", "--update_size", dest="update_size", type=int, default=64,
                       help="continual: b0, examples per update step. Default: %(default)s")
        g.add_argument("--base-size", "--base_size", dest="base_size", type=int, default=256,
                       help="continual: B, examples before the first model (update size divides it). Default: %(default)s")
        g.add_argument("--variant", choices=("cumulative", "basic", "independent"), default="cumulative",
                       help="continual: the release variant. Default: %(default)s")
        g.add_argument("--block-size", "--block_size", dest="block_size", type=int, default=64,
                       help="multiresolution: B per step; sliding: w0 per step. Default: %(default)s")
        g.add_argument("--window", type=int, default=None,
                       help="sliding: w = (2^k - 1) * block size examples. Default: 7 * block size.")
        g.add_argument("--max-level", "--max_level", dest="max_level", type=int, default=None,
                       help="multiresolution: highest dyadic level (default: unbounded).")
        g.add_argument("--sampling", choices=("false", "true"), default="false",
                       help="Algorithms 6/8 (subsampled releases). Default: %(default)s")
        g.add_argument("--streams", default=None,
                       help="Comma-separated declared streams; examples of other streams are dead-lettered.")
        add_noise_key_flags(g)


@dataclass(frozen=True)
class Plan:
    demo: bool
    pattern: str | None
    out_dir: Path
    params: Any
    streaming: bool


def plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(ModelReleaseOptions)
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and opts.input:
        raise UsageError(f"--input reads files: drop it with --source {opts.source}")
    out_dir = Path(opts.output)
    demo = opts.input is None and opts.source == "files"
    classes = tuple(c for c in opts.classes.split(",") if c) if opts.classes else None
    if demo:
        dim, classes = 64, classes or tuple(str(i) for i in range(10))
        pattern = str(out_dir / "demo_digits.csv")
    elif opts.source == "files":
        pattern = opts.input
        dim = len(indexed_columns(column_names(pattern), "x"))
        if not dim:
            raise UsageError("the --input files need feature columns x_0 .. x_{d-1} (and stream_id, label)")
        if opts.dim is not None and opts.dim != dim:
            raise UsageError(f"--dim {opts.dim} but the files have {dim} feature columns")
    elif opts.dim is None:
        raise UsageError(f"--dim is required with --source {opts.source}")
    else:
        dim, pattern = opts.dim, None
    params_type, _ = ALGORITHMS[opts.algorithm]
    common = dict(n_features=dim, classes=classes, lam=opts.lam, epsilon=opts.epsilon, delta=opts.delta,
                  noise=opts.noise, clip_bound=opts.clip_bound, huber=opts.huber,
                  streams=tuple(s for s in opts.streams.split(",") if s) if opts.streams else None,
                  noise_key=noise_key_of(opts))
    sampling = opts.sampling == "true"
    if opts.algorithm == "continual":
        extra = dict(update=opts.update_size, base=opts.base_size, variant=opts.variant, sampling=sampling)
    elif opts.algorithm == "multiresolution":
        extra = dict(block=opts.block_size, max_level=opts.max_level, sampling=sampling)
    else:
        extra = dict(block=opts.block_size, window=opts.window or 7 * opts.block_size, sampling=sampling)
    params = params_or_usage_error(lambda: params_type(**common, **extra), opts.algorithm)
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


def build(pipeline: beam.Pipeline, job: Plan, opts: ModelReleaseOptions, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``ContinualOutputs``."""
    records, bad_rows = pipeline | "ReadRecords" >> ReadRecords(opts, job.pattern, messages)
    params = job.params
    _, transform = ALGORITHMS[opts.algorithm]
    out = (records
           | "ToExamples" >> beam.Map(to_example, params.n_features, params.classes is not None)
           | transform.__name__ >> transform(params))
    write_releases(out.releases, job.out_dir, "models", opts.format, job.streaming)
    write_dead_letters({"read": bad_rows, "models": out.dead_letter}, job.out_dir, job.streaming)
    return out


def write_demo(path: str) -> int:
    """scikit-learn's digits as a CSV of examples (stream ``digits``, features / 16, label 0..9)."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x, y = digits.data[order] / 16.0, digits.target[order]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    header = "stream_id," + ",".join(f"x_{i}" for i in range(x.shape[1])) + ",label"
    lines = [header] + ["digits," + ",".join(f"{v:g}" for v in row) + f",{label}" for row, label in zip(x, y)]
    Path(path).write_text("\n".join(lines) + "\n")
    return len(y)


def run(options: PipelineOptions, job: Plan, messages=None) -> str:
    opts = options.view_as(ModelReleaseOptions)
    prepare_output(job.out_dir)
    if job.demo:
        log.info("wrote scikit-learn's digits (%d examples) to %s", write_demo(job.pattern), job.pattern)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, job, opts, messages)
    result = pipeline.run()
    result.wait_until_finish()
    source = "scikit-learn digits" if job.demo else (opts.input or opts.source)
    lines = [f"beam_dp model_release ({opts.algorithm}): releases written under {job.out_dir.resolve()}",
             f"  input: {source}; {job.params.n_features} features; "
             + (f"{len(job.params.classes)} classes" if job.params.classes else "Huber regression")]
    return "\n".join(lines + output_summary(job.out_dir, ["models"]) + [metrics_summary(result)])


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, prog=PROG, description=__doc__.split("\n\n")[0], options_class=ModelReleaseOptions,
                   plan=plan, run=run)


if __name__ == "__main__":
    raise SystemExit(main())
