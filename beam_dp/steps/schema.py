"""The release row: one schema for every mechanism, as a typed NamedTuple and a pyarrow schema.

Columns:

* ``stream``, ``step``, ``mechanism``;
* ``value`` (list<double>, flattened row-major) and ``shape`` (list<int64>); a release whose value
  is a mapping of named arrays stores them concatenated in name order and lists
  ``[[name, shape], ...]`` in ``parts`` (JSON; empty string for a single array);
* ``epsilon_spent``, ``delta_spent``: worst-case loss of any element up to this release;
* ``epsilon_budget``, ``delta_budget``, ``window``: the mechanism's guarantee (window null = forever);
* ``step_start``, ``step_end``: the step's public event-time interval (UTC, µs; null for count steps);
* ``meta``: public facts as sorted JSON (noise law, scale, ``noise_std``, node counts, calibration);
* ``noise_domain``: the transform instance that made the release (its noise domain; see
  ``beam_dp.beam.shell.domains``) and ``composition`` (``"pure"``, ``"gaussian"`` or ``"approx"``: how its
  spend composes with other transforms', ``beam_dp.core.budget``);
* ``job_epsilon_spent``, ``job_delta_spent``: the job's worst per-contribution loss so far (this
  transform's spend composed with every other transform's full share of the job's budget);
  ``job_epsilon_budget``, ``job_delta_budget``: the job's declared total. Without a job budget the
  transform is the whole job and these equal its own columns;
* ``purpose``: what the release is within its (stream, step) when the mechanism makes several there
  (``"model:<id>"``, ``"query:<seq>"``, ``"run:<i>"``, ``"synthetic"``; ``""`` for a step's one
  release): a noise domain never writes two releases with one (stream, step, purpose);
* ``noise``: the noise declaration of the worst-hit element (JSON ``{"terms": [[law, sensitivity,
  scale, weight], ...]}``, :mod:`beam_dp.core.noise_declaration`) from which ``epsilon_spent`` is
  recomputed; ``""`` for a mechanism that declares none.
"""

import functools
import json
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional

import numpy as np
import pyarrow as pa

from beam_dp.core.budget import BudgetShare, Composition
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.release import Release
from beam_dp.core.release_batch import ReleaseBatch

__all__ = ["RELEASE_SCHEMA", "ReleaseColumns", "ReleaseLabels", "ReleaseRow", "release_table", "release_to_row"]


class ReleaseRow(NamedTuple):
    stream: str
    step: int
    mechanism: str
    value: List[float]
    shape: List[int]
    parts: str
    epsilon_spent: float
    delta_spent: float
    epsilon_budget: float
    delta_budget: float
    window: Optional[int]
    step_start: Optional[int]
    step_end: Optional[int]
    meta: str
    noise_domain: str = ""
    composition: str = ""
    job_epsilon_spent: float = 0.0
    job_delta_spent: float = 0.0
    job_epsilon_budget: float = 0.0
    job_delta_budget: float = 0.0
    purpose: str = ""
    noise: str = ""


RELEASE_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("step", pa.int64()),
        ("mechanism", pa.string()),
        ("value", pa.list_(pa.float64())),
        ("shape", pa.list_(pa.int64())),
        ("parts", pa.string()),
        ("epsilon_spent", pa.float64()),
        ("delta_spent", pa.float64()),
        ("epsilon_budget", pa.float64()),
        ("delta_budget", pa.float64()),
        ("window", pa.int64()),
        ("step_start", pa.timestamp("us", tz="UTC")),
        ("step_end", pa.timestamp("us", tz="UTC")),
        ("meta", pa.string()),
        ("noise_domain", pa.string()),
        ("composition", pa.string()),
        ("job_epsilon_spent", pa.float64()),
        ("job_delta_spent", pa.float64()),
        ("job_epsilon_budget", pa.float64()),
        ("job_delta_budget", pa.float64()),
        ("purpose", pa.string()),
        ("noise", pa.string()),
    ]
)


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"meta value of type {type(obj).__name__} is not JSON-serialisable")


def release_to_row(
    release: Release, guarantee: Guarantee, step_start: int | None = None, step_end: int | None = None
) -> ReleaseRow:
    """Flatten a ``Release`` (times in µs since the epoch) into a ``ReleaseRow``."""
    if isinstance(release.value, np.ndarray):
        value, shape, parts = release.value.ravel().tolist(), list(release.value.shape), ""
    else:
        names = sorted(release.value)
        value = [x for name in names for x in release.value[name].ravel().tolist()]
        shape = []
        parts = json.dumps([[name, list(release.value[name].shape)] for name in names])
    return ReleaseRow(
        stream=release.stream,
        step=int(release.step),
        mechanism=release.mechanism,
        value=value,
        shape=shape,
        parts=parts,
        epsilon_spent=float(release.epsilon_spent),
        delta_spent=float(release.delta_spent),
        epsilon_budget=float(guarantee.epsilon),
        delta_budget=float(guarantee.delta),
        window=guarantee.window,
        step_start=step_start,
        step_end=step_end,
        meta=json.dumps(dict(release.meta), sort_keys=True, default=_json_default),
        purpose=release.purpose,
        noise=release.noise,
    )


