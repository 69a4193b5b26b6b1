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

Privacy parameters are the params objects' (see ``beam_dp.beam``); the noise key is given only
by location: ``noise_key_env`` (an env var name) or ``noise_key_file`` (a path), never inline.

Adding a family: write ``def MyTransformYaml(**config) -> PTransform`` that builds the family's
params and wraps its transform with :class:`YamlRelease` (and the row mapping), and register it
in :data:`REGISTRY` and in ``templates/yaml/providers.yaml``.
"""


import json
from typing import Any, Callable, Iterable, List, Mapping, NamedTuple, Optional, Union

import apache_beam as beam

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
from beam_dp.core import StepClock
from beam_dp.io.schema import ReleaseRow
from beam_dp.mechanisms.universe import Universe
from pipelines.common import UsageError
from pipelines.growing_db_queries import parse_universe, to_element, to_query
from pipelines.model_release import to_example
from pipelines.online_learning import to_record

__all__ = [
    "REGISTRY", "ContinualCountYaml", "ContinualModelReleaseYaml", "ContinualSumYaml", "DeadLetterRow",
    "GrowingDatabaseQueriesYaml", "IncrementalRegressionYaml", "OnlineLearnerYaml", "ReleaseRecord",
    "WindowedSumYaml", "YamlRelease",
]


# Functional NamedTuples: their field types stay real types under ``from __future__ import
# annotations`` (Beam needs them to infer the row schemas YAML works with).
ReleaseRecord = NamedTuple("ReleaseRecord", [
    ("stream", str), ("step", int), ("mechanism", str), ("value", List[float]), ("shape", List[int]),
    ("parts", str), ("epsilon_spent", float), ("delta_spent", float), ("epsilon_budget", float),
    ("delta_budget", float), ("window", Optional[int]), ("step_start", Optional[int]),
    ("step_end", Optional[int]), ("meta", str), ("noise_domain", str), ("composition", str),
    ("job_epsilon_spent", float), ("job_delta_spent", float), ("job_epsilon_budget", float),
    ("job_delta_budget", float)])
DeadLetterRow = NamedTuple("DeadLetterRow", [
    ("reason", str), ("detail", str), ("stream", Optional[str]), ("element", str)])
assert ReleaseRecord._fields == ReleaseRow._fields, "keep ReleaseRecord in step with beam_dp.io.ReleaseRow"
for _row_type in (ReleaseRecord, DeadLetterRow):
    beam.coders.registry.register_coder(_row_type, beam.coders.RowCoder)


def _fields(row: Any) -> dict:
    """A YAML row (``beam.Row``) or a mapping -> a ``{field: value}`` dict."""
    return row._asdict() if hasattr(row, "_asdict") else dict(row)


def _as_event(row: Any) -> Any:
    """A YAML row -> the mapping the sum transforms parse; value columns ``value_0..`` become one list."""
    fields = _fields(row)
    if fields.get("value") is None:
        columns = sorted((k for k in fields if k.startswith("value_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        if columns:
            fields["value"] = [fields[k] for k in columns]
    return {"stream_id": fields.get("stream_id"), "timestamp": fields.get("timestamp"), "value": fields.get("value")}


def _dead_letter_row(letter) -> DeadLetterRow:
    return DeadLetterRow(letter.reason, letter.detail, letter.stream, repr(letter.element)[:2000])


def _release_rows(releases: beam.PCollection, label: str) -> beam.PCollection:
    return releases | label >> beam.Map(lambda r: ReleaseRecord(*r)).with_output_types(ReleaseRecord)


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
        out = rows | "AsElements" >> self.to_elements | "Release" >> self.transform
        outputs = {
            "releases": _release_rows(out.releases, "Rows"),
            "dead_letter": out.dead_letter | "DeadLetterRows" >> beam.Map(_dead_letter_row).with_output_types(
                DeadLetterRow),
        }
        if hasattr(out, "snapshots"):
            outputs["snapshots"] = _release_rows(out.snapshots, "SnapshotRows")
        return outputs


def _schedule(start: Optional[float], period: Optional[float], end: Optional[float],
              block_size: Optional[int]) -> dict:
    if block_size is not None:
        return {"block_size": int(block_size)}
    if start is None or period is None:
        raise ValueError("give start and period (event-time steps; end for a batch replay) or block_size")
    return {"clock": StepClock(start=float(start), period=float(period), end=None if end is None else float(end))}


def _streams(streams: Optional[Iterable[str]]) -> Optional[tuple]:
    return tuple(streams) if streams else None


def _common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
            noise_key_file) -> dict:
    return dict(
        epsilon=float(epsilon), delta=float(delta), noise=noise, calibration=calibration, streams=_streams(streams),
        noise_key=NoiseKey(env_var=noise_key_env, key_file=noise_key_file),
        **_schedule(start, period, end, block_size),
    )


def ContinualSumYaml(
    epsilon: float,
    clip_bound: float,
    dim: int = 1,
    delta: float = 0.0,
    noise: str = "gamma",
    calibration: str = "paper",
    horizon: Optional[int] = None,
    unbounded: str = "hybrid",
    start: Optional[float] = None,
    period: Optional[float] = None,
    end: Optional[float] = None,
    block_size: Optional[int] = None,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
    granularity: Optional[float] = None,
) -> beam.PTransform:
    """Private running sum of vectors per stream, released at every step (tree mechanisms).

    Guarantee: each contribution is epsilon-DP (gamma, K-norm noise) or (epsilon, delta)-DP
    (gaussian) over the whole unbounded release sequence; contributions are clipped to L2 norm
    clip_bound. Public: the schedule, the streams, the release times.

    Args:
      epsilon: privacy budget per contribution (> 0).
      clip_bound: L2 bound R of each contribution (sensitivity 2R).
      dim: number of value coordinates.
      delta: 0 with gamma noise, in (0, 1) with gaussian.
      noise: gamma (pure epsilon-DP) or gaussian.
      calibration: paper (certified, refused if it fails) or analytic (gaussian only).
      horizon: known number of steps (binary tree); empty for unbounded.
      unbounded: hybrid or doubling construction for an unbounded horizon.
      start: public start of the schedule, epoch seconds.
      period: step length in seconds.
      end: public end (exclusive) of a batch replay, epoch seconds.
      block_size: count steps of this many contributions instead of start/period.
      streams: declared streams (release from step 1; others are dead-lettered).
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
      granularity: release on the power-of-two grid at or above this value with exact arithmetic
        (floating-point defence; calibrated for clip_bound + sqrt(dim) * grid).
    """
    params = ContinualSumParams(
        dim=int(dim), clip_bound=float(clip_bound), horizon=horizon, unbounded=unbounded, granularity=granularity,
        **_common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
                  noise_key_file))
    return YamlRelease(ContinualSum(params))


def ContinualCountYaml(
    epsilon: float,
    delta: float = 0.0,
    noise: str = "gamma",
    calibration: str = "paper",
    horizon: Optional[int] = None,
    unbounded: str = "hybrid",
    start: Optional[float] = None,
    period: Optional[float] = None,
    end: Optional[float] = None,
    block_size: Optional[int] = None,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
) -> beam.PTransform:
    """Private running number of events per stream (a continual sum of 1 per event, sensitivity 2).

    Same guarantee and arguments as ContinualSum, without dim and clip_bound; the value field of
    the input rows is ignored.

    Args:
      epsilon: privacy budget per contribution (> 0).
      delta: 0 with gamma noise, in (0, 1) with gaussian.
      noise: gamma (pure epsilon-DP) or gaussian.
      calibration: paper or analytic (gaussian only).
      horizon: known number of steps (binary tree); empty for unbounded.
      unbounded: hybrid or doubling.
      start: public start of the schedule, epoch seconds.
      period: step length in seconds.
      end: public end (exclusive) of a batch replay, epoch seconds.
      block_size: count steps of this many events instead of start/period.
      streams: declared streams.
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
    """
    params = ContinualCountParams(
        horizon=horizon, unbounded=unbounded,
        **_common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
                  noise_key_file))
    return YamlRelease(ContinualCount(params))


def WindowedSumYaml(
    epsilon: float,
    clip_bound: float,
    window: int,
    dim: int = 1,
    delta: float = 0.0,
    noise: str = "gamma",
    calibration: str = "paper",
    start: Optional[float] = None,
    period: Optional[float] = None,
    end: Optional[float] = None,
    block_size: Optional[int] = None,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
    granularity: Optional[float] = None,
) -> beam.PTransform:
    """Private running sum with privacy expiration (window tree).

    Each contribution is protected while fewer than window (rounded up to a power of two) later
    steps have been released; afterwards it appears un-noised in later releases (window DP).

    Args:
      epsilon: privacy budget per contribution within the window (> 0).
      clip_bound: L2 bound R of each contribution.
      window: number of steps W a contribution stays protected.
      dim: number of value coordinates.
      delta: 0 with gamma noise, in (0, 1) with gaussian.
      noise: gamma or gaussian.
      calibration: paper or analytic (gaussian only).
      start: public start of the schedule, epoch seconds.
      period: step length in seconds.
      end: public end (exclusive) of a batch replay, epoch seconds.
      block_size: count steps instead of start/period.
      streams: declared streams.
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
      granularity: release on the power-of-two grid at or above this value with exact arithmetic
        (floating-point defence; calibrated for clip_bound + sqrt(dim) * grid).
    """
    params = WindowedSumParams(
        dim=int(dim), clip_bound=float(clip_bound), window=int(window), granularity=granularity,
        **_common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
                  noise_key_file))
    return YamlRelease(WindowedSum(params))


def _noise_key(noise_key_env: Optional[str], noise_key_file: Optional[str]) -> NoiseKey:
    return NoiseKey(env_var=noise_key_env, key_file=noise_key_file)


def _as_example(row: Any, n_features: int, classification: bool) -> tuple:
    return to_example(_fields(row), n_features, classification)


def ContinualModelReleaseYaml(
    n_features: int,
    epsilon: float,
    update: int,
    base: int,
    classes: Optional[Iterable[Any]] = None,
    lam: float = 1.0,
    delta: float = 0.0,
    noise: str = "gamma",
    clip_bound: float = 1.0,
    huber: float = 1.0,
    variant: str = "cumulative",
    sampling: bool = False,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
) -> beam.PTransform:
    """Privately trained linear models per stream (ERM, Algorithm 4/8): a model over the stream so
    far every ``update`` examples from ``base`` examples on (count steps in arrival order).

    Guarantee: each example is epsilon-DP (gamma, K-norm noise) or (epsilon, delta)-DP (gaussian)
    over all releases, forever; features are clipped to L2 norm clip_bound. Public: the classes,
    the streams, the arrival count and order per stream. A release's value is the model's
    ``intercepts`` and ``weights`` (names and shapes in ``parts``); ``beam_dp.io.load_model`` reads it.

    Args:
      n_features: number of feature columns x_0..x_{d-1}.
      epsilon: privacy budget per example (> 0).
      update: b0, examples per step.
      base: B, examples before the first model (a multiple of update).
      classes: public class labels (matched as text): multiclass logistic regression; empty: Huber regression.
      lam: regularisation strength.
      delta: 0 with gamma noise, in (0, 1) with gaussian.
      noise: gamma (pure epsilon-DP) or gaussian.
      clip_bound: L2 bound of each feature vector.
      huber: Huber threshold (regression).
      variant: cumulative, basic or independent.
      sampling: Algorithm 8 (subsampled releases).
      streams: declared streams (others are dead-lettered).
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
    """
    params = ContinualModelParams(
        n_features=int(n_features), classes=tuple(str(c) for c in classes) if classes else None, lam=float(lam),
        epsilon=float(epsilon), delta=float(delta), noise=noise, clip_bound=float(clip_bound), huber=float(huber),
        update=int(update), base=int(base), variant=variant, sampling=bool(sampling), streams=_streams(streams),
        noise_key=_noise_key(noise_key_env, noise_key_file))
    return YamlRelease(ContinualModelRelease(params),
                       beam.Map(_as_example, params.n_features, params.classes is not None))


def _as_record(row: Any, dim: int, event_time: bool) -> tuple:
    return to_record(_fields(row), dim, event_time)


def _constraint(constraint: str, radius: float) -> dict:
    return {"kind": constraint, "radius": float(radius)}


def OnlineLearnerYaml(
    dim: int,
    epsilon: float,
    window: int,
    algorithm: str = "cocop",
    constraint: str = "l2_ball",
    radius: float = 1.0,
    loss: str = "logistic",
    mu: float = 1.0,
    delta: float = 0.0,
    noise: str = "gamma",
    calibration: str = "paper",
    beta: float = 0.05,
    alpha: Optional[float] = None,
    C0: Optional[float] = None,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
) -> beam.PTransform:
    """Private online learning with privacy expiration (WDP-COCOP / WDP-COCOL) per stream: one row
    per step in arrival order, releasing the next decision ``{"x": x}`` at every step.

    Guarantee: window epsilon-DP (gamma) or window (epsilon, delta)-DP (gaussian) over the last
    2^ceil(log2 window) rows of a stream, event level; older rows are effectively published. Rows
    are clipped (features to norm 1, labels to [-1, 1]). Public: streams, arrival order and count.

    Args:
      dim: number of feature columns x_0..x_{d-1}.
      epsilon: privacy budget per row within the window (> 0).
      window: number of rows a row stays protected.
      algorithm: cocop or cocol.
      constraint: l2_ball, l1_ball or simplex.
      radius: radius of the constraint set.
      loss: logistic (labels -1/+1) or squared.
      mu: strong-convexity parameter.
      delta: 0 with gamma noise, in (0, 1) with gaussian.
      noise: gamma or gaussian.
      calibration: paper or analytic (gaussian only).
      beta: cocol failure probability.
      alpha: cocol constant (default: the paper's).
      C0: cocol constant (default: the paper's).
      streams: declared streams.
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
    """
    params = OnlineLearnerParams(
        dim=int(dim), constraint=_constraint(constraint, radius), epsilon=float(epsilon), window=int(window),
        algorithm=algorithm, loss=loss, mu=float(mu), delta=float(delta), noise=noise, calibration=calibration,
        beta=float(beta), alpha=alpha, C0=C0, streams=_streams(streams),
        noise_key=_noise_key(noise_key_env, noise_key_file))
    return YamlRelease(OnlineLearner(params), beam.Map(_as_record, params.dim, False))


def IncrementalRegressionYaml(
    dim: int,
    epsilon: float,
    delta: float,
    algorithm: str = "privincreg1",
    constraint: str = "l2_ball",
    radius: float = 1.0,
    horizon: Optional[int] = None,
    release_every: int = 1,
    calibration: str = "paper",
    options: Optional[Mapping[str, Any]] = None,
    start: Optional[float] = None,
    period: Optional[float] = None,
    end: Optional[float] = None,
    block_size: Optional[int] = None,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
) -> beam.PTransform:
    """Private incremental least-squares regression (PRIVINCREG1/2, PRIVINCERM) per stream,
    releasing ``{"theta": theta}`` every ``release_every`` steps.

    Guarantee: (epsilon, delta)-DP per row (event level) over the whole stream (or its horizon);
    rows are clipped (features to norm 1, labels to [-1, 1]). Public: streams, the step schedule
    (and row counts with count steps), release times. Event-time steps need a ``timestamp`` column.

    Args:
      dim: number of feature columns x_0..x_{d-1}.
      epsilon: privacy budget per row (> 0).
      delta: in (0, 1).
      algorithm: privincreg1, privincreg2 or privincerm.
      constraint: l2_ball, l1_ball or simplex.
      radius: radius of the constraint set.
      horizon: known number of steps; empty for unbounded (privincreg).
      release_every: release theta every k steps.
      calibration: paper or analytic.
      options: the mechanism's other keyword arguments (m, tau, iterations, ...).
      start: public start of the schedule, epoch seconds.
      period: step length in seconds.
      end: public end (exclusive) of a batch replay, epoch seconds.
      block_size: count steps of this many rows instead of start/period.
      streams: declared streams.
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
    """
    params = IncrementalRegressionParams(
        dim=int(dim), epsilon=float(epsilon), delta=float(delta), algorithm=algorithm,
        constraint=_constraint(constraint, radius), horizon=horizon, release_every=int(release_every),
        calibration=calibration, options=dict(options or {}), streams=_streams(streams),
        noise_key=_noise_key(noise_key_env, noise_key_file), **_schedule(start, period, end, block_size))
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


def GrowingDatabaseQueriesYaml(
    universe: Union[str, Mapping[str, Any]],
    n: int,
    epsilon: float,
    start: float,
    period: float,
    end: Optional[float] = None,
    mechanism: str = "pmwg",
    alpha: float = 0.25,
    delta: float = 0.0,
    beta: float = 0.05,
    gamma: Optional[float] = None,
    snapshots: bool = False,
    streams: Optional[Iterable[str]] = None,
    noise_key_env: Optional[str] = "BEAM_DP_NOISE_KEY",
    noise_key_file: Optional[str] = None,
) -> beam.PTransform:
    """Private answers to linear queries on growing databases (PMWG, BBScheduler, BBImprover) per
    stream; a query ``(query_id, t)`` is answered on the database of the first t elements.

    Guarantee: each element is epsilon-DP (or (epsilon, delta)-DP with delta > 0) from its arrival
    on, over all answers, forever. Public: the universe, the schedule, the arrival count per stream,
    the queries. Outputs releases (one row per answer, meta has query_id), dead_letter and
    snapshots (the public synthetic histogram, with snapshots true).

    Args:
      universe: the public universe, {field: [categories] | {edges: [...]} | {range: k}} (mapping or JSON text).
      n: database size before the first query.
      epsilon: privacy budget per element (> 0).
      start: public start of the step schedule, epoch seconds.
      period: step length in seconds.
      end: public end (exclusive), required for a batch replay.
      mechanism: pmwg, bbscheduler or bbimprover.
      alpha: pmwg target accuracy.
      delta: > 0 for bbimprover.
      beta: scheduler failure probability.
      gamma: bbscheduler growth exponent.
      snapshots: also release the synthetic histogram as steps close.
      streams: declared streams.
      noise_key_env: name of the env var holding the noise key (hex) on the workers.
      noise_key_file: path of the noise key file on the workers.
    """
    try:
        parsed = parse_universe(universe if isinstance(universe, str) else json.dumps(dict(universe)))
    except UsageError as exc:
        raise ValueError(str(exc).replace("--universe", "universe")) from None
    params = GrowingDatabaseParams(
        universe=parsed, n=int(n), epsilon=float(epsilon), delta=float(delta), mechanism=mechanism,
        alpha=float(alpha), beta=float(beta), gamma=gamma, snapshots=bool(snapshots), streams=_streams(streams),
        noise_key=_noise_key(noise_key_env, noise_key_file), **_schedule(start, period, end, None))
    return YamlRelease(GrowingDatabaseQueries(params), _GrowingInputs(parsed))


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
