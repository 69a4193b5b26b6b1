"""The parse stage's sums per (key, step) of a batch replay, held dense: the lifted combiner
:class:`MergeClippedSums` (keyed by stream) and :class:`BundleGroupSums` (keyed by stream groups).

Beam lifts ``CombinePerKey(MergeClippedSums())`` before the shuffle and keeps one accumulator per
(key, step) live for a whole bundle (up to 100,000 keys), so the accumulator's size is the stage's
memory. Keyed by groups, the parse stage keeps the same accumulators itself (``BundleGroupSums``): a
batch's blocks are added with one sort and a slice per (group, step), where a lifted combiner took one
element per (batch, group, step) (31k at 10M events, ~100 µs of Python each), and the shuffle after it
only merges the bundles' blocks. A group's accumulator is an ``(n, d + 2)`` array of sums, counts and
clipped counts indexed by a
stream → row map shared by every step of the group on this worker: memory grows with the cells, not
with the events or the blocks that carried them (issue 26.1). Nothing private leaves it but the sums
themselves (the same clipped sums the blocks held); the row maps are a worker-local index of stream
names, never state, and the output does not depend on them (rows are sorted by name on the way out).
Beam compacts every live accumulator when the bundle ends but drops them only after the last, so each
frees its arrays as it is compacted (the bundle's accumulators and their output do not coexist).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import apache_beam as beam
import numpy as np

from beam_dp.io.coders import BlockCoder, register_block_coders
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock
from beam_dp.steps.batch import key_step_runs, rows_by_group

__all__ = ["BundleGroupSums", "MergeClippedSums"]

register_block_coders(ClippedSum, GroupBlock)  # array blocks: Beam's size sampling must not pickle them


class _RowMap:
    """Stream name → row, in order of first sight (one per group and worker); ``owners`` (stream → its
    map, shared by the combiner's maps) learns each new name, so the next step of the group finds this map."""

    def __init__(self, owners: dict[str, "_RowMap"] | None = None) -> None:
        self.row: dict[str, int] = {}
        self.names: list[str] = []
        self.owners = {} if owners is None else owners
        self._rank = np.zeros(0, np.int64)

    def rank(self) -> np.ndarray:
        """Each row's position in name order (recomputed when names were added)."""
        if len(self._rank) != len(self.names):
            self._rank = np.empty(len(self.names), np.int64)
            self._rank[np.argsort(np.array(self.names, dtype=str), kind="stable")] = np.arange(len(self.names))
        return self._rank

    def rows_of(self, streams: tuple[str, ...]) -> np.ndarray:
        try:  # the usual case once a group's streams are known: one C-level pass
            return np.fromiter(map(self.row.__getitem__, streams), np.int64, len(streams))
        except KeyError:
            pass
        for name in streams:
            if name not in self.row:
                self.row[name] = len(self.names)
                self.names.append(name)
                self.owners.setdefault(name, self)
        return np.fromiter(map(self.row.__getitem__, streams), np.int64, len(streams))


class _GroupSums:
    """The live accumulator of one (group, step) by row of a ``_RowMap``: ``cells`` (cap, d + 2) holds each
    row's sums, count and clipped count (integers, exact in float64 below 2^53), added in one operation;
    ``seen`` marks rows a block named without counts (a block of zero counts declares its streams)."""

    __slots__ = ("rows", "cells", "seen")

    def __init__(self, rows: _RowMap, dim: int) -> None:
        cap = max(len(rows.names), 16)
        self.rows = rows
        self.cells, self.seen = np.zeros((cap, dim + 2)), np.zeros(cap, bool)

    def add(self, block: GroupBlock) -> None:
        idx = self.rows.rows_of(block.streams)
        self.add_rows(idx, np.column_stack([block.sums, block.counts, block.clipped]))
        self.seen[idx] = True

    def add_rows(self, idx: np.ndarray, cells: np.ndarray) -> None:
        """Add ``cells`` (n, d + 2: sums, counts, clipped counts) to rows ``idx`` (distinct rows of this
        accumulator's row map)."""
        if self.cells is None:
            raise RuntimeError("MergeClippedSums: an accumulator was used after it was compacted")
        if len(self.rows.names) > len(self.seen):  # grow by a quarter: at most 25% unused rows
            self._grow(max(len(self.rows.names), len(self.seen) + len(self.seen) // 4))
        self.cells[idx] += cells

    def _grow(self, cap: int) -> None:
        n = len(self.seen)
        cells = np.zeros((cap, self.cells.shape[1]))
        cells[:n] = self.cells
        self.cells, self.seen = cells, np.concatenate([self.seen, np.zeros(cap - n, bool)])

    def take_block(self) -> GroupBlock:
        """The rows seen, sorted by stream name (a ``GroupBlock``); the accumulator's arrays are freed
        (Beam outputs every live accumulator of a bundle at its end and drops them only after the last:
        freeing each as it leaves keeps the bundle's accumulators and their output from coexisting).
        A taken accumulator is never used again (Beam's contract for ``compact``, ``extract_output`` and
        the inputs of ``merge_accumulators``); using one raises."""
        if self.cells is None:
            raise RuntimeError("MergeClippedSums: an accumulator was used after it was compacted")
        d = self.cells.shape[1] - 2
        rows = np.flatnonzero(self.seen | (self.cells[:, d] > 0))
        rows = rows[np.argsort(self.rows.rank()[rows])]
        names = self.rows.names
        cells = self.cells[rows]
        block = GroupBlock(tuple(map(names.__getitem__, rows.tolist())), np.ascontiguousarray(cells[:, :d]),
                           cells[:, d].astype(np.int64), cells[:, d + 1].astype(np.int64))
        self.cells = self.seen = None
        return block


class MergeClippedSums(beam.CombineFn):
    """Sums the blocks (``ClippedSum`` or ``GroupBlock``) of one key and step (module docstring).

    Accumulators: ``None`` (empty), a ``ClippedSum`` (a stream's key: merged on arrival), a live
    ``_GroupSums`` (a group's key), or a ``GroupBlock`` (what ``compact`` emits to the shuffle and
    ``merge_accumulators`` receives). Sums are added in arrival order, as ``GroupBlock.combine`` does."""

    def __init__(self) -> None:
        self._maps: dict[str, _RowMap] = {}  # stream -> the row map of its group (worker-local index)

    def __getstate__(self) -> dict:
        return {}  # the row maps are rebuilt on each worker

    def __setstate__(self, state: dict) -> None:
        self._maps = {}

    def create_accumulator(self) -> Any:
        return None

    def get_accumulator_coder(self) -> BlockCoder:
        return BlockCoder()  # a live accumulator is sampled by size after the merge: not pickled for it

    def add_input(self, acc: Any, block: Any) -> Any:
        if isinstance(block, ClippedSum):
            return block if acc is None else acc.merge(block)
        if not isinstance(acc, _GroupSums):
            acc = self._live(acc, block)
        acc.add(block)
        return acc

    def merge_accumulators(self, accs: Iterable[Any]) -> Any:
        merged = None
        for acc in accs:
            if acc is None:
                continue
            if isinstance(acc, ClippedSum):
                merged = acc if merged is None else merged.merge(acc)
                continue
            merged = self.add_input(merged, acc.take_block() if isinstance(acc, _GroupSums) else acc)
        return merged

    def compact(self, acc: Any) -> Any:
        return acc.take_block() if isinstance(acc, _GroupSums) else acc

    def extract_output(self, acc: Any) -> Any:
        return self.compact(acc)

    def _live(self, acc: GroupBlock | None, block: GroupBlock) -> _GroupSums:
        """A live accumulator on the row map of ``block``'s group (holding ``acc``'s sums, if any)."""
        rows = next((self._maps[name] for name in block.streams if name in self._maps), None)
        live = _GroupSums(_RowMap(self._maps) if rows is None else rows, block.sums.shape[1])
        if acc is not None:
            live.add(acc)
        return live


class BundleGroupSums:
    """A bundle's clipped sums per (window, group key, step) for a batch replay keyed by stream groups,
    held in the parse stage itself: the same dense accumulators as :class:`MergeClippedSums` (one row map
    per group), filled from a batch's per-(stream, step) sums with one vectorised add per (group, step)
    instead of one ``GroupBlock`` element per (batch, group, step) through a lifted combiner.
    :meth:`take` empties it (at the end of the bundle), each accumulator freed as its block leaves."""

    def __init__(self, dim: int) -> None:
        self._dim = dim
        self._maps: dict[str, _RowMap] = {}  # group key -> its row map (worker-local index, never state)
        self._acc: dict[tuple[Any, str, int], _GroupSums] = {}

    def __bool__(self) -> bool:
        return bool(self._acc)

    def add(self, window: Any, keys: list[str], names: list[str], key_of_name: np.ndarray,
            name_of_block: np.ndarray, steps: np.ndarray, sums: np.ndarray, counts: np.ndarray,
            clipped: np.ndarray) -> None:
        """Add blocks ``i``: stream ``names[name_of_block[i]]`` (of group ``keys[key_of_name[...]]``) at
        ``steps[i]``, its sums ``sums[i]`` (d,), ``counts[i]`` and ``clipped[i]``; the blocks of one
        (group, step) are of distinct streams."""
        row_of_name = np.empty(len(names), np.int64)
        for k, members in enumerate(rows_by_group(key_of_name, len(keys))):  # new streams join their row map
            if len(members):
                row_of_name[members] = self._row_map(keys[k]).rows_of(tuple(map(names.__getitem__, members.tolist())))
        key_of_block = key_of_name[name_of_block]
        order, starts = key_step_runs(key_of_block, steps)
        rows, cells = row_of_name[name_of_block[order]], np.column_stack([sums, counts, clipped])[order]
        firsts = order[starts]
        for start, end, k, step in zip(starts.tolist(), [*starts[1:].tolist(), len(order)],
                                       key_of_block[firsts].tolist(), steps[firsts].tolist()):
            self._live(window, keys[k], step).add_rows(rows[start:end], cells[start:end])

    def add_block(self, window: Any, key: str, step: int, block: GroupBlock) -> None:
        self._live(window, key, step).add(block)

    def take(self) -> Iterator[tuple[Any, str, int, GroupBlock]]:
        """``(window, key, step, block)`` for every accumulator, by (key, step); empties this."""
        cells = sorted(self._acc, key=lambda cell: cell[1:])
        accs, self._acc = self._acc, {}
        for cell in cells:
            yield (*cell, accs.pop(cell).take_block())

    def _row_map(self, key: str) -> _RowMap:
        rows = self._maps.get(key)
        if rows is None:
            rows = self._maps[key] = _RowMap()
        return rows

    def _live(self, window: Any, key: str, step: int) -> _GroupSums:
        """The accumulator of (window, key, step), made on the group's row map when first needed."""
        acc = self._acc.get((window, key, step))
        if acc is None:
            acc = self._acc[(window, key, step)] = _GroupSums(self._row_map(key), self._dim)
        return acc
