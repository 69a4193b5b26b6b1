"""One parameter spec per job: the single source of the argparse flags, the Flex Template
``metadata.json`` (``templates/flex/<job>/metadata.json``, written by ``python -m pipelines.spec``)
and the Beam YAML transform signatures (``pipelines/yaml_transforms.py``).

A :class:`Param` is named in snake_case: that name is the template parameter, the YAML config key
and the argparse ``dest``; the flag is spelled ``--dashed-name`` and ``--snake_name`` (the launcher
passes ``--snake_name=value``). ``fields`` names the params-dataclass fields the parameter sets, so
a test can check that every field of a family is exposed (or listed in :data:`NOT_EXPOSED` with why).

This module imports neither Beam nor torch: ``--help`` builds its parser from here in well under a second.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from beam_dp.core.clock import StepClock
from beam_dp.core.limits import MAX_STEPS, MAX_STREAM_STEPS

__all__ = ["JOBS", "NOT_EXPOSED", "RULES", "Param", "Rule", "add_flags", "boolean", "default_of", "flex_metadata", "job_params", "step_clock",
           "validate", "yaml_args_doc", "yaml_signature"]

_NUMBER = r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_POSITIVE_INT = r"^[1-9][0-9]*$"
_NON_NEGATIVE_INT = r"^[0-9]+$"
_LIST = r"^[^,]+(,[^,]+)*$"
_ANY = r"^.+$"
#: a project id as Beam's ReadFromPubSub accepts it (apache_beam.io.gcp.pubsub.PROJECT_ID_REGEXP)
_PROJECT = r"[a-z][-a-z0-9:.]{4,61}[a-z0-9]"


def boolean(text: str | bool) -> bool:
    """``true``/``false`` (any case), as Flex Template parameters are passed."""
    if isinstance(text, bool):
        return text
    if str(text).lower() in ("true", "1", "yes"):
        return True
    if str(text).lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_TYPES: dict[str, Callable[[str], Any]] = {"float": float, "int": int, "str": str, "bool": boolean, "list": str}


@dataclass(frozen=True)
class Param:
    """One job parameter. ``kind``: float, int, str, bool (``--flag`` alone means true) or list
    (comma-separated text). ``required``: the template must be given it (the CLI may fall back to
    its demo data). ``fields``: the params fields it sets. ``yaml``: a YAML transform takes it;
    ``cli``: the job has the flag (and its template the parameter)."""

    name: str
    help: str
    kind: str = "str"
    default: Any = None
    choices: tuple | None = None
    required: bool = False
    regex: str | None = None
    param_type: str | None = None
    fields: tuple[str, ...] = ()
    yaml: bool = True
    cli: bool = True

    @property
    def flags(self) -> list[str]:
        dashed = "--" + self.name.replace("_", "-")
        return [dashed] if "_" not in self.name else [dashed, "--" + self.name]

    @property
    def regexes(self) -> list[str]:
        if self.regex:
            return [self.regex]
        if self.choices:
            return ["^(" + "|".join(str(c) for c in self.choices) + ")$"]
        return [{"float": _NUMBER, "int": _NON_NEGATIVE_INT, "bool": "^(true|false)$", "list": _LIST}.get(
            self.kind, _ANY)]

    def add_to(self, group) -> None:
        kwargs: dict[str, Any] = dict(dest=self.name, default=self.default, type=_TYPES[self.kind],
                                      help=self.help + (" Default: %(default)s." if self.default is not None else ""))
        if self.kind == "bool":
            kwargs.update(nargs="?", const=True, metavar="true|false")
        if self.choices:
            kwargs["choices"] = self.choices
        group.add_argument(*self.flags, **kwargs)

    def yaml_annotation(self) -> Any:
        """The YAML config type (``typing`` forms: Beam maps them to a schema); a list is a YAML list."""
        return {"float": float, "int": int, "str": str, "bool": bool, "list": List[str]}[self.kind]


def P(name: str, help: str, kind: str = "str", default: Any = None, **kw) -> Param:  # noqa: N802 (terse table)
    return Param(name, help, kind, default, **kw)


# -- shared parameters -----------------------------------------------------------------------------
def _source(streaming_fields: str) -> tuple[Param, ...]:
    return (
        P("source", "files: batch replay of --input; pubsub / kafka: a streaming job (add --streaming) reading one "
          f"JSON object per message with {streaming_fields}.", choices=("files", "pubsub", "kafka"), default="files",
          yaml=False),
        P("pubsub_subscription", "projects/P/subscriptions/S to read (--source pubsub).",
          regex=rf"^projects/{_PROJECT}/subscriptions/[A-Za-z][-A-Za-z0-9._~+%]{{2,254}}$",
          param_type="PUBSUB_SUBSCRIPTION", yaml=False),
        P("pubsub_topic", "projects/P/topics/T to read through a temporary subscription (--source pubsub).",
          regex=rf"^projects/{_PROJECT}/topics/[A-Za-z][-A-Za-z0-9._~+%]{{2,254}}$",
          param_type="PUBSUB_TOPIC", yaml=False),
        P("pubsub_timestamp_attribute", "Message attribute holding the event time (drives the watermark); "
          "default: publish time.", regex=r"^[A-Za-z0-9_.-]+$", yaml=False),
        P("kafka_bootstrap_servers", "host:port[,host:port] of the Kafka brokers (--source kafka).",
          regex=r"^[A-Za-z0-9_.-]+:[0-9]+(,[A-Za-z0-9_.-]+:[0-9]+)*$", yaml=False),
        P("kafka_topic", "Kafka topic to read (--source kafka).", regex=r"^[A-Za-z0-9._-]+$", yaml=False),
    )


def _output(default: str, files: str) -> tuple[Param, ...]:
    return (
        P("output", f"Output folder of the private releases on any Beam filesystem (local, gs://, s3://): {files} "
          "and nothing else of the data. A local run writes a staging folder beside it and replaces the folder "
          "only when it succeeded (a failed or interrupted run keeps the previous output).", default=default,
          required=True, regex=r"^(gs://[a-z0-9][-_.a-z0-9]*[a-z0-9]|/)[^\s]*$", param_type="GCS_WRITE_FOLDER",
          yaml=False),
        P("dead_letter_output", "Folder of the RAW DATA a run writes: dead_letter-*.jsonl (rejected elements with "
          "their values, written even when empty) and a demo run's input. Not private: keep it as private as the "
          "input. Default: <output>.private beside --output.",
          regex=r"^(gs://[a-z0-9][-_.a-z0-9]*[a-z0-9]|/)[^\s]*$", param_type="GCS_WRITE_FOLDER", yaml=False),
        P("print_exact_counts", "Also print the exact number of accepted events and of dead letters per reason "
          "(NOT private: they describe the raw data).", kind="bool", default=False, yaml=False),
        P("fail_on_rejected", "Exit with code 3, publishing the dead letters but not the releases (the previous "
          "--output is kept), when more than this fraction (0 to 1) of the input rows was rejected; without it a "
          "run with rejected rows ends with a warning. Local batch runs only.", kind="float", yaml=False),
        P("format", "Release file format.", choices=("parquet", "jsonl"), default="parquet", yaml=False),
    )


STREAMS = P("streams", "Comma-separated declared streams: only these are released, from step 1; events of other "
            "streams are dead-lettered.", kind="list", fields=("streams",))
KEY = (
    P("noise_key_secret", "Secret Manager version projects/P/secrets/S/versions/V holding the noise key (raw or hex), "
      "read by the workers (needs the gcp extra and secretAccessor for the worker service account).",
      regex=r"^projects/[^/\s]+/secrets/[^/\s]+/versions/[^/\s]+$", fields=("noise_key",)),
    P("noise_key_file", "File holding the noise key (at least 64 hex digits, or at least 32 raw bytes; text must "
      "be hex) on any Beam filesystem (gs://...), read by the workers. Name one key source at most.", regex=r"^(gs://|/)[^\s]+$", fields=("noise_key",)),
    P("noise_key_env", "Name of the env var holding the noise key as hex on the workers (default BEAM_DP_NOISE_KEY).",
      regex=r"^[A-Z_][A-Z0-9_]*$", fields=("noise_key",)),
    P("allow_random_noise_key", "Let a streaming or remote job start without a fixed noise key: each worker then "
      "draws its own random key and a retried bundle gets different noise (not reproducible).", kind="bool",
      default=False, yaml=False),
)
RUN = (P("verbose", "Show the log messages of Beam and other libraries (quiet by default).", kind="bool",
         default=False, yaml=False),)
SCHEDULE = (
    P("start", "Public start of the step schedule, epoch seconds.", kind="float", regex=_NUMBER, fields=("clock",)),
    P("period", "Step length in seconds.", kind="float", fields=("clock",)),
    P("end", "Public end (exclusive), epoch seconds (required for a batch replay; streaming: optional).",
      kind="float", fields=("clock",)),
    P("max_steps", "Refuse a schedule of more steps per stream than this (a typo such as --period 1e-6 --end 1e12 "
      "would otherwise run for ever).", kind="int", default=MAX_STEPS, regex=_POSITIVE_INT, fields=("clock",),
      yaml=False),
    P("max_stream_steps", "Refuse a schedule whose steps times declared streams exceed this.", kind="int",
      default=MAX_STREAM_STEPS, regex=_POSITIVE_INT, fields=("clock",), yaml=False),
)


def step_clock(opts: Any, start: float, period: float, end: float | None) -> StepClock:
    """The job's public schedule with its size caps (``--max-steps``, ``--max-stream-steps``);
    ``ValueError`` naming the numbers when it is too large."""
    return StepClock(start=start, period=period, end=end, max_steps=opts.max_steps,
                     max_stream_steps=opts.max_stream_steps)
LATENESS = (P("allowed_lateness", "Seconds after a step's end during which late events still count (the step "
              "then releases later); later events are dead-lettered.", kind="float", fields=("allowed_lateness",)),)
EPSILON = P("epsilon", "Total privacy budget epsilon of the job per contribution (split between its transforms).",
            kind="float", default=1.0, required=True, fields=("epsilon",))
NOISE = P("noise", "gamma: K-norm noise, pure epsilon-DP under the L2 bound; gaussian: (epsilon, delta)-DP.",
          choices=("gamma", "gaussian"), default="gamma", fields=("noise",))
CALIBRATION = P("calibration", "Gaussian only: the paper's sigma (certified exactly, refused if it fails) or the "
                "smallest exact (analytic) sigma.", choices=("paper", "analytic"), default="analytic",
                fields=("calibration",))
DIM = P("dim", "Number of value / feature coordinates (required with a streaming source; files: from the header).",
        kind="int", regex=_POSITIVE_INT, fields=("dim", "n_features", "input_dim"))
CLASSES = P("classes", "Comma-separated public class labels (a label matches as text: 3, 3.0 and \"3\" are class 3).",
            kind="list", fields=("classes", "n_classes"))


#: a column or field name (a privacy unit's)
_COLUMN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
RECORD_UNIT = (
    P("privacy_unit_column", "Protect privacy units (e.g. users) instead of records: the input column/field holding "
      "the privacy unit id (text, hashed with the noise key, never kept in the clear). Each unit keeps at most "
      "--max-unit-records records, protected together by group privacy (docs/privacy_units.md). Default: off "
      "(record level).", regex=_COLUMN, fields=("privacy_unit",)),
    P("max_unit_records", "At most this many records per privacy unit over the stream's life; required with "
      "--privacy-unit-column.", kind="int", regex=_POSITIVE_INT),
)


def _io(name: str, inputs: str, streaming_fields: str, files: str) -> tuple[Param, ...]:
    return ((P("input", inputs, regex=r"^(gs://|/)[^\s]+$", param_type="GCS_READ_FILE", yaml=False),)
            + _source(streaming_fields) + _output(f"output/{name}", files))


# -- the jobs ----------------------------------------------------------------------------------------
JOBS: dict[str, tuple[Param, ...]] = {
    "continual_stats": _io(
        "continual_stats", "CSV/Parquet event files or glob with columns stream_id, timestamp (epoch seconds or "
        "ISO-8601), value or value_0..value_{d-1}. Default: the embedded demo dataset.",
        "stream_id, timestamp, value (or value_0..)", "sum-*.parquet (count-*, windowed-*)") + (
        DIM, EPSILON,
        P("delta", "Total delta; > 0 with --noise gaussian, 0 with gamma.", kind="float", default=0.0,
          fields=("delta",)),
        NOISE, CALIBRATION,
        P("clip_bound", "L2 norm bound R each contribution is clipped to (sensitivity 2R).", kind="float",
          default=1.0, required=True, fields=("clip_bound",)),
    ) + SCHEDULE + LATENESS + (
        P("horizon", "Known horizon in steps (binary tree); default: unbounded.", kind="int", regex=_POSITIVE_INT,
          fields=("horizon",)),
        P("unbounded", "Unbounded-horizon tree construction when no horizon is given.",
          choices=("hybrid", "doubling"), default="hybrid", fields=("unbounded",)),
        P("counter", "Counter mechanism: auto (BLT for gaussian, fitted k-ary tree for gamma), tree, honaker, "
          "toeplitz (needs a horizon), blt or kary.",
          choices=("auto", "tree", "honaker", "toeplitz", "blt", "kary"), default="auto", fields=("counter",)),
        P("blt_error", "BLT counter's fit: max (minimal max per-step variance) or mean (minimal mean variance "
          "over the horizon).", choices=("max", "mean"), default="max", fields=("blt_error",)),
        P("window", "Also run WindowedSum protecting the last W steps (privacy expiration).", kind="int",
          regex=_POSITIVE_INT, fields=("window",)),
        P("granularity", "Release sums on the grid g = the power of two >= this value, with exact arithmetic and "
          "data-independent noise (calibrated for R + sqrt(dim) g); counts are always exact integers.",
          kind="float", fields=("granularity",)),
        P("count", "Also run ContinualCount (private running number of events per stream).", kind="bool",
          default=False, yaml=False),
        P("stream_groups", "Key the release stage by this many groups of streams (a public hash of the stream "
          "name): one state and timer per group, each group stepped in one numpy operation, releases written as "
          "whole Arrow tables; the releases are the same for any value. It bounds the stage's parallelism. "
          "Default: 256 for a streaming job (fixed at launch: an --update that changes it is refused), 4 for a "
          "batch replay. 0 keys by stream. Applies where the mechanism steps groups (every counter and "
          "the windowed sum, without --granularity; counts are snapped to integers, so they key by stream).", kind="int",
          regex=_NON_NEGATIVE_INT, fields=("stream_groups",)),
        P("block_size", "Count steps of this many contributions instead of start/period.", kind="int",
          regex=_POSITIVE_INT, fields=("block_size",), cli=False),
        P("idle_steps", "End a stream's sums (one stream_ended dead letter, its state freed) after its own step t >= "
          "this many steps at which its released sum moved by at most --idle-threshold over the last that many "
          "steps (the sum and the windowed sum, each on its own releases; not the count). Decided from the "
          "releases alone (no privacy cost); those sums are then keyed by stream. Default: off.", kind="int", regex=_POSITIVE_INT, fields=("idle_steps",), yaml=False),
        P("idle_threshold", "With --idle-steps: the L2 change of the released sum (in the values' units) at or "
          "below which a stream is idle.", kind="float", fields=("idle_threshold",), yaml=False),
        P("privacy_unit_column", "Protect privacy units (e.g. users) instead of events: the --input column (on a "
          "stream: the JSON field) holding each event's unit id (text, hashed with the noise key, never kept in the "
          "clear). Each unit is bounded by --max-unit-steps, --min-separation, --max-streams-per-step and "
          "--max-contributions-per-step and the noise calibrated for its whole bounded contribution "
          "(docs/privacy_units.md). Default: off (event level).", regex=_COLUMN, fields=("privacy_unit",)),
        P("max_unit_steps", "With --privacy-unit-column: k, the most steps a unit takes part in (the windowed sum: "
          "within any --window steps, at most 64). Required with it.", kind="int", regex=_POSITIVE_INT),
        P("min_separation", "With --privacy-unit-column: b, the least number of steps between two of a unit's "
          "steps (1: any distinct steps).", kind="int", default=1, regex=_POSITIVE_INT),
        P("max_streams_per_step", "With --privacy-unit-column: m, the most streams a unit contributes to per "
          "step.", kind="int", default=1, regex=_POSITIVE_INT),
        P("max_contributions_per_step", "With --privacy-unit-column: c, a unit's contributions summed per "
          "(stream, step), the sum then clipped to --clip-bound (a count counts a unit once per step).", kind="int",
          default=1, regex=_POSITIVE_INT),
        STREAMS) + KEY + RUN,
    "model_release": _io(
        "model_release", "CSV/Parquet/JSON-lines files (or glob) with columns stream_id, x_0..x_{d-1}, label. "
        "Default: scikit-learn's digits.", "stream_id, x_0.. (or features), label", "models-*.parquet") + (
        P("algorithm", "continual (Alg. 4/8), multiresolution (Alg. 2/6) or sliding (Alg. 5).",
          choices=("continual", "multiresolution", "sliding"), default="continual", yaml=False),
        DIM,
        P("classes", "Comma-separated public class labels: multiclass logistic regression (labels match as text); "
          "without it, Huber regression on numeric labels.", kind="list", fields=("classes",)),
        EPSILON,
        P("delta", "> 0 with --noise gaussian, 0 with gamma.", kind="float", default=0.0, fields=("delta",)),
        NOISE,
        P("clip_bound", "L2 bound each feature vector is clipped to.", kind="float", default=1.0,
          fields=("clip_bound",)),
        P("lam", "Regularisation strength lambda.", kind="float", default=1.0, fields=("lam",)),
        P("huber", "Huber threshold (regression).", kind="float", default=1.0, fields=("huber",)),
        P("granularity", "Release the model on this public grid (floating-point defence).", kind="float",
          fields=("granularity",)),
        P("update_size", "continual: b0, examples per update step.", kind="int", default=64, regex=_POSITIVE_INT,
          fields=("update",)),
        P("base_size", "continual: B, examples before the first model (a multiple of the update size).",
          kind="int", default=256, regex=_POSITIVE_INT, fields=("base",)),
        P("base_fraction", "continual: share of the budget spent on the base model.", kind="float", default=0.5,
          fields=("base_fraction",)),
        P("variant", "continual: the release variant.", choices=("cumulative", "basic", "independent"),
          default="cumulative", fields=("variant",)),
        P("block_size", "multiresolution: B per step; sliding: w0 per step.", kind="int", default=64,
          regex=_POSITIVE_INT, fields=("block",)),
        P("window", "sliding: w = (2^k - 1) * block size examples (default 7 * block size).", kind="int",
          regex=_POSITIVE_INT, fields=("window",)),
        P("max_level", "multiresolution: highest dyadic level (default: unbounded).", kind="int",
          fields=("max_level",)),
        P("sampling", "Algorithms 6/8 (subsampled releases).", kind="bool", default=False, fields=("sampling",)),
        STREAMS) + RECORD_UNIT + KEY + RUN,
    "growing_db_queries": _io(
        "growing_db_queries", "Element files (CSV/Parquet/JSON lines): stream_id, timestamp, one column per universe "
        "field. Default: a generated demo dataset.",
        "stream_id, timestamp and the universe fields (elements) or query_id, t and predicate / indices / w_0.. "
        "(queries)", "answers-*.parquet (synthetic-* with --snapshots)") + (
        P("queries", "Query files (CSV/Parquet/JSON lines): stream_id, query_id, t, and predicate (JSON text), "
          "indices (JSON list) or w_0..w_{N-1}. Required with --input.", regex=r"^(gs://|/)[^\s]+$",
          param_type="GCS_READ_FILE", yaml=False),
        P("universe", 'Public universe as JSON: {"field": [categories] | {"edges": [e0, .., ek]} | {"range": k}, '
          "...} (fields in this order). Required with --input or a stream.", regex=r"^\{.+\}$",
          fields=("universe",)),
        P("n", "Initial database size before the first query.", kind="int", default=20, regex=_POSITIVE_INT,
          fields=("n",)),
        P("mechanism", "PMWG (private multiplicative weights) or a black-box scheduler.",
          choices=("pmwg", "bbscheduler", "bbimprover"), default="pmwg", fields=("mechanism",)),
        EPSILON,
        P("delta", "delta (> 0 for bbimprover).", kind="float", default=0.0, fields=("delta",)),
        P("alpha", "pmwg: target accuracy.", kind="float", default=0.25, fields=("alpha",)),
        P("a", "pmwg: the exponent a of the accuracy schedule.", kind="float", default=0.5, fields=("a",)),
        P("xi_n", "pmwg: the noise scale parameter xi_n (default: the paper's).", kind="float", fields=("xi_n",)),
        P("beta", "Schedulers: failure probability.", kind="float", default=0.05, fields=("beta",)),
        P("gamma", "bbscheduler: growth exponent (default: the mechanism's).", kind="float", fields=("gamma",)),
    ) + SCHEDULE + LATENESS + (
        P("snapshots", "Also release the public synthetic histogram as steps close.", kind="bool", default=False,
          fields=("snapshots",)),
        STREAMS) + RECORD_UNIT + KEY + RUN,
    "online_learning": _io(
        "online_learning", "CSV/Parquet/JSON-lines files with stream_id, [timestamp,] x_0..x_{d-1}, label. "
        "Default: scikit-learn's breast cancer (online) or diabetes (regression) data.",
        "stream_id, [timestamp,] x_0.. (or features), label", "models-*.parquet") + (
        P("learner", "online: OnlineLearner; regression: IncrementalRegression.", choices=("online", "regression"),
          default="online", yaml=False),
        P("algorithm", "online: cocop (default) or cocol; regression: privincreg1 (default), privincreg2, privincerm.",
          choices=("cocop", "cocol", "privincreg1", "privincreg2", "privincerm"), fields=("algorithm",)),
        DIM, EPSILON,
        P("delta", "delta: 0 by default for online gamma noise, 1e-6 for regression.", kind="float",
          fields=("delta",)),
        P("noise", "online: gamma (K-norm, window epsilon-DP) or gaussian.", choices=("gamma", "gaussian"),
          default="gamma", fields=("noise",)),
        CALIBRATION,
        P("constraint", "Convex constraint set of the model.", choices=("l2_ball", "l1_ball", "simplex"),
          default="l2_ball", fields=("constraint",)),
        P("radius", "Radius of the constraint set.", kind="float", default=1.0, fields=("constraint",)),
        P("loss", "online: loss (labels -1/+1 for logistic).", choices=("logistic", "squared"), default="logistic",
          fields=("loss",)),
        P("mu", "online: strong-convexity parameter.", kind="float", default=1.0, fields=("mu",)),
        P("beta", "online cocol: failure probability.", kind="float", default=0.05, fields=("beta",)),
        P("alpha", "online cocol: the constant alpha (default: the paper's).", kind="float", fields=("alpha",)),
        P("c0", "online cocol: the constant C0 (default: the paper's).", kind="float", fields=("C0",)),
        P("window", "online: records a record stays protected (window DP).", kind="int", default=64,
          regex=_POSITIVE_INT, fields=("window",)),
        P("horizon", "regression: known number of steps (default: unbounded).", kind="int", regex=_POSITIVE_INT,
          fields=("horizon",)),
        P("release_every", "regression: release theta every k steps.", kind="int", default=1, regex=_POSITIVE_INT,
          fields=("release_every",)),
        P("m", "regression privincreg2: projection dimension m (default: the paper's choice).", kind="int",
          regex=_POSITIVE_INT, fields=("options",)),
        P("iterations", "regression privincerm: solver iterations per release.", kind="int", regex=_POSITIVE_INT,
          fields=("options",)),
        P("block_size", "regression: records per step (count steps; default 16 unless --start/--period give "
          "event-time steps).", kind="int", regex=_POSITIVE_INT, fields=("block_size",)),
    ) + SCHEDULE + LATENESS + (STREAMS,) + RECORD_UNIT + KEY + RUN,
    "lifelong": _io(
        "lifelong", "CSV/Parquet/JSON-lines files with stream_id, task_id, x_0..x_{d-1}, label. Default: "
        "scikit-learn's digits in three tasks.", "stream_id, task_id, x_0.. (or features), label; "
        '{"stream_id": .., "task_id": .., "end_of_task": true} closes a task', "models-*.parquet") + (
        P("eval_input", "Public evaluation rows (task_id, x_0.., label; >= 32 per task) for meta accuracy.",
          regex=r"^(gs://|/)[^\s]+$", param_type="GCS_READ_FILE", fields=("eval_sets",), yaml=False),
        P("learner", "bounded_agem (sound (epsilon, delta)-DP, default), naive_gaussian, or l2dp (the paper's "
          "claim, labelled paper_claim).", choices=("bounded_agem", "naive_gaussian", "l2dp"),
          default="bounded_agem", fields=("learner",)),
        P("tasks", "Comma-separated task ids in their public order (required with --input or a stream).",
          kind="list", fields=("task_ids", "num_tasks")),
        CLASSES, DIM, EPSILON,
        P("delta", "delta (DP-SGD learners).", kind="float", default=1e-5, fields=("delta",)),
        P("clip_norm", "DP-SGD per-example gradient clip norm.", kind="float", default=1.0, fields=("clip_norm",)),
        P("memory_uses", "bounded_agem: most times an example is replayed from memory.", kind="int", default=50,
          regex=_POSITIVE_INT, fields=("memory_uses",)),
        P("task_size", "DP-SGD learners: the public, declared number of rows per task (sets the sampling rate "
          "batch_size/task_size and the step count; the true count stays private). Required with --input.",
          kind="int", regex=_POSITIVE_INT, fields=("task_size",)),
        P("micro_batch", "DP-SGD learners: most rows whose per-example gradients are held at once.", kind="int",
          default=1024, regex=_POSITIVE_INT, fields=("micro_batch",)),
        P("hidden", "Width of the input layer.", kind="int", default=32, regex=_POSITIVE_INT, fields=("hidden",)),
        P("batch_size", "Batch size lambda.", kind="int", default=32, regex=_POSITIVE_INT, fields=("batch_size",)),
        P("epochs", "Epochs per task.", kind="int", default=1, regex=_POSITIVE_INT, fields=("epochs",)),
        P("steps_per_task", "Fixed optimiser steps per task instead of epochs.", kind="int", regex=_POSITIVE_INT,
          fields=("steps_per_task",)),
        P("learning_rate", "Learning rate.", kind="float", default=1e-3, fields=("learning_rate",)),
        P("optimizer", "Optimiser.", choices=("adam", "sgd"), default="adam", fields=("optimizer",)),
        P("g_layers", "Comma-separated widths of the hidden layers of the network G above the input layer.",
          kind="list", default="64,32", regex=r"^[1-9][0-9]*(,[1-9][0-9]*)*$", fields=("g_layers",)),
        P("dtype", "Training precision.", choices=("float64", "float32"), default="float64", fields=("dtype",)),
        P("eval_batch", "Batch size of the accuracy evaluation.", kind="int", default=256, regex=_POSITIVE_INT,
          fields=("eval_batch",)),
        P("agem_always_project", "A-GEM: project every gradient on the memory gradient, not only conflicting ones.",
          kind="bool", default=False, fields=("agem_always_project",)),
        P("memory_share", "bounded_agem: share of epsilon reserved for the memory uses.", kind="float",
          default=0.3, fields=("memory_share",)),
        P("accountant", "DP-SGD learners: pld (dp-accounting's PLD, tight; default) or rdp (its RDP accountant, "
          "looser) calibrates the noise and accounts the spend.", choices=("pld", "rdp"), default="pld",
          fields=("accountant",)),
        P("noise_multiplier", "naive_gaussian: fix the DP-SGD noise multiplier z (the paper's grid) instead of "
          "calibrating it from epsilon, delta.", kind="float", fields=("noise_multiplier",)),
        P("rho_s", "l2dp (paper claim): share of epsilon for the reconstruction side.", kind="float", default=0.5,
          fields=("rho_s",)),
        P("b_theta", "l2dp (paper claim): bound on the column and row sums of |W_1|.", kind="float", default=1.0,
          fields=("b_theta",)),
        P("ae_mode", "l2dp (paper claim): code = first-order expansion by autodiff; paper = the printed gradient.",
          choices=("code", "paper"), default="code", fields=("ae_mode",)),
        P("label_path", "l2dp (paper claim): autodiff = M_B differentiated through G; constant = M_B a constant.",
          choices=("autodiff", "constant"), default="autodiff", fields=("label_path",)),
        P("encoder_batch_norm", "l2dp (paper claim): normalise the encoder's pre-activation by batch statistics "
          "before the clip.", kind="bool", default=False, fields=("encoder_batch_norm",)),
        P("device", "auto: workers train on CUDA when present; cpu: never.", choices=("cpu", "auto"),
          default="auto", fields=("allow_cuda", "device")),
        P("torch_threads", "torch intra-op threads per worker.", kind="int", regex=_POSITIVE_INT,
          fields=("torch_threads",)),
        STREAMS) + RECORD_UNIT + KEY + RUN,
}

@dataclass(frozen=True)
class Rule:
    """A rule between a job's flags that its params API enforces: ``refuses(opts)`` is true for the
    parsed options the API would refuse, ``message`` says why and which flag to change."""

    refuses: Callable[[Any], bool]
    message: str


def _pure_with_delta(opts: Any) -> bool:
    return (getattr(opts, "noise", None) or "gamma") == "gamma" and bool(opts.delta)


_PURE_DELTA = Rule(_pure_with_delta, "--delta must be 0 with --noise gamma (K-norm noise is pure epsilon-DP, so the "
                                     "API refuses a delta): leave --delta out or use --noise gaussian")

#: the cross-flag rules of each job (the API's refusals that a job's own arithmetic, e.g. the job budget
#: split, would otherwise hide); checked by :func:`validate` before anything runs
RULES: dict[str, tuple[Rule, ...]] = {
    "continual_stats": (_PURE_DELTA,),
    "model_release": (_PURE_DELTA,),
    "online_learning": (Rule(lambda o: o.learner == "online" and _pure_with_delta(o), _PURE_DELTA.message),),
    "growing_db_queries": (),
    "lifelong": (),
}


def validate(job: str, opts: Any) -> None:
    """Refuse (``ValueError``) parsed options that break one of the job's :data:`RULES`."""
    for rule in RULES[job]:
        if rule.refuses(opts):
            raise ValueError(rule.message)


