"""beam_dp transforms for Beam YAML: flat configs in, schema'd rows out.

``templates/yaml/providers.yaml`` maps each YAML type to a constructor here (provider type
``python``, no ``packages:``: it runs in-process, nothing is installed at run time). Each YAML
transform takes rows with fields ``stream_id``, ``timestamp`` (epoch seconds or ISO-8601) and
``value`` (a number or a list) or ``value_0..value_{d-1}`` (what ``ReadFromCsv`` gives), and has
two outputs:

* ``releases``: one row per stream per step with the columns of :class:`beam_dp.io.ReleaseRow`
  (``meta`` is JSON text; ``step_start``/``step_end`` are µs since the epoch);
* ``dead_letter``: ``reason``, ``detail`` (never the value), ``stream``, ``element`` (the row, as text).

Privacy parameters are the params objects' (see ``beam_dp.beam.params``); the noise key is given
only by location: ``noise_key_env`` (an env var name) or ``noise_key_file`` (a path), never inline.

Adding a family: write ``def MyTransformYaml(**config) -> PTransform`` that builds the family's
params and wraps its transform with :class:`YamlRelease`, and register it in :data:`REGISTRY`
and in ``templates/yaml/providers.yaml``.
"""


from typing import Any, Callable, Iterable, List, NamedTuple, Optional

import apache_beam as beam

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    NoiseKey,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.core import StepClock
from beam_dp.io.schema import ReleaseRow

__all__ = [
    "REGISTRY", "ContinualCountYaml", "ContinualSumYaml", "DeadLetterRow", "ReleaseRecord", "WindowedSumYaml",
    "YamlRelease",
]


# Functional NamedTuples: their field types stay real types under ``from __future__ import
# annotations`` (Beam needs them to infer the row schemas YAML works with).
ReleaseRecord = NamedTuple("ReleaseRecord", [
    ("stream", str), ("step", int), ("mechanism", str), ("value", List[float]), ("shape", List[int]),
    ("parts", str), ("epsilon_spent", float), ("delta_spent", float), ("epsilon_budget", float),
    ("delta_budget", float), ("window", Optional[int]), ("step_start", Optional[int]),
    ("step_end", Optional[int]), ("meta", str)])
DeadLetterRow = NamedTuple("DeadLetterRow", [
    ("reason", str), ("detail", str), ("stream", Optional[str]), ("element", str)])
assert ReleaseRecord._fields == ReleaseRow._fields, "keep ReleaseRecord in step with beam_dp.io.ReleaseRow"
for _row_type in (ReleaseRecord, DeadLetterRow):
    beam.coders.registry.register_coder(_row_type, beam.coders.RowCoder)


def _as_event(row: Any) -> Any:
    """A YAML row -> the mapping the transforms parse; value columns ``value_0..`` become one list."""
    fields = row._asdict() if hasattr(row, "_asdict") else dict(row)
    if fields.get("value") is None:
        columns = sorted((k for k in fields if k.startswith("value_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        if columns:
            fields["value"] = [fields[k] for k in columns]
    return {"stream_id": fields.get("stream_id"), "timestamp": fields.get("timestamp"), "value": fields.get("value")}


def _dead_letter_row(letter) -> DeadLetterRow:
    return DeadLetterRow(letter.reason, letter.detail, letter.stream, repr(letter.element)[:2000])


class YamlRelease(beam.PTransform):
    """Wrap a beam_dp transform (``ContinualOutputs`` out) for YAML: rows in, named outputs out."""

    def __init__(self, transform: beam.PTransform):
        super().__init__()
        self.transform = transform

    def expand(self, rows):
        out = rows | "AsEvents" >> beam.Map(_as_event) | "Release" >> self.transform
        return {
            "releases": out.releases | "Rows" >> beam.Map(lambda r: ReleaseRecord(*r)).with_output_types(
                ReleaseRecord),
            "dead_letter": out.dead_letter | "DeadLetterRows" >> beam.Map(_dead_letter_row).with_output_types(
                DeadLetterRow),
        }


def _schedule(start: Optional[float], period: Optional[float], end: Optional[float],
              block_size: Optional[int]) -> dict:
    if block_size is not None:
        return {"block_size": int(block_size)}
    if start is None or period is None:
        raise ValueError("give start and period (event-time steps; end for a batch replay) or block_size")
    return {"clock": StepClock(start=float(start), period=float(period), end=None if end is None else float(end))}


def _common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
            noise_key_file) -> dict:
    return dict(
        epsilon=float(epsilon), delta=float(delta), noise=noise, calibration=calibration,
        streams=tuple(streams) if streams else None,
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
    """
    params = ContinualSumParams(
        dim=int(dim), clip_bound=float(clip_bound), horizon=horizon, unbounded=unbounded,
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
    """
    params = WindowedSumParams(
        dim=int(dim), clip_bound=float(clip_bound), window=int(window),
        **_common(epsilon, delta, noise, calibration, start, period, end, block_size, streams, noise_key_env,
                  noise_key_file))
    return YamlRelease(WindowedSum(params))


#: YAML type name -> constructor. ``templates/yaml/providers.yaml`` must list the same names.
REGISTRY: dict[str, Callable[..., beam.PTransform]] = {
    "ContinualSum": ContinualSumYaml,
    "ContinualCount": ContinualCountYaml,
    "WindowedSum": WindowedSumYaml,
}
