"""A file's rows in columns: one block of rows for the per-record families (ERM, learners, growing databases).

A job reading records from CSV / Parquet sends each Arrow batch on as one block instead of one element
per row: :class:`LabelledColumns` (``(stream_id, features, label)`` records) or :class:`ElementColumns`
(growing-database elements ``{stream_id, timestamp, value}``). Row ``i`` of a block stands for exactly
the element the per-row path would have built from the same row (``record(i)``), so a parse stage
validates the block in vectorised passes and still dead-letters a bad row with that element as its
``element``. A row whose cells the arrays cannot hold (a missing or non-numeric value, a stream id that
is not text) is ``odd``: the block keeps its element as built row by row, and the parse stage checks it
as one element. Engine-neutral (no Beam).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from beam_dp.steps.events import record_source

__all__ = ["ElementColumns", "LabelledColumns", "RowColumns"]


class RowColumns:
    """What every block of rows in columns has: ``len``, ``odd`` (row -> its element, for the rows the
    arrays do not describe), ``record(i)``, row ``i`` as the per-row element, and where the rows were
    read: ``source`` (the file, or None) and ``rows`` ((n,) int64 record numbers in it, or None)."""

    odd: Mapping[int, Any]
    source: str | None
    rows: np.ndarray | None

    def records(self) -> list:
        """Every row's element, in order (built only when asked: a dead letter for the rows is written)."""
        return [self.record(i) for i in range(len(self))]

    def source_of(self, i: int) -> str | None:
        """``<file>#record=<n>`` of row ``i`` (:func:`~beam_dp.steps.events.record_source`), None if unknown."""
        if self.source is None or self.rows is None:
            return None
        return record_source(self.source, int(self.rows[i]))

    def _rows_of(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.rows is None else self.rows[rows]

    def _odd_of(self, rows: np.ndarray) -> dict[int, Any]:
        """``odd`` of the block of ``rows`` (int indices, in their order), renumbered."""
        if not self.odd:
            return {}
        keys = np.fromiter(self.odd, dtype=np.int64, count=len(self.odd))
        return {int(j): self.odd[int(rows[j])] for j in np.flatnonzero(np.isin(rows, keys))}


@dataclass(frozen=True, eq=False)
class LabelledColumns(RowColumns):
    """``n`` labelled records in columns: ``stream_ids`` (n,) object (the ids as read: str or None),
    ``features`` (n, d) float64, ``labels`` (n,) float64 numbers, or int codes into ``label_names`` (k,)
    object (class labels as the record has them); ``odd``: row -> its record, for the rows the
    arrays do not describe (their array cells are placeholders)."""

    stream_ids: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    label_names: np.ndarray | None = None
    odd: Mapping[int, tuple] = field(default_factory=dict)
    source: str | None = None
    rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.stream_ids)

    def label(self, i: int) -> Any:
        """Row ``i``'s label as its record has it."""
        if self.label_names is not None:
            return self.label_names[self.labels[i]]
        return float(self.labels[i])

    def record(self, i: int) -> tuple:
        """Row ``i`` as the per-record element ``(stream_id, features, label)``."""
        if i in self.odd:
            return self.odd[i]
        return self.stream_ids[i], self.features[i].tolist(), self.label(i)

    def take(self, rows: np.ndarray) -> LabelledColumns:
        """The block of ``rows`` (int indices, in their order)."""
        rows = np.asarray(rows, dtype=np.int64)
        return LabelledColumns(self.stream_ids[rows], self.features[rows], self.labels[rows], self.label_names,
                               self._odd_of(rows), self.source, self._rows_of(rows))


@dataclass(frozen=True, eq=False)
class ElementColumns(RowColumns):
    """``n`` growing-database elements in columns: ``stream_ids`` (n,) object (str or None as read),
    ``timestamps`` (n,) epoch seconds as read (float64, or int64 for an integer column); per field of the
    universe, in order: its name in ``names`` and its cells in ``values``, float64 numbers (``labels``
    None) or int codes into ``labels`` (k,) object (the field's values as the element has them);
    ``odd``: row -> its element, for the rows the arrays do not describe. Row ``i`` is the element
    ``{"stream_id": .., "timestamp": .., "value": {field: ..}}``."""

    stream_ids: np.ndarray
    timestamps: np.ndarray
    names: tuple[str, ...]
    values: tuple[np.ndarray, ...]
    labels: tuple[np.ndarray | None, ...]
    odd: Mapping[int, dict] = field(default_factory=dict)
    source: str | None = None
    rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.stream_ids)

    def record(self, i: int) -> dict:
        """Row ``i`` as the per-row element mapping."""
        if i in self.odd:
            return self.odd[i]
        value = {name: float(cells[i]) if labels is None else labels[cells[i]]
                 for name, cells, labels in zip(self.names, self.values, self.labels)}
        return {"stream_id": self.stream_ids[i], "timestamp": self.timestamps[i].item(), "value": value}

    def take(self, rows: np.ndarray) -> ElementColumns:
        """The block of ``rows`` (int indices, in their order)."""
        rows = np.asarray(rows, dtype=np.int64)
        return ElementColumns(self.stream_ids[rows], self.timestamps[rows], self.names,
                              tuple(cells[rows] for cells in self.values), self.labels, self._odd_of(rows),
                              self.source, self._rows_of(rows))