#: params fields a job does not expose, and why (a test checks every other field has a parameter).
NOT_EXPOSED: dict[str, str] = {
    "restore_states": "encoded mechanism states (as sensitive as raw data): Python API only",
    "black_box": "a Python object (the scheduler's black box); the default LaplaceHistogram is used",
    "backend": "numpy or torch solver of the ERM family: Python API only",
    "uncertified": "NOT PRIVATE mode, never offered by a job or template",
    "x1": "the online learner's first decision: Python API only (default: the constraint set's centre)",
    "budget": "the job's share of --epsilon/--delta, set by the runner (beam_dp.core.budget.JobBudget)",
}


def job_params(job: str) -> tuple[Param, ...]:
    return JOBS[job]


def default_of(job: str, name: str) -> Any:
    """The default of the job's parameter ``name``."""
    return next(p.default for p in JOBS[job] if p.name == name)


def add_flags(parser: argparse.ArgumentParser, job: str) -> None:
    """Add the job's flags (one argument group) to ``parser``."""
    group = parser.add_argument_group(f"beam_dp {job}")
    for param in JOBS[job]:
        if param.cli:
            param.add_to(group)


def flex_metadata(job: str, description: str) -> dict:
    """The Flex Template metadata of a job (every parameter, with its validation regex)."""
    parameters = []
    for param in (p for p in JOBS[job] if p.cli):
        entry = {"name": param.name, "label": param.name.replace("_", " ").capitalize(),
                 "helpText": param.help, "isOptional": not param.required, "regexes": param.regexes}
        if param.param_type:
            entry["paramType"] = param.param_type
        parameters.append(entry)
    return {"name": f"beam_dp {job}", "description": description, "streaming": False,
            "supportsAtLeastOnce": True, "supportsExactlyOnce": True, "defaultStreamingMode": "EXACTLY_ONCE",
            "parameters": parameters + [_STREAMING]}


