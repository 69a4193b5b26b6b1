"""The parse stage's sums per (key, step) of a batch replay, held dense: the lifted combiner
:class:`MergeClippedSums` (keyed by stream) and :class:`BundleGroupSums` (keyed by stream groups).

Beam lifts ``CombinePerKey(MergeClippedSums())`` before the shuffle and keeps one accumulator per
(key, step) live for a whole bundle (up to 100,000 keys), so the accumulator's size is the stage's
memory. Keyed by groups, the parse stage keeps the same accumulators itself (``BundleGroupSums``): a
batch's blocks are added with one sort and a slice per (group, step), where a lifted combiner took one
element per (batch, group, step) (31k at 10M events, ~100 µs of Python each), and the release stage
adds the bundles' blocks of a step as they come (``beam_dp.beam.shell.batch_release.StepSumsBuffer``, on these
accumulators). An accumulator is an ``(n, d + 2)`` array of sums, counts and clipped
counts of the rows it was given, found through a stream → row map shared by every step of the group on
this worker: memory grows with the cells, not with the events or the blocks that carried them (issue
26.1). A bundle's sums are bounded too: past :data:`BUNDLE_BUDGET_BYTES` they leave as blocks and the
bundle starts again, so a stage's memory does not grow with the input's cells; a (group, step) may then
leave in several blocks (events out of time order), which the release stage adds like any two bundles'.
Nothing private leaves it but the sums themselves (the same clipped sums the blocks held); the row maps
are a worker-local index of stream names, never state, and the output does not depend on them (rows
are sorted by name on the way out).
Beam compacts every live accumulator when the bundle ends but drops them only after the last, so each
frees its arrays as it is compacted (the bundle's accumulators and their output do not coexist).
While a window's streams × steps fit the budget, ``BundleGroupSums`` holds its sums in one dense
(step, stream) array instead (:mod:`beam_dp.beam.shell.dense_steps`): a batch's rows are added to it directly,
with no per-batch sums per (stream, step) and no per-(group, step) slices.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable, Iterator

import apache_beam as beam
import numpy as np

from beam_dp.beam.shell.dense_steps import DenseSteps, StreamTable
from beam_dp.io.coders import BlockCoder, register_block_coders
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock
from beam_dp.steps.batch import key_step_runs, rows_by_group

__all__ = ["BUNDLE_BUDGET_BYTES", "BundleGroupSums", "MergeClippedSums"]

BUNDLE_BUDGET_BYTES = 256 << 20  # a bundle's live sums in the parse stage; past it they leave as blocks

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


def _extended(rows: np.ndarray, n: int, fill: Any = 0) -> np.ndarray:
    """``rows`` followed by ``fill`` rows up to ``n`` rows (a new array)."""
    out = np.full((n, *rows.shape[1:]), fill, rows.dtype)
    out[:len(rows)] = rows
    return out


class _GroupSums:
    """The live accumulator of one (group, step): each row's sums, count and clipped count in one row of
    ``cells`` (integers, exact in float64 below 2^53), added in one operation. It starts sparse, holding
    only the rows it was given, in order of first sight (``_local``: row-map row → its row, −1 for none;
    ``_held``: the reverse), so a step that sees few of a group's streams costs few rows (what a bundle's
    budget counts); once it holds half the group's streams it turns dense, indexed by the row map itself
    (no lookup per add), ``_seen`` marking the rows a block named without counts."""

    __slots__ = ("rows", "cells", "size", "nbytes", "_local", "_held", "_seen")

    def __init__(self, rows: _RowMap, dim: int, expected: int = 0) -> None:
        """``expected``: about how many rows it will hold (dense from the start at half the group's streams)."""
        known = len(rows.names)
        self.rows = rows
        self.size = 0  # sparse: rows held, cells[:size]
        self._local = self._held = self._seen = None
        if known and 2 * expected >= known:
            self.cells, self._seen = np.zeros((known, dim + 2)), np.zeros(known, bool)
        else:
            cap = max(16, expected)
            self.cells, self._held = np.zeros((cap, dim + 2)), np.zeros(cap, np.int64)
            self._local = np.full(known, -1, np.int32)
        self.nbytes = 0  # the bytes of its arrays
        self._count_bytes()

    def add(self, block: GroupBlock) -> int:
        """Add a block's rows; the bytes the accumulator grew by."""
        idx = self.rows.rows_of(block.streams)
        grown = self.add_rows(idx, np.column_stack([block.sums, block.counts, block.clipped]))
        if self._seen is not None:
            self._seen[idx] = True
        return grown

    def add_rows(self, idx: np.ndarray, cells: np.ndarray) -> int:
        """Add ``cells`` (n, d + 2: sums, counts, clipped counts) to row-map rows ``idx`` (distinct); the
        bytes the accumulator grew by."""
        if self.cells is None:
            raise RuntimeError("MergeClippedSums: an accumulator was used after it was compacted")
        known = len(self.rows.names)
        if self._local is None:  # dense: grows by a quarter as the group's streams grow
            grown = self._grow_dense(max(known, len(self.cells) * 5 // 4)) if known > len(self.cells) else 0
            self.cells[idx] += cells
            return grown
        grown = 0
        if len(self._local) < known:
            self._local = _extended(self._local, known, fill=-1)
            grown = self._count_bytes()
        local = self._local[idx]
        new = local < 0
        if new.any():
            fresh = idx[new]
            size = self.size + len(fresh)
            if size > len(self._held):
                if 2 * size >= known:  # half the group's streams: dense from now on
                    grown += self._to_dense(known)
                    self.cells[idx] += cells
                    return grown
                grown += self._grow_sparse(max(size, len(self._held) * 3 // 2))
            self._local[fresh] = np.arange(self.size, size, dtype=np.int32)
            self._held[self.size:size] = fresh
            self.size = size
            local = self._local[idx]
        self.cells[local] += cells
        return grown

    def _count_bytes(self) -> int:
        before = self.nbytes
        self.nbytes = sum(0 if a is None else a.nbytes for a in (self.cells, self._local, self._held, self._seen))
        return self.nbytes - before

    def _grow_sparse(self, cap: int) -> int:
        self.cells, self._held = _extended(self.cells[:self.size], cap), _extended(self._held[:self.size], cap)
        return self._count_bytes()

    def _to_dense(self, known: int) -> int:
        held = self._held[:self.size]
        cells = np.zeros((known, self.cells.shape[1]))
        cells[held] = self.cells[:self.size]
        self._seen = np.zeros(known, bool)
        self._seen[held] = True
        self.cells, self._local, self._held, self.size = cells, None, None, 0
        return self._count_bytes()

    def _grow_dense(self, cap: int) -> int:
        self.cells, self._seen = _extended(self.cells, cap), _extended(self._seen, cap)
        return self._count_bytes()

    def take_block(self) -> GroupBlock:
        """Its rows sorted by stream name (a ``GroupBlock``); the accumulator's arrays are freed (Beam
        outputs every live accumulator of a bundle at its end and drops them only after the last: freeing
        each as it leaves keeps the bundle's accumulators and their output from coexisting). A taken
        accumulator is never used again (Beam's contract for ``compact``, ``extract_output`` and the
        inputs of ``merge_accumulators``); using one raises."""
        if self.cells is None:
            raise RuntimeError("MergeClippedSums: an accumulator was used after it was compacted")
        d = self.cells.shape[1] - 2
        if self._local is None:
            rows = np.flatnonzero(self._seen | (self.cells[:, d] > 0))
            cells = self.cells[rows]
        else:
            rows, cells = self._held[:self.size], self.cells[:self.size]
        order = np.argsort(self.rows.rank()[rows])
        rows, cells, names = rows[order], cells[order], self.rows.names
        block = GroupBlock(tuple(map(names.__getitem__, rows.tolist())), np.ascontiguousarray(cells[:, :d]),
                           cells[:, d].astype(np.int64), cells[:, d + 1].astype(np.int64))
        self.cells = self._local = self._held = self._seen = None
        self.nbytes = 0
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
        if acc is None:  # a lone block stays as it is (goes live only when a second one comes)
            return block
        if isinstance(block, ClippedSum):
            return acc.merge(block)
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
    :meth:`take` empties it (at the end of the bundle, or once :attr:`full`: past ``budget_bytes``, by
    default :data:`BUNDLE_BUDGET_BYTES`), each accumulator freed as its block leaves."""

    def __init__(self, dim: int, budget_bytes: int | None = None) -> None:
        self._dim = dim
        self._budget = BUNDLE_BUDGET_BYTES if budget_bytes is None else budget_bytes
        self._bytes = 0  # the live accumulators' and dense arrays' bytes
        self._expected: int | None = None  # rows an accumulator held, on average, when last taken
        self._maps: dict[str, _RowMap] = {}  # group key -> its row map (worker-local index, never state)
        self._acc: dict[tuple[Any, str, int], _GroupSums] = {}
        self._table = StreamTable()  # the dense arrays' rows (worker-local index, never state)
        self._dense: dict[Any, DenseSteps] = {}  # window -> its dense sums
        self._outgrown = False  # a dense array could not grow within the budget: take, then start again

    def __bool__(self) -> bool:
        return bool(self._acc) or bool(self._dense)

    @property
    def full(self) -> bool:
        """Whether its accumulators hold more than its budget (or a dense array outgrew it): time to
        :meth:`take` them."""
        return self._bytes > self._budget or self._outgrown

    def rows_of(self, names: list[str], key_of: Callable[[str], str]) -> np.ndarray:
        """The dense rows of streams ``names`` (``key_of``: a new stream's group key)."""
        return self._table.rows_of(names, key_of)

    def dense_fits(self, window: Any, first: int, last: int) -> bool:
        """Whether ``window``'s dense array can hold every known stream at steps ``first ..= last`` within
        the budget. If not and it holds sums, the bundle is :attr:`full` (time order: take it and start a
        dense array again at later steps); otherwise the sums go to the sparse accumulators."""
        dense = self._dense.get(window) or DenseSteps(self._dim)
        held = dense.nbytes
        fits = self._bytes - held + dense.bytes_for(len(self._table.names), first, last) <= self._budget
        if not fits and held:
            self._outgrown = True
        return fits

    def add_rows(self, window: Any, rows: np.ndarray, steps: np.ndarray, cells: np.ndarray) -> None:
        """Add contributions to ``window``'s dense array (after :meth:`dense_fits` said they fit): stream
        row ``rows[j]`` (from :meth:`rows_of`) at ``steps[j]``, ``cells[j]`` its clipped sum (d), count and
        clipped count."""
        dense = self._dense.get(window)
        if dense is None:
            dense = self._dense[window] = DenseSteps(self._dim)
        n_rows = len(self._table.names)
        need = dense.bytes_for(n_rows, int(steps.min()), int(steps.max()))
        self._bytes += dense.add(rows, steps, cells, n_rows, max(self._budget - self._bytes + dense.nbytes - need, 0))

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
            grown = self._live(window, keys[k], step).add_rows(rows[start:end], cells[start:end])
            self._bytes += grown  # (after _live, which counts a new accumulator)

    def add_block(self, window: Any, key: str, step: int, block: GroupBlock) -> None:
        """Add one block of group ``key`` at ``step`` (to the window's dense array when it has one)."""
        if window in self._dense:
            rows = self.rows_of(list(block.streams), lambda _: key)
            if self.dense_fits(window, step, step):
                cells = np.column_stack([block.sums, block.counts, block.clipped]).astype(np.float64)
                self.add_rows(window, rows, np.full(len(rows), step, np.int64), cells)
                return
        grown = self._live(window, key, step).add(block)
        self._bytes += grown

    def take(self) -> Iterator[tuple[Any, str, int, GroupBlock]]:
        """``(window, key, step, block)`` for every accumulator and dense array, by (key, step); empties
        this. (A (group, step) that has both a dense array's rows and a sparse accumulator, after a dense
        array outgrew the budget, leaves in two blocks, which the release stage adds.)"""
        cells = sorted(self._acc, key=lambda cell: cell[1:])
        accs, self._acc, self._bytes = self._acc, {}, 0
        dense, self._dense, self._outgrown = self._dense, {}, False

        def sparse() -> Iterator[tuple[tuple[Any, str, int], GroupBlock]]:
            rows = 0
            for cell in cells:
                block = accs.pop(cell).take_block()
                rows += len(block.streams)
                yield cell, block
            if cells:
                self._expected = rows // len(cells)  # the next accumulators start at about this size

        def dense_blocks(window: Any, sums: DenseSteps) -> Iterator[tuple[tuple[Any, str, int], GroupBlock]]:
            for key, step, block in sums.take(self._table):
                yield (window, key, step), block

        parts = [sparse(), *(dense_blocks(window, sums) for window, sums in dense.items())]
        for cell, block in heapq.merge(*parts, key=lambda part: part[0][1:]):
            yield (*cell, block)

    def _row_map(self, key: str) -> _RowMap:
        rows = self._maps.get(key)
        if rows is None:
            rows = self._maps[key] = _RowMap()
        return rows

    def _live(self, window: Any, key: str, step: int) -> _GroupSums:
        """The accumulator of (window, key, step), made on the group's row map when first needed."""
        acc = self._acc.get((window, key, step))
        if acc is None:
            rows = self._row_map(key)
            expected = self._expected
            if expected is None:  # none taken yet: dense (every stream of the group) while that fits the budget
                dense = len(rows.names) * ((self._dim + 2) * 8 + 1)  # cells and the seen flags
                expected = len(rows.names) if self._bytes + dense <= self._budget else 0
            acc = self._acc[(window, key, step)] = _GroupSums(rows, self._dim, expected)
            self._bytes += acc.nbytes
        return acc
