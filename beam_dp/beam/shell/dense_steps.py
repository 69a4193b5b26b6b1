"""A bundle's clipped sums of one window as one dense (step, stream) array, for the parse stage of a batch
replay keyed by stream groups (:class:`~beam_dp.beam.shell.combine.BundleGroupSums` holds them while they fit
its budget).

Rows go in one at a time, as clipped contributions: a batch is added with one ``np.add.at`` over the
flat cells, with no per-batch sums per (stream, step) and no per-(group, step) slices before it. That is
worth it when the window's streams × steps fit the budget (10,000 × 200 at d = 8: 160 MB); beyond, the
bundle keeps its sparse per-(group, step) accumulators. What leaves is the same per-(group, step)
``GroupBlock``s, rows sorted by stream name. The stream table is a worker-local index of names, never
state; nothing leaves but the clipped sums, counts and clipped counts.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterator

import numpy as np

from beam_dp.mechanisms.stream_groups import GroupBlock

__all__ = ["DenseSteps", "StreamTable"]


class StreamTable:
    """Stream name → row, in order of first sight, and each row's group key (worker-local)."""

    def __init__(self) -> None:
        self.row: dict[str, int] = {}
        self.names: list[str] = []
        self.keys: list[str] = []  # distinct group keys, in order of first sight
        self._key_index: dict[str, int] = {}
        self._key_of_row: list[int] = []
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # (key of row, rank by name), when current

    def rows_of(self, names: list[str], key_of: Callable[[str], str]) -> np.ndarray:
        """The rows of ``names`` (new names join, their group key from ``key_of``)."""
        try:  # the usual case once the streams are known: one C-level pass
            return np.fromiter(map(self.row.__getitem__, names), np.int64, len(names))
        except KeyError:
            pass
        for name in names:
            if name not in self.row:
                name = sys.intern(name)  # blocks share the name objects
                key = key_of(name)
                index = self._key_index.get(key)
                if index is None:
                    index = self._key_index[key] = len(self.keys)
                    self.keys.append(key)
                self.row[name] = len(self.names)
                self.names.append(name)
                self._key_of_row.append(index)
                self._arrays = None
        return np.fromiter(map(self.row.__getitem__, names), np.int64, len(names))

    def by_key(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(key, rows)`` for every key in key order, its rows in name order."""
        if self._arrays is None:
            rank = np.empty(len(self.names), np.int64)
            rank[np.argsort(np.array(self.names, dtype=str), kind="stable")] = np.arange(len(self.names))
            self._arrays = np.array(self._key_of_row, np.int64), rank
        key_of_row, rank = self._arrays
        key_rank = np.argsort(np.array(self.keys, dtype=str), kind="stable")
        position = np.empty(len(key_rank), np.int64)
        position[key_rank] = np.arange(len(key_rank))
        order = np.lexsort((rank, position[key_of_row]))
        bounds = np.searchsorted(position[key_of_row][order], np.arange(len(key_rank) + 1))
        for k, index in enumerate(key_rank.tolist()):
            yield self.keys[index], order[bounds[k]:bounds[k + 1]]


class DenseSteps:
    """One window's sums: ``cells[s, r]`` holds row ``r``'s clipped sums (d), count and clipped count at
    step ``first + s`` (counts exact in float64 below 2^53). Rows and steps grow by copying, with a
    quarter's headroom where the budget allows."""

    __slots__ = ("dim", "first", "cells")

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.first = 0
        self.cells = np.zeros((0, 0, dim + 2))

    @property
    def nbytes(self) -> int:
        return self.cells.nbytes

    def bytes_for(self, rows: int, lo: int, hi: int) -> int:
        """The bytes it would hold with ``rows`` rows and steps ``lo ..= hi`` added (no headroom)."""
        first, last, width = self._extent(rows, lo, hi)
        return (last - first + 1) * width * (self.dim + 2) * 8

    def _extent(self, rows: int, lo: int, hi: int) -> tuple[int, int, int]:
        """``(first step, last step, rows)`` holding what it holds, ``rows`` rows and steps ``lo ..= hi``."""
        span, width = self.cells.shape[:2]
        if span:
            lo, hi = min(lo, self.first), max(hi, self.first + span - 1)
        return lo, hi, max(rows, width)

    def add(self, rows: np.ndarray, steps: np.ndarray, cells: np.ndarray, n_rows: int, room: int) -> int:
        """Add ``cells[j]`` (clipped sum (d), count, clipped count) to row ``rows[j]`` at ``steps[j]``
        (repeats add up); ``n_rows`` the table's rows, ``room`` the bytes it may take beyond what it needs
        (headroom). The bytes it grew by."""
        before = self.nbytes
        self._fit(n_rows, int(steps.min()), int(steps.max()), room)
        width, cols = self.cells.shape[1], self.dim + 2
        flat = ((steps - self.first) * width + rows) * cols
        np.add.at(self.cells.reshape(-1), (flat[:, None] + np.arange(cols)).ravel(), cells.ravel())
        return self.nbytes - before

    def _fit(self, rows: int, lo: int, hi: int, room: int) -> None:
        span, width = self.cells.shape[:2]
        if span and lo >= self.first and hi < self.first + span and rows <= width:
            return
        first, last, need_width = self._extent(rows, lo, hi)
        need_span = last - first + 1
        row_bytes = (self.dim + 2) * 8
        if span and need_width > width:  # streams keep coming: a quarter more rows
            extra = min(need_width // 4, room // (need_span * row_bytes))
            need_width += max(extra, 0)
        elif span:  # steps keep coming (time order): a quarter more steps, on the side they grow
            extra = max(min(need_span // 4, room // (need_width * row_bytes)), 0)
            if hi >= self.first + span:
                last += extra
            else:
                first -= extra
            need_span = last - first + 1
        cells = np.zeros((need_span, need_width, self.dim + 2))
        if span:
            cells[self.first - first:self.first - first + span, :width] = self.cells
        self.first, self.cells = first, cells

    def take(self, table: StreamTable) -> Iterator[tuple[str, int, GroupBlock]]:
        """``(key, step, block)`` for every (group, step) with rows, by (key, step); the array is freed."""
        cells, names, d = self.cells, table.names, self.dim
        self.cells = np.zeros((0, 0, d + 2))
        width = cells.shape[1]
        for key, rows in table.by_key():
            rows = rows[rows < width]
            if not len(rows):
                continue
            group = cells[:, rows]
            for s in range(group.shape[0]):
                present = np.flatnonzero(group[s, :, d] > 0)
                if len(present):
                    block = group[s, present]
                    yield key, self.first + s, GroupBlock(
                        tuple(map(names.__getitem__, rows[present].tolist())), np.ascontiguousarray(block[:, :d]),
                        block[:, d].astype(np.int64), block[:, d + 1].astype(np.int64))
