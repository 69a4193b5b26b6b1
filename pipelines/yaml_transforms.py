"""beam_dp transforms for Beam YAML: flat configs in, schema'd rows out.

``templates/yaml/providers.yaml`` maps each YAML type to a constructor here (provider type
``python``, no ``packages:``: it runs in-process, nothing is installed at run time). Input rows
per family (the columns ``ReadFromCsv`` gives; each row is mapped by the family's job function):

* ``ContinualSum``/``ContinualCount``/``WindowedSum``: ``stream_id``, ``timestamp`` (epoch seconds
  or ISO-8601) and ``value`` (a number or a list) or ``value_0..value_{d-1}``;
* ``ContinualModelRelease``: ``stream_id``, ``x_0..x_{d-1}`` (or ``features``), ``label``
  (``pipelines.model_release.to_example``);
* ``OnlineLearner``: the same (``pipelines.online_learning.to_record``); ``IncrementalRegression``:
  plus ``timestamp`` with event-time steps;
* ``GrowingDatabaseQueries``: two named inputs ``elements`` (``stream_id``, ``timestamp``, one
  column per universe field) and ``queries`` (``stream_id``, ``query_id``, ``t``, ``predicate``
  JSON text | ``indices`` JSON text | ``w_0..w_{N-1}``), or one input whose rows with a non-null
  ``query_id`` are the queries (``pipelines.growing_db_queries.to_element`` / ``to_query``).

Outputs:

* ``releases``: one row per release with the columns of :class:`beam_dp.io.ReleaseRow` (one schema
  for all families: a model's named parts are concatenated in ``value`` and listed in ``parts``;
  ``meta`` is JSON text; ``step_start``/``step_end`` are µs since the epoch, null for count steps);
* ``dead_letter``: ``reason``, ``detail`` (never the value), ``stream``, ``element`` (the mapped row, as text);
* ``snapshots`` (``GrowingDatabaseQueries`` only; empty unless ``snapshots: true``): release rows.

Every config key is a parameter of the job's spec (:mod:`pipelines.spec`, the same names as the
job's flags and Flex Template parameters); each constructor's signature and ``Args:`` doc are
generated from it. The noise key is given only by location: ``noise_key_secret`` (a Secret Manager
version), ``noise_key_file`` (a path on any Beam filesystem) or ``noise_key_env`` (an env var name).

Adding a family: add its job's parameters to the spec, write ``@_from_spec(job, names) def
MyTransformYaml(c) -> PTransform`` that builds the family's params and wraps its transform with
:class:`YamlRelease` (and the row mapping), and register it in :data:`REGISTRY` and in
``templates/yaml/providers.yaml``.
"""


import copy
import dataclasses
import functools
import inspect
import json
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Union

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualModelParams,
    ContinualModelRelease,
    ContinualSum,
    ContinualSumParams,
    GrowingDatabaseParams,
    GrowingDatabaseQueries,
    IncrementalRegression,
    IncrementalRegressionParams,
    NoiseKey,
    OnlineLearner,
    OnlineLearnerParams,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.beam.shell.domains import pipeline_of as _pipeline_of
from beam_dp.beam.shell.manifest import params_composition
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core import StepClock
from beam_dp.core.budget import BudgetPlan, JobBudget
from beam_dp.core.noise import KEY_ENV_VAR
from beam_dp.io.schema import ReleaseRow
from beam_dp.mechanisms.growing_db.universe import Universe
from beam_dp.mechanisms.stream_groups import groups_for
from beam_dp.steps.events import json_value
from beam_dp.steps.schema import ReleaseColumns
from pipelines import spec
from pipelines.growing_db_queries import parse_universe, to_element, to_query
from pipelines.model_release import to_example
from pipelines.online_learning import to_record
from pipelines.runner import UsageError

__all__ = [
    "REGISTRY", "ContinualCountYaml", "ContinualModelReleaseYaml", "ContinualSumYaml", "DeadLetterRow",
    "GrowingDatabaseQueriesYaml", "IncrementalRegressionYaml", "JobBudgetOptions", "OnlineLearnerYaml",
    "ReleaseRecord", "SINKS", "WindowedSumYaml", "WriteDeadLettersYaml", "YamlRelease", "check_launch_keys",
    "is_release_rows", "non_release_file_writes", "yaml_budget_plan",
]


