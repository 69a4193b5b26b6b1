"""The report's pass over the releases, one Arrow batch at a time, never a Python object per release.

Over every release, per mechanism: the row count, the last step, the set of stream names, the
budgets, and per step the largest and smallest ``epsilon_spent`` and the largest ``delta_spent`` of
any stream (numpy on the batch's columns). The rows of the drawn streams only (per mechanism, the
first ``max_streams`` stream names in sorted order, as far as the pass has seen: a stream that a
smaller name displaces is dropped) are kept for the figures, as numbers only: step, first coordinate,
length of the value, noise std and accuracy read from the meta, spend. Memory grows with the streams
(their names), the steps and the drawn streams' releases, never with all the releases.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.report.progress import ReadProgress
from beam_dp.report.sources import iter_batches

__all__ = ["ACCURACY_KEYS", "DrawnSeries", "MechanismAggregate", "ReleaseAggregate", "StepSpend", "accuracy",
           "aggregate_files", "noise_std"]

#: Meta keys read as model-snapshot accuracy, first numeric (or mapping of numbers) match wins.
ACCURACY_KEYS = ("accuracy", "average_accuracy", "snapshot_accuracy", "test_accuracy")
#: What the figures keep of a drawn release, in :class:`DrawnSeries` order.
_KEPT = ("steps", "first", "dims", "noise_std", "accuracy", "epsilon_spent", "delta_spent")


def noise_std(meta: dict, dim: int) -> float:
    """Per-coordinate standard deviation of the error of a release of ``dim`` values with ``meta``;
    NaN where the release does not say."""
    std = meta.get("noise_std")
    if std is not None:
        return float(np.ravel(std)[0])
    scale, law = meta.get("noise_scale"), meta.get("law")
    if isinstance(scale, (int, float)) and law == "gaussian":
        return float(scale)
    if isinstance(scale, (int, float)) and law == "gamma":  # K-norm in d dims: variance (d + 1)·b² per coordinate
        return float(np.sqrt(dim + 1) * scale)
    return float("nan")


def accuracy(meta: dict) -> float | None:
    """The first accuracy in ``meta`` (a number, or the mean of a mapping of per-task numbers)."""
    for key in ACCURACY_KEYS:
        value = meta.get(key)
        if isinstance(value, dict):
            numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                return float(np.mean(numbers))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _codes(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """A text column as (integer codes, distinct values)."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.indices.to_numpy(zero_copy_only=False), column.dictionary


def _numbers(column: pa.Array, dtype: type) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)


@dataclass
class StepSpend:
    """Per step (sorted), over every stream: the largest and smallest ``epsilon_spent`` and the largest
    ``delta_spent`` (worst-case loss of any element up to that release)."""

    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    epsilon_max: np.ndarray = field(default_factory=lambda: np.zeros(0))
    epsilon_min: np.ndarray = field(default_factory=lambda: np.zeros(0))
    delta_max: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, steps: np.ndarray, epsilon: np.ndarray, delta: np.ndarray) -> None:
        """Fold in releases at ``steps`` spending ``(epsilon, delta)``."""
        if not len(steps):
            return
        all_steps = np.concatenate([self.steps, steps])
        order = np.argsort(all_steps, kind="stable")
        ordered = all_steps[order]
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        self.steps = ordered[starts]
        self.epsilon_max = np.maximum.reduceat(np.concatenate([self.epsilon_max, epsilon])[order], starts)
        self.epsilon_min = np.minimum.reduceat(np.concatenate([self.epsilon_min, epsilon])[order], starts)
        self.delta_max = np.maximum.reduceat(np.concatenate([self.delta_max, delta])[order], starts)


@dataclass
class DrawnSeries:
    """One drawn stream's releases of one mechanism, in step order: the first coordinate of each value
    (NaN for an empty one), the value's length, the noise std and accuracy its meta gives (NaN where
    it gives none: :func:`noise_std`, :func:`accuracy`), the spend."""

    stream: str
    steps: np.ndarray
    first: np.ndarray
    dims: np.ndarray
    noise_std: np.ndarray
    accuracy: np.ndarray
    epsilon_spent: np.ndarray
    delta_spent: np.ndarray