_STREAMING = {"name": "streaming", "label": "Streaming",
              "helpText": "true for a streaming job (with source pubsub or kafka).", "isOptional": True,
              "regexes": ["^(true|false)$"]}


def yaml_signature(job: str, names: tuple[str, ...], required: tuple[str, ...] = (),
                   extra: tuple[inspect.Parameter, ...] = (), defaults: dict | None = None,
                   types: dict | None = None) -> inspect.Signature:
    """A YAML transform's signature from the job's spec: keyword-only ``names`` (``required`` ones
    without a default; ``defaults`` overrides a spec default where the transform alone differs from
    the job, e.g. a job-level total; ``types`` a YAML type, e.g. a mapping where the flag takes JSON
    text), then ``extra`` parameters that only YAML has."""
    by_name = {p.name: p for p in JOBS[job]}
    params = []
    for name in names:
        p = by_name[name]
        if not p.yaml:
            raise ValueError(f"{job}.{name} is not a YAML parameter")
        default = inspect.Parameter.empty if name in required else (defaults or {}).get(name, p.default)
        base = (types or {}).get(name, p.yaml_annotation())
        annotation = base if default is inspect.Parameter.empty or default is not None else Optional[base]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return inspect.Signature(params + list(extra))


def yaml_args_doc(job: str, names: tuple[str, ...]) -> str:
    """The ``Args:`` section of a YAML transform's docstring (Google style, read by Beam YAML)."""
    by_name = {p.name: p for p in JOBS[job]}
    return "\n\nArgs:\n" + "\n".join(f"  {name}: {by_name[name].help}" for name in names)


def _write_metadata() -> None:  # pragma: no cover - a maintainer's command
    import importlib
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "templates" / "flex"
    for job in JOBS:
        description = importlib.import_module(f"pipelines.{job}").__doc__.split("\n\n")[0]
        (root / job / "metadata.json").write_text(json.dumps(flex_metadata(job, description), indent=2) + "\n")


if __name__ == "__main__":
    _write_metadata()