# Functional NamedTuples: their field types stay real types under ``from __future__ import
# annotations`` (Beam needs them to infer the row schemas YAML works with).
ReleaseRecord = NamedTuple("ReleaseRecord", [
    ("stream", str), ("step", int), ("mechanism", str), ("value", List[float]), ("shape", List[int]),
    ("parts", str), ("epsilon_spent", float), ("delta_spent", float), ("epsilon_budget", float),
    ("delta_budget", float), ("window", Optional[int]), ("step_start", Optional[int]),
    ("step_end", Optional[int]), ("meta", str), ("noise_domain", str), ("composition", str),
    ("job_epsilon_spent", float), ("job_delta_spent", float), ("job_epsilon_budget", float),
    ("job_delta_budget", float), ("purpose", str), ("noise", str)])
DeadLetterRow = NamedTuple("DeadLetterRow", [
    ("reason", str), ("detail", str), ("stream", Optional[str]), ("source", Optional[str]), ("element", str)])
assert ReleaseRecord._fields == ReleaseRow._fields, "keep ReleaseRecord in step with beam_dp.io.ReleaseRow"
for _row_type in (ReleaseRecord, DeadLetterRow):
    beam.coders.registry.register_coder(_row_type, beam.coders.RowCoder)


def _fields(row: Any) -> dict:
    """A YAML row (``beam.Row``) or a mapping -> a ``{field: value}`` dict."""
    return row._asdict() if hasattr(row, "_asdict") else dict(row)