def _meta_facts(metas: pa.Array, dims: np.ndarray, where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """(noise std, accuracy) of releases with ``metas`` (JSON text) and value lengths ``dims``, each
    distinct (meta, length) computed once; ``ValueError`` naming the release (``where(row)``) for a
    meta that is not a JSON object."""
    codes, texts = _codes(metas)
    base = int(dims.max(initial=0)) + 1
    pairs, inverse = np.unique(codes.astype(np.int64) * base + dims, return_inverse=True)
    parsed: dict[int, dict] = {}
    std, acc = np.empty(len(pairs)), np.empty(len(pairs))
    for i, pair in enumerate(pairs.tolist()):
        code, dim = divmod(pair, base)
        if code not in parsed:
            try:
                meta = json.loads(texts[code].as_py())
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                row = int(np.flatnonzero(codes == code)[0])
                raise ValueError(f"the release {where(row)} has a meta that is not a JSON object: "
                                 "not a beam_dp release")
            parsed[code] = meta
        a = accuracy(parsed[code])
        std[i], acc[i] = noise_std(parsed[code], dim), np.nan if a is None else a
    return std[inverse.ravel()], acc[inverse.ravel()]


def _first_and_dims(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """First element and length of each list of ``values`` (NaN first for an empty list)."""
    dims = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = _numbers(pc.list_flatten(values), np.float64)
    starts = np.cumsum(dims) - dims
    first = np.full(len(dims), np.nan)
    first[dims > 0] = flat[starts[dims > 0]]
    return first, dims


class MechanismAggregate:
    """The releases of one mechanism: totals over all of them, the rows of its drawn streams."""

    def __init__(self, name: str, max_streams: int) -> None:
        self.name = name
        self.max_streams = max_streams
        self.rows = 0
        self.last_step: int | None = None
        self.streams: set[str] = set()
        self.drawn: list[str] = []  # sorted
        self.epsilon_budgets: set[float] = set()
        self.spend = StepSpend()
        self._kept: dict[str, list[tuple[np.ndarray, ...]]] = {}  # drawn stream -> per batch, _KEPT arrays

    def add(self, batch: pa.RecordBatch, rows: np.ndarray | None, stream_codes: np.ndarray,
            stream_names: pa.Array, step: np.ndarray, epsilon: np.ndarray, delta: np.ndarray,
            budget: np.ndarray) -> None:
        """Fold in the ``rows`` of ``batch`` (a boolean mask; None: all) that are this mechanism's."""
        codes = stream_codes if rows is None else stream_codes[rows]
        used = np.flatnonzero(np.bincount(codes, minlength=len(stream_names)))
        names = stream_names.take(pa.array(used)).to_pylist()
        self.streams.update(names)
        if names and (len(self.drawn) < self.max_streams or min(names) < self.drawn[-1]):
            self.drawn = heapq.nsmallest(self.max_streams, set(self.drawn).union(names))
            for displaced in set(self._kept) - set(self.drawn):
                del self._kept[displaced]
        drawn_set = set(self.drawn)
        drawn_codes = {code: name for code, name in zip(used.tolist(), names) if name in drawn_set}
        flag = np.zeros(len(stream_names), dtype=bool)
        flag[list(drawn_codes)] = True
        selected = flag[stream_codes] if rows is None else flag[stream_codes] & rows
        if selected.any():
            self._keep(batch, np.flatnonzero(selected), stream_codes, drawn_codes, step, epsilon, delta)
        if rows is not None:
            step, epsilon, delta, budget = step[rows], epsilon[rows], delta[rows], budget[rows]
        self.rows += len(step)
        last = int(step.max())
        self.last_step = last if self.last_step is None else max(self.last_step, last)
        self.epsilon_budgets.update(np.unique(budget).tolist())
        self.spend.add(step, epsilon, delta)

    def _keep(self, batch: pa.RecordBatch, index: np.ndarray, stream_codes: np.ndarray, drawn_codes: dict[int, str],
              step: np.ndarray, epsilon: np.ndarray, delta: np.ndarray) -> None:
        """Keep the numbers the figures need of the drawn streams' rows ``index`` of ``batch``."""
        take = pa.array(index)
        first, dims = _first_and_dims(batch.column("value").take(take))
        codes, steps = stream_codes[index], step[index]

        def where(i: int) -> str:
            return f"of stream {drawn_codes[int(codes[i])]!r} at step {int(steps[i])} ({self.name})"

        std, acc = _meta_facts(batch.column("meta").take(take), dims, where)
        columns = (steps, first, dims, std, acc, epsilon[index], delta[index])
        for code, name in drawn_codes.items():
            mine = codes == code
            if mine.any():
                self._kept.setdefault(name, []).append(tuple(c[mine] for c in columns))

    @property
    def kept_rows(self) -> int:
        """Rows held for the figures (the drawn streams' releases)."""
        return sum(len(part[0]) for parts in self._kept.values() for part in parts)

    def series(self) -> list[DrawnSeries]:
        """The drawn streams' releases, one :class:`DrawnSeries` per stream in name order."""
        out = []
        for stream in self.drawn:
            parts = self._kept.get(stream)
            if not parts:
                continue
            columns = [np.concatenate([part[i] for part in parts]) for i in range(len(_KEPT))]
            order = np.argsort(columns[0], kind="stable")
            out.append(DrawnSeries(stream, *(c[order] for c in columns)))
        return out


class ReleaseAggregate:
    """Release batches folded in one at a time (:meth:`add`): per mechanism a :class:`MechanismAggregate`."""

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        self.rows = 0
        self.mechanisms: dict[str, MechanismAggregate] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold in one batch with the columns of ``beam_dp.report.sources.REQUIRED_COLUMNS``."""
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        mechanism_codes, mechanism_names = _codes(batch.column("mechanism"))
        stream_codes, stream_names = _codes(batch.column("stream"))
        step = _numbers(batch.column("step"), np.int64)
        epsilon = _numbers(batch.column("epsilon_spent"), np.float64)
        delta = _numbers(batch.column("delta_spent"), np.float64)
        budget = _numbers(batch.column("epsilon_budget"), np.float64)
        present = np.flatnonzero(np.bincount(mechanism_codes, minlength=len(mechanism_names)))
        for code in present.tolist():
            name = mechanism_names[code].as_py()
            aggregate = self.mechanisms.get(name)
            if aggregate is None:
                aggregate = self.mechanisms[name] = MechanismAggregate(name, self.max_streams)
            rows = None if len(present) == 1 else mechanism_codes == code
            aggregate.add(batch, rows, stream_codes, stream_names, step, epsilon, delta, budget)

    def stream_count(self) -> int:
        """Distinct stream names over every mechanism."""
        if len(self.mechanisms) == 1:
            return len(next(iter(self.mechanisms.values())).streams)
        return len(set().union(*(m.streams for m in self.mechanisms.values())))

    @property
    def last_step(self) -> int:
        return max((m.last_step for m in self.mechanisms.values() if m.last_step is not None), default=0)

    @property
    def has_delta(self) -> bool:
        return any(len(m.spend.delta_max) and m.spend.delta_max.max() > 0 for m in self.mechanisms.values())


def aggregate_files(paths: list[str], max_streams: int, progress: ReadProgress | None = None) -> ReleaseAggregate:
    """Every release of ``paths`` folded into one :class:`ReleaseAggregate`, a batch at a time
    (``ReportInputError`` for a file that is not releases)."""
    aggregate = ReleaseAggregate(max_streams)
    for done, path in enumerate(paths):
        for batch in iter_batches(path):
            aggregate.add(batch)
            if progress is not None:
                progress.update(done, aggregate.rows)
    return aggregate
