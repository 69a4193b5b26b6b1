"""Labelled records in columns: one block of a file's rows for the per-record families (ERM, learners).

A job reading labelled records from CSV / Parquet sends each Arrow batch on as one
:class:`LabelledColumns` instead of one ``(stream_id, features, label)`` element per row. Row ``i`` of
a block stands for exactly the record the per-record path would have built from the same row
(:meth:`LabelledColumns.record`), so a parse stage validates the block in vectorised passes and still
dead-letters a bad row with that record as its ``element``. A row whose cells the arrays cannot hold
(a missing or non-numeric feature, a label that is not a number where numbers are expected, a stream
id that is not text) is ``odd``: the block keeps its record as built row by row, and the parse stage
checks it as one element. Engine-neutral (no Beam).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["LabelledColumns"]


@dataclass(frozen=True, eq=False)
class LabelledColumns:
    """``n`` labelled records in columns: ``stream_ids`` (n,) object (the ids as read: str or None),
    ``features`` (n, d) float64, ``labels`` (n,) float64 numbers, or int codes into ``label_names`` (k,)
    object (class labels as the record has them); ``odd``: row -> its record, for the rows the
    arrays do not describe (their array cells are placeholders)."""

    stream_ids: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    label_names: np.ndarray | None = None
    odd: Mapping[int, tuple] = field(default_factory=dict)

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

    def records(self) -> list[tuple]:
        """Every row's record, in order (built only when asked: a dead letter for the rows is written)."""
        return [self.record(i) for i in range(len(self))]

    def take(self, rows: np.ndarray) -> LabelledColumns:
        """The block of ``rows`` (int indices, in their order)."""
        rows = np.asarray(rows, dtype=np.int64)
        odd = {}
        if self.odd:
            keys = np.fromiter(self.odd, dtype=np.int64, count=len(self.odd))
            odd = {int(j): self.odd[int(rows[j])] for j in np.flatnonzero(np.isin(rows, keys))}
        return LabelledColumns(self.stream_ids[rows], self.features[rows], self.labels[rows], self.label_names, odd)