def _as_event(row: Any, unit: Optional[str] = None) -> Any:
    """A YAML row -> the mapping the sum transforms parse; value columns ``value_0..`` become one list; with
    ``unit``, the privacy unit's field is kept (``None`` where the row lacks it: a ``bad_unit_id``)."""
    fields = _fields(row)
    if fields.get("value") is None:
        columns = sorted((k for k in fields if k.startswith("value_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        if columns:
            fields["value"] = [fields[k] for k in columns]
    event = {"stream_id": fields.get("stream_id"), "timestamp": fields.get("timestamp"), "value": fields.get("value")}
    return event if unit is None else {**event, unit: fields.get(unit)}


def _dead_letter_row(letter) -> DeadLetterRow:
    """A dead letter as a YAML row; ``element`` is the rejected input as JSON text (``DeadLetter.to_json``)."""
    return DeadLetterRow(letter.reason, letter.detail, letter.stream, letter.source,
                         json.dumps(json_value(letter.element), allow_nan=False))


def _records(release: Any) -> list:
    """A release row, or a group's ``ReleaseColumns`` (``stream_groups``), as YAML records."""
    rows = release.rows() if isinstance(release, ReleaseColumns) else [release]
    return [ReleaseRecord(*r) for r in rows]


def _release_rows(releases: beam.PCollection, label: str) -> beam.PCollection:
    return releases | label >> beam.FlatMap(_records).with_output_types(ReleaseRecord)


class JobBudgetOptions(PipelineOptions):
    """A YAML pipeline's job budget: ``job_epsilon``/``job_delta``, its declared total per contribution
    (in the YAML ``options:`` block or as flags); ``beam_dp_budget_plan`` is set by ``pipelines.run_yaml``."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--job_epsilon", type=float, default=None,
                            help="the YAML pipeline's total epsilon per contribution, across its beam_dp transforms")
        parser.add_argument("--job_delta", type=float, default=0.0, help="the YAML pipeline's total delta")
        parser.add_argument("--beam_dp_budget_plan", default=None,
                            help="internal (pipelines.run_yaml): the job budget's shares, JSON")


PLANNING = "planning"  # ``beam_dp_budget_plan`` of run_yaml's first build: collect the shares, check the total
_SHARES_ATTR = "_beam_dp_yaml_shares"


def _share_of(params: Any) -> tuple[str, float, float]:
    """``(composition, epsilon, delta)`` a transform's params spend (its mechanism's guarantee)."""
    mechanism = params.build_mechanism()
    return params_composition(params, mechanism), float(mechanism.guarantee.epsilon), float(mechanism.guarantee.delta)


def yaml_budget_plan(pipeline: beam.Pipeline) -> Optional[str]:
    """The job budget's plan (JSON) of a YAML pipeline built with ``beam_dp_budget_plan=planning``:
    every beam_dp transform's share under the declared total; None when no total is declared (then
    the pipeline has at most one beam_dp transform: building it refused more)."""
    opts = pipeline.options.view_as(JobBudgetOptions)
    shares = pipeline.__dict__.get(_SHARES_ATTR, {})
    if opts.job_epsilon is None or not shares:
        return None
    plan = JobBudget(opts.job_epsilon, opts.job_delta).plan(shares)
    return json.dumps({"epsilon": plan.epsilon, "delta": plan.delta, "shares": [list(s) for s in plan.shares]})


def _with_job_share(params: Any, pipeline: beam.Pipeline) -> Any:
    """``params`` with its share of the YAML pipeline's job budget (see ``pipelines.run_yaml``).

    With a plan (run_yaml's second build): the share named by the transform's label, so that rows
    carry the job's spend. Otherwise the transform's spend is registered and checked: more than one
    beam_dp transform without a declared ``job_epsilon``, or shares composing above it, are refused
    (``ValueError``) at build; outside run_yaml's planning build a second transform is refused too
    (its rows could not carry the job's spend)."""
    name = pipeline._current_transform().full_label
    opts = pipeline.options.view_as(JobBudgetOptions)
    if opts.beam_dp_budget_plan not in (None, PLANNING):
        data = json.loads(opts.beam_dp_budget_plan)
        plan = BudgetPlan(data["epsilon"], data["delta"], tuple(tuple(s) for s in data["shares"]))
        if name not in plan.names:
            raise ValueError(f"beam_dp transform {name!r} has no share in the job budget's plan {plan.names}")
        return dataclasses.replace(params, budget=plan[name])
    shares = pipeline.__dict__.setdefault(_SHARES_ATTR, {})
    shares[name] = _share_of(params)
    if opts.job_epsilon is None and len(shares) > 1:
        raise ValueError(f"{len(shares)} beam_dp transforms ({', '.join(shares)}) in one YAML pipeline: declare the "
                         "job's total per contribution (options: job_epsilon, job_delta), which their shares must fit")
    if opts.job_epsilon is None:
        return params
    plan = JobBudget(opts.job_epsilon, opts.job_delta).plan(shares)  # ValueError above the total
    if opts.beam_dp_budget_plan is None and len(shares) > 1:
        raise ValueError("several beam_dp transforms in one YAML pipeline: run it with python -m pipelines.run_yaml, "
                         "which gives each its share of the job's total so that every row carries the job's spend")
    return dataclasses.replace(params, budget=plan[name]) if opts.beam_dp_budget_plan is None else params


class YamlRelease(beam.PTransform):
    """Wrap a beam_dp transform for YAML: rows in, named outputs ``releases`` and ``dead_letter`` out
    (and ``snapshots`` where the transform has them).

    ``to_elements`` maps the YAML rows (one PCollection, or a dict of named inputs) to what the
    transform takes; by default each row becomes a ``stream_id/timestamp/value`` event.
    """

    def __init__(self, transform: beam.PTransform, to_elements: Optional[beam.PTransform] = None):
        super().__init__()
        self.transform = transform
        self.to_elements = to_elements if to_elements is not None else beam.Map(_as_event)

    def expand(self, rows):
        transform = copy.copy(self.transform)
        transform.params = _with_job_share(transform.params, _pipeline_of(rows))
        out = rows | "AsElements" >> self.to_elements | "Release" >> transform
        outputs = {
            "releases": _release_rows(out.releases, "Rows"),
            "dead_letter": out.dead_letter | "DeadLetterRows" >> beam.Map(_dead_letter_row).with_output_types(
                DeadLetterRow),
        }
        if hasattr(out, "snapshots"):
            outputs["snapshots"] = _release_rows(out.snapshots, "SnapshotRows")
        return outputs


KEYS = ("noise_key_secret", "noise_key_file", "noise_key_env")
SCHEDULE = ("start", "period", "end", "block_size")


def _from_spec(job: str, names: tuple[str, ...], required: tuple[str, ...] = (), defaults: dict | None = None,
               types: dict | None = None, extra: tuple[inspect.Parameter, ...] = (), extra_doc: str = ""):
    """Make ``build(config) -> PTransform`` a YAML constructor whose signature and ``Args:`` doc come
    from the job's parameter spec (:mod:`pipelines.spec`), so YAML, the CLI flags and the Flex
    metadata cannot drift apart. A missing or unknown config key is a ``ValueError``."""
    signature = spec.yaml_signature(job, names, required, extra, defaults, types)

    def wrap(build: Callable[[dict], beam.PTransform]) -> Callable[..., beam.PTransform]:
        @functools.wraps(build)
        def constructor(**config: Any) -> beam.PTransform:
            try:
                bound = signature.bind(**config)
            except TypeError as exc:
                raise ValueError(f"{build.__name__.removesuffix('Yaml')}: {exc}") from None
            bound.apply_defaults()
            return build(dict(bound.arguments))

        constructor.__signature__ = signature
        constructor.__doc__ = inspect.cleandoc(build.__doc__ or "") + spec.yaml_args_doc(job, names) + extra_doc
        return constructor

    return wrap


def _schedule(c: dict) -> dict:
    if c.get("block_size") is not None:
        return {"block_size": int(c["block_size"])}
    if c.get("start") is None or c.get("period") is None:
        raise ValueError("give start and period (event-time steps; end for a batch replay) or block_size")
    end = c.get("end")
    return {"clock": StepClock(start=float(c["start"]), period=float(c["period"]),
                               end=None if end is None else float(end))}


def _items(value: Any) -> Optional[tuple]:
    """A YAML list (or comma-separated text) -> a tuple of strings; empty -> None."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    return tuple(str(v) for v in items if str(v)) or None


def _noise_key(c: dict) -> NoiseKey:
    """The key location, checked when the pipeline is built (``pipelines.common.check_key_sources``; a
    named env var unset here may be the workers'): one source at most, a named one usable."""
    from pipelines.common import check_key_sources
    from pipelines.runner import UsageError

    env = _named_env(c["noise_key_env"])
    try:
        check_key_sources(c["noise_key_secret"], c["noise_key_file"], env, local=False, names=KEYS)
    except UsageError as exc:
        raise ValueError(f"{exc}") from None
    return NoiseKey(env_var=env or KEY_ENV_VAR, key_file=c["noise_key_file"], secret=c["noise_key_secret"])


def _named_env(env: Optional[str]) -> Optional[str]:
    """A named key env var; the default ``BEAM_DP_NOISE_KEY`` (the templates' value) is not a named source,
    as a job without ``--noise-key-env``: beside a key file or secret it is unused, and unset it means a
    random key for a local run."""
    return None if env == KEY_ENV_VAR else env or None


def check_launch_keys(pipeline: beam.Pipeline, local: bool) -> None:
    """Refuse (``ValueError``, one line) a built YAML pipeline whose beam_dp transform names a key env var
    that a ``local`` run cannot read here, as the jobs do at launch (``pipelines.common.check_key_sources``;
    key files and secrets are read when each transform is built)."""
    from apache_beam.pipeline import PipelineVisitor

    from pipelines.common import check_key_sources

    keys: list[NoiseKey] = []

    class _Keys(PipelineVisitor):
        def enter_composite_transform(self, node) -> None:
            if isinstance(node.transform, YamlRelease):
                keys.append(node.transform.transform.params.noise_key)

    pipeline.visit(_Keys())
    for key in keys:
        if key.secret or key.key_file:
            continue
        try:
            check_key_sources(None, None, _named_env(key.env_var), local, names=KEYS)
        except UsageError as exc:
            raise ValueError(f"{exc}") from None


def _lateness(c: dict, params_class: type) -> dict:
    """``allowed_lateness`` for step params that have it (see ``pipelines.runner.lateness``)."""
    if c.get("allowed_lateness") is None:
        return {}
    if "allowed_lateness" not in getattr(params_class, "__dataclass_fields__", {}):
        raise ValueError(f"allowed_lateness is not supported by {params_class.__name__} in this version")
    return {"allowed_lateness": float(c["allowed_lateness"])}


def _sum_common(c: dict, params_class: type) -> dict:
    return dict(epsilon=float(c["epsilon"]), delta=float(c["delta"]), noise=c["noise"], calibration=c["calibration"],
                streams=_items(c["streams"]), noise_key=_noise_key(c), **_schedule(c), **_lateness(c, params_class))


_UNIT = ("privacy_unit_column", "max_unit_steps", "min_separation", "max_streams_per_step",
         "max_contributions_per_step")
_SUM = ("epsilon", "clip_bound", "dim", "delta", "noise", "calibration", "granularity") + SCHEDULE + (
    "allowed_lateness", "streams") + KEYS + _UNIT


def _privacy_unit(c: dict) -> Optional[PrivacyUnit]:
    """The sum's privacy unit from its config (None: event level); ``ValueError`` for bounds without a unit
    column or a unit without ``max_unit_steps``, as the job refuses its flags."""
    if c["privacy_unit_column"] is None:
        given = [name for name in _UNIT[1:] if c[name] != spec.default_of("continual_stats", name)]
        if given:
            raise ValueError(f"{', '.join(given)} bound privacy units: give privacy_unit_column, or leave them out "
                             "for event-level privacy")
        return None
    if c["max_unit_steps"] is None:
        raise ValueError("privacy_unit_column needs max_unit_steps (the most steps a unit takes part in)")
    return PrivacyUnit(c["privacy_unit_column"], int(c["max_streams_per_step"]), int(c["max_contributions_per_step"]),
                       int(c["max_unit_steps"]), int(c["min_separation"]))


def _unit_release(transform: beam.PTransform, unit: Optional[PrivacyUnit]) -> "YamlRelease":
    """``transform`` wrapped for YAML, the unit's field kept in each event when there is a unit."""
    return YamlRelease(transform, None if unit is None else beam.Map(_as_event, unit.column))


@_from_spec("continual_stats", _SUM + ("horizon", "unbounded", "counter", "blt_error", "stream_groups"),
            required=("epsilon", "clip_bound"), defaults={"dim": 1})
def ContinualSumYaml(c: dict) -> beam.PTransform:
    """Private running sum of vectors per stream, released at every step (tree and matrix mechanisms).

    Guarantee: each contribution is epsilon-DP (gamma, K-norm noise) or (epsilon, delta)-DP
    (gaussian) over the whole unbounded release sequence; contributions are clipped to L2 norm
    clip_bound. Public: the schedule, the streams, the release times."""
    params = ContinualSumParams(
        dim=int(c["dim"]), clip_bound=float(c["clip_bound"]), horizon=c["horizon"], unbounded=c["unbounded"],
        counter=c["counter"], blt_error=c["blt_error"], granularity=c["granularity"], **_sum_common(c, ContinualSumParams))
    unit = _privacy_unit(c)
    # None where the mechanism keys by stream; unit-level sums release keyed by stream
    groups = None if unit is not None else groups_for(params.build_mechanism(), c["stream_groups"])
    return _unit_release(ContinualSum(dataclasses.replace(params, stream_groups=groups) if groups else params,
                                      privacy_unit=unit), unit)


@_from_spec("continual_stats", ("epsilon", "delta", "noise", "calibration", "horizon", "unbounded", "counter",
                                 "blt_error")
            + SCHEDULE + ("allowed_lateness", "streams") + KEYS + _UNIT, required=("epsilon",))
def ContinualCountYaml(c: dict) -> beam.PTransform:
    """Private running number of events per stream (a continual sum of 1 per event, sensitivity 2).

    Same guarantee as ContinualSum; the value field of the input rows is ignored. With a privacy unit,
    each unit is counted at most once per (stream, step)."""
    params = ContinualCountParams(horizon=c["horizon"], unbounded=c["unbounded"], counter=c["counter"],
                                  blt_error=c["blt_error"],
                                  **_sum_common(c, ContinualCountParams))
    unit = _privacy_unit(c)
    return _unit_release(ContinualCount(params, privacy_unit=unit), unit)


@_from_spec("continual_stats", _SUM + ("window",), required=("epsilon", "clip_bound", "window"),
            defaults={"dim": 1})
def WindowedSumYaml(c: dict) -> beam.PTransform:
    """Private running sum with privacy expiration (window tree).

    Each contribution is protected while fewer than window (rounded up to a power of two) later
    steps have been released; afterwards it appears un-noised in later releases (window DP)."""
    params = WindowedSumParams(dim=int(c["dim"]), clip_bound=float(c["clip_bound"]), window=int(c["window"]),
                               granularity=c["granularity"], **_sum_common(c, WindowedSumParams))
    unit = _privacy_unit(c)
    return _unit_release(WindowedSum(params, privacy_unit=unit), unit)


def _as_example(row: Any, n_features: int, classification: bool) -> tuple:
    return to_example(_fields(row), n_features, classification)


@_from_spec("model_release", ("dim", "epsilon", "update_size", "base_size", "classes", "lam", "delta", "noise",
                              "clip_bound", "huber", "variant", "sampling", "base_fraction", "granularity",
                              "streams") + KEYS, required=("dim", "epsilon", "update_size", "base_size"))
def ContinualModelReleaseYaml(c: dict) -> beam.PTransform:
    """Privately trained linear models per stream (ERM, Algorithm 4/8): a model over the stream so
    far every ``update_size`` examples from ``base_size`` examples on (count steps in arrival order).

    Guarantee: each example is epsilon-DP (gamma, K-norm noise) or (epsilon, delta)-DP (gaussian)
    over all releases, forever; features are clipped to L2 norm clip_bound. Public: the classes,
    the streams, the arrival count and order per stream. A release's value is the model's
    ``intercepts`` and ``weights`` (names and shapes in ``parts``); ``beam_dp.io.load_model`` reads it."""
    params = ContinualModelParams(
        n_features=int(c["dim"]), classes=_items(c["classes"]), lam=float(c["lam"]), epsilon=float(c["epsilon"]),
        delta=float(c["delta"]), noise=c["noise"], clip_bound=float(c["clip_bound"]), huber=float(c["huber"]),
        update=int(c["update_size"]), base=int(c["base_size"]), variant=c["variant"], sampling=bool(c["sampling"]),
        base_fraction=float(c["base_fraction"]), granularity=c["granularity"], streams=_items(c["streams"]),
        noise_key=_noise_key(c))
    return YamlRelease(ContinualModelRelease(params),
                       beam.Map(_as_example, params.n_features, params.classes is not None))


def _as_record(row: Any, dim: int, event_time: bool) -> tuple:
    return to_record(_fields(row), dim, event_time)


def _constraint(c: dict) -> dict:
    return {"kind": c["constraint"], "radius": float(c["radius"])}


@_from_spec("online_learning", ("dim", "epsilon", "window", "algorithm", "constraint", "radius", "loss", "mu",
                                "delta", "noise", "calibration", "beta", "alpha", "c0", "streams") + KEYS,
            required=("dim", "epsilon", "window"), defaults={"algorithm": "cocop", "delta": 0.0})
def OnlineLearnerYaml(c: dict) -> beam.PTransform:
    """Private online learning with privacy expiration (WDP-COCOP / WDP-COCOL) per stream: one row
    per step in arrival order, releasing the next decision ``{"x": x}`` at every step.

    Guarantee: window epsilon-DP (gamma) or window (epsilon, delta)-DP (gaussian) over the last
    2^ceil(log2 window) rows of a stream, event level; older rows are effectively published. Rows
    are clipped (features to norm 1, labels to [-1, 1]). Public: streams, arrival order and count."""
    params = OnlineLearnerParams(
        dim=int(c["dim"]), constraint=_constraint(c), epsilon=float(c["epsilon"]), window=int(c["window"]),
        algorithm=c["algorithm"], loss=c["loss"], mu=float(c["mu"]), delta=float(c["delta"]), noise=c["noise"],
        calibration=c["calibration"], beta=float(c["beta"]), alpha=c["alpha"], C0=c["c0"],
        streams=_items(c["streams"]), noise_key=_noise_key(c))
    return YamlRelease(OnlineLearner(params), beam.Map(_as_record, params.dim, False))


_OPTIONS = inspect.Parameter("options", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Optional[Mapping[str, Any]])


@_from_spec("online_learning", ("dim", "epsilon", "delta", "algorithm", "constraint", "radius", "horizon",
                                "release_every", "calibration", "m", "iterations") + SCHEDULE + ("streams",) + KEYS,
            required=("dim", "epsilon", "delta"), defaults={"algorithm": "privincreg1"}, extra=(_OPTIONS,),
            extra_doc="\n  options: the mechanism's other keyword arguments (tau, schedule, ...).")
def IncrementalRegressionYaml(c: dict) -> beam.PTransform:
    """Private incremental least-squares regression (PRIVINCREG1/2, PRIVINCERM) per stream,
    releasing ``{"theta": theta}`` every ``release_every`` steps.

    Guarantee: (epsilon, delta)-DP per row (event level) over the whole stream (or its horizon);
    rows are clipped (features to norm 1, labels to [-1, 1]). Public: streams, the step schedule
    (and row counts with count steps), release times. Event-time steps need a ``timestamp`` column."""
    options = dict(c["options"] or {}, **{k: int(c[k]) for k in ("m", "iterations") if c[k] is not None})
    params = IncrementalRegressionParams(
        dim=int(c["dim"]), epsilon=float(c["epsilon"]), delta=float(c["delta"]), algorithm=c["algorithm"],
        constraint=_constraint(c), horizon=c["horizon"], release_every=int(c["release_every"]),
        calibration=c["calibration"], options=options, streams=_items(c["streams"]), noise_key=_noise_key(c),
        **_schedule(c))
    return YamlRelease(IncrementalRegression(params), beam.Map(_as_record, params.dim, params.event_time))


def _is_query(row: Any) -> bool:
    return _fields(row).get("query_id") is not None


def _as_growing_element(row: Any, universe: Universe) -> dict:
    return to_element(_fields(row), universe)


def _as_query(row: Any, size: int) -> dict:
    return to_query(_fields(row), size)


class _GrowingInputs(beam.PTransform):
    """Rows -> ``{"elements", "queries"}`` for ``GrowingDatabaseQueries``: two named inputs
    ``elements`` and ``queries``, or one input whose rows with a non-null ``query_id`` are queries."""

    def __init__(self, universe: Universe):
        super().__init__()
        self.universe = universe

    def expand(self, rows):
        if isinstance(rows, Mapping):
            if set(rows) != {"elements", "queries"}:
                raise ValueError(f"name the inputs elements and queries, got {sorted(rows)}")
            element_rows, query_rows = rows["elements"], rows["queries"]
        else:
            element_rows = rows | "ElementRows" >> beam.Filter(lambda r: not _is_query(r))
            query_rows = rows | "QueryRows" >> beam.Filter(_is_query)
        return {"elements": element_rows | "ToElements" >> beam.Map(_as_growing_element, self.universe),
                "queries": query_rows | "ToQueries" >> beam.Map(_as_query, self.universe.size)}


@_from_spec("growing_db_queries", ("universe", "n", "epsilon", "start", "period", "end", "mechanism", "alpha", "a",
                                   "xi_n", "delta", "beta", "gamma", "snapshots", "allowed_lateness", "streams")
            + KEYS, required=("universe", "n", "epsilon", "start", "period"),
            types={"universe": Union[str, Mapping[str, Any]]})
def GrowingDatabaseQueriesYaml(c: dict) -> beam.PTransform:
    """Private answers to linear queries on growing databases (PMWG, BBScheduler, BBImprover) per
    stream; a query ``(query_id, t)`` is answered on the database of the first t elements.

    Guarantee: each element is epsilon-DP (or (epsilon, delta)-DP with delta > 0) from its arrival
    on, over all answers, forever. Public: the universe, the schedule, the arrival count per stream,
    the queries. Outputs releases (one row per answer, meta has query_id), dead_letter and
    snapshots (the public synthetic histogram, with snapshots true)."""
    universe = c["universe"]
    try:
        parsed = parse_universe(universe if isinstance(universe, str) else json.dumps(dict(universe)))
    except UsageError as exc:
        raise ValueError(str(exc).replace("--universe", "universe")) from None
    params = GrowingDatabaseParams(
        universe=parsed, n=int(c["n"]), epsilon=float(c["epsilon"]), delta=float(c["delta"]),
        mechanism=c["mechanism"], alpha=float(c["alpha"]), a=float(c["a"]), xi_n=c["xi_n"], beta=float(c["beta"]),
        gamma=c["gamma"], snapshots=bool(c["snapshots"]), streams=_items(c["streams"]), noise_key=_noise_key(c),
        **_schedule(dict(c, block_size=None)), **_lateness(c, GrowingDatabaseParams))
    return YamlRelease(GrowingDatabaseQueries(params), _GrowingInputs(parsed))


class WriteDeadLettersYaml(beam.PTransform):
    """Write dead-letter rows as JSON lines to ``<path>-00000-of-00001.jsonl``: one file, written even when
    there are none (so "none" and "not written" differ), named like every job's dead letters.

    Args:
      path: file prefix, e.g. ``<output>/dead_letter`` (any Beam filesystem).
      stage: the stage named in each line (as the jobs' ``stage`` field); default: none.
    """

    def __init__(self, path: str, stage: Optional[str] = None):
        super().__init__()
        self.path, self.stage = path, stage

    def expand(self, rows):
        return (rows
                | "ToJson" >> beam.Map(lambda row, stage: json.dumps(
                    {"stage": stage, **_fields(row)}, sort_keys=True), self.stage)
                | "Write" >> beam.io.WriteToText(self.path, file_name_suffix=".jsonl", num_shards=1))


def is_release_rows(pcoll: Any) -> bool:
    """Whether ``pcoll`` holds release rows made by a beam_dp transform (the ``releases`` or
    ``snapshots`` output of a :class:`YamlRelease`), not rows that merely look like them."""
    if getattr(pcoll, "element_type", None) is not ReleaseRecord:
        return False
    node = getattr(pcoll, "producer", None)
    while node is not None:
        if isinstance(node.transform, YamlRelease):
            return True
        node = node.parent
    return False


def _raw_origin(pcoll: Any) -> Optional[str]:
    """The label of a transform above ``pcoll`` (main or side input) reached without passing through
    beam_dp release rows, i.e. where non-release data enters; None when every path starts at releases."""
    todo, seen = [(pcoll, "the pipeline's input")], set()
    while todo:
        current, reader = todo.pop()
        if id(current) in seen or is_release_rows(current):
            continue
        seen.add(id(current))
        producer = getattr(current, "producer", None)
        if producer is None:  # the pipeline's root (PBegin): ``reader`` reads from outside
            return reader
        parents = list(producer.inputs) + [side.pvalue for side in producer.side_inputs]
        if not parents:
            return producer.full_label
        todo += [(parent, producer.full_label) for parent in parents]
    return None


def non_release_file_writes(pipeline: beam.Pipeline) -> list[tuple[str, str, str]]:
    """``(sink label, file prefix, origin label)`` of every file sink of a built ``pipeline`` fed by
    anything other than beam_dp release rows (dead letters, raw input, rows mapped to look like
    releases); such data never goes under the ``output`` folder, which holds the releases only."""
    from apache_beam.pipeline import PipelineVisitor

    from beam_dp.beam.shell.manifest import _file_prefix

    found: list[tuple[str, str, str]] = []

    class _Sinks(PipelineVisitor):
        def enter_composite_transform(self, node) -> None:
            prefix = _file_prefix(node.transform)
            if prefix is None:
                return
            for pcoll in node.inputs:
                origin = _raw_origin(pcoll)
                if origin is not None:
                    found.append((node.full_label, prefix, origin))
                    return

    pipeline.visit(_Sinks())
    return found


#: YAML sinks of beam_dp (listed in ``templates/yaml/providers.yaml`` too).
SINKS: dict[str, Callable[..., beam.PTransform]] = {"WriteDeadLetters": WriteDeadLettersYaml}

#: YAML type name -> constructor. ``templates/yaml/providers.yaml`` must list the same names.
REGISTRY: dict[str, Callable[..., beam.PTransform]] = {
    "ContinualSum": ContinualSumYaml,
    "ContinualCount": ContinualCountYaml,
    "WindowedSum": WindowedSumYaml,
    "ContinualModelRelease": ContinualModelReleaseYaml,
    "OnlineLearner": OnlineLearnerYaml,
    "IncrementalRegression": IncrementalRegressionYaml,
    "GrowingDatabaseQueries": GrowingDatabaseQueriesYaml,
}