@dataclass(frozen=True)
class ReleaseLabels:
    """What a transform stamps on each of its rows: its noise domain, how its spend composes, and its
    share of the job's budget (``None``: the transform is the whole job)."""

    noise_domain: str
    composition: Composition
    budget: BudgetShare | None = None
    #: what a unit-level per-record transform declares in every row's meta (``privacy_unit``,
    #: ``max_records``; ``docs/privacy_units.md``); empty at event level
    unit_meta: tuple[tuple[str, Any], ...] = ()

    def __call__(self, row: ReleaseRow) -> ReleaseRow:
        job = self.job_spend(row.epsilon_spent, row.delta_spent, row.epsilon_budget, row.delta_budget)
        if self.unit_meta:
            row = row._replace(meta=json.dumps({**json.loads(row.meta), **dict(self.unit_meta)}, sort_keys=True))
        return row._replace(noise_domain=self.noise_domain, composition=self.composition,
                            job_epsilon_spent=job[0], job_delta_spent=job[1],
                            job_epsilon_budget=job[2], job_delta_budget=job[3])

    def job_spend(self, epsilon_spent: float, delta_spent: float, epsilon_budget: float,
                  delta_budget: float) -> tuple[float, float, float, float]:
        """``(job_epsilon_spent, job_delta_spent, job_epsilon_budget, job_delta_budget)`` of a release."""
        if self.budget is None:
            return float(epsilon_spent), float(delta_spent), float(epsilon_budget), float(delta_budget)
        job_eps, job_delta = _job_spend(self.budget, epsilon_spent, delta_spent)
        return float(job_eps), float(job_delta), float(self.budget.plan.epsilon), float(self.budget.plan.delta)


class ReleaseColumns(NamedTuple):
    """The releases of a group of streams at one step, columnar (what a group-keyed engine emits):
    the :class:`ReleaseBatch`, its mechanism's guarantee, the step's public interval (µs or None) and
    the transform's labels (None until the transform stamps them)."""

    batch: ReleaseBatch
    guarantee: Guarantee
    step_start: Optional[int]
    step_end: Optional[int]
    labels: Optional["ReleaseLabels"] = None

    def rows(self) -> list[ReleaseRow]:
        """The same releases as :class:`ReleaseRow` s (per-row sinks)."""
        rows = [release_to_row(r, self.guarantee, self.step_start, self.step_end) for r in self.batch.rows()]
        return rows if self.labels is None else [self.labels(row) for row in rows]


def release_table(parts: "list[ReleaseColumns]") -> pa.Table:
    """One :data:`RELEASE_SCHEMA` table of many :class:`ReleaseColumns`, built from whole columns: the
    per-release facts (step, spend, meta, labels) are computed once per part and repeated."""
    sizes = np.array([len(p.batch) for p in parts], dtype=np.int64)
    n = int(sizes.sum())
    dims = np.repeat([p.batch.values.shape[1] for p in parts], sizes)
    offsets = np.zeros(n + 1, dtype=np.int32)  # a table holds < 2^31 values (sinks write ~65,536 releases)
    np.cumsum(dims, out=offsets[1:])
    # a plain vector has shape [d]; a named one (``value_name``) has shape [] and its name in ``parts``
    plain = np.repeat([p.batch.value_name is None for p in parts], sizes)
    shape_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(plain, out=shape_offsets[1:])

    def column(values: list, type_: pa.DataType) -> pa.Array:
        return pa.array(values, type_).take(pa.array(np.repeat(np.arange(len(parts)), sizes)))

    facts = [_facts(p) for p in parts]
    names = [f.name for f in RELEASE_SCHEMA][5:]  # after stream, step, mechanism, value, shape
    columns = [
        pa.array([s for p in parts for s in p.batch.streams], pa.string()),
        column([p.batch.step for p in parts], pa.int64()),
        column([p.batch.mechanism for p in parts], pa.string()),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate([p.batch.values.ravel() for p in parts]))),
        pa.ListArray.from_arrays(pa.array(shape_offsets), pa.array(dims[plain].astype(np.int64))),
        *(column([f[i] for f in facts], RELEASE_SCHEMA.field(name).type) for i, name in enumerate(names)),
    ]
    return pa.Table.from_arrays(columns, schema=RELEASE_SCHEMA)


def _facts(part: ReleaseColumns) -> tuple:
    """The columns after ``shape`` that one part's releases share, in :data:`RELEASE_SCHEMA` order."""
    batch, g, labels = part.batch, part.guarantee, part.labels
    eps, delta = float(batch.epsilon_spent), float(batch.delta_spent)
    job = (0.0,) * 4 if labels is None else labels.job_spend(eps, delta, g.epsilon, g.delta)
    unit_meta = {} if labels is None else dict(labels.unit_meta)
    meta = json.dumps({**dict(batch.meta), **unit_meta}, sort_keys=True, default=_json_default)
    parts = "" if batch.value_name is None else json.dumps([[batch.value_name, [batch.values.shape[1]]]])
    return (parts, eps, delta, float(g.epsilon), float(g.delta), g.window, part.step_start, part.step_end, meta,
            "" if labels is None else labels.noise_domain, "" if labels is None else labels.composition, *job,
            "", batch.noise)  # purpose "": a group step makes one release per stream


@functools.lru_cache(maxsize=1 << 16)
def _job_spend(share: BudgetShare, epsilon_spent: float, delta_spent: float) -> tuple[float, float]:
    # a transform's spend takes one value per step whatever the stream: cache the (bisection-heavy) composition
    return share.job_spend(epsilon_spent, delta_spent)
