"""Per-record families fed in blocks: a parse stage's valid records of one bundle, gathered per stream.

A family whose steps need the records themselves (ERM's labelled examples, an online learner's
records) cannot pre-aggregate like the sums, but it need not send the keyed stage one element per
record either: :class:`BundleBlocks` keeps, for one bundle, each (stream, window)'s validated rows in
arrival order and hands them on as one block — at most ``max_rows`` rows, the rest at the end of
the bundle — so the keyed stage decodes a key's state once per block and closes every count step
the block completes in one call (:meth:`beam_dp.steps.driver.StepDriver.add`).

Nothing here is state: the lists live for one bundle (``start_bundle`` to ``finish_bundle``) and a
retried bundle rebuilds them from its own elements. The order of rows inside a block is their arrival
order in the bundle, as the per-element path fed them; which records share a block depends only on
the bundle, never on their values. A block's ``original`` is :class:`BlockOriginals`, the tuple of its
elements: a dead letter the keyed stage writes for a whole block (its stream ended, its step was
already released) leaves as one dead letter per element (:meth:`BlockOriginals.letters`), as before.

Columnar input (:class:`~beam_dp.steps.columns.LabelledColumns`, a file's batch of labelled records):
:func:`column_rows` validates a block in vectorised passes and :meth:`BundleBlocks.add_rows` adds each
stream's valid rows as one chunk, in the same arrival order; the chunk's originals stay columns (a
``LabelledColumns`` item of :class:`BlockOriginals`, or an ``ElementColumns`` one for growing
databases), turned into per-row elements only when a letter is written.

Records read one by one (a file's rows that no columns describe: lifelong task rows, event-time
records, growing-database queries) come as :class:`RecordColumns`, the rows' elements with their file
and record numbers (a column), so a family-stage dead letter names ``file#record=n`` as the parse
stages' do: :func:`by_record` runs a parse stage's check of one element on each row, with the row's
source and its one-row original; a block's consecutive one-row originals of one file leave as one item.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.io.coders import register_block_coders
from beam_dp.steps.batch import stream_reasons
from beam_dp.steps.columns import ElementColumns, LabelledColumns, RowColumns
from beam_dp.steps.events import DETAIL, DeadLetter
from beam_dp.steps.policies import split_rows

__all__ = ["BlockOriginals", "BundleBlocks", "ColumnRows", "ColumnarParse", "ElementColumns", "LabelledColumns",
           "OneOriginal", "RecordColumns", "alone", "by_record", "column_rows", "sourced", "stack_rows", "stream_parts"]


@dataclass(frozen=True, eq=False)
class RecordColumns(RowColumns):
    """``n`` records read one by one, as the family's elements (``items``), with where they were read:
    ``source`` (the file) and ``rows`` ((n,) int64 record numbers in it); no value is in columns."""

    items: tuple
    source: str | None = None
    rows: np.ndarray | None = None

    odd: ClassVar[Mapping[int, Any]] = MappingProxyType({})  # every row is its element: none is odd

    def __len__(self) -> int:
        return len(self.items)

    def record(self, i: int) -> Any:
        """Row ``i``'s element."""
        return self.items[i]

    def take(self, rows: np.ndarray) -> RecordColumns:
        """The block of ``rows`` (int indices, in their order)."""
        rows = np.asarray(rows, dtype=np.int64)
        return RecordColumns(tuple(self.items[i] for i in rows.tolist()), self.source, self._rows_of(rows))

    def one(self, i: int) -> RecordColumns:
        """Row ``i`` as a one-row block (its element and record number)."""
        return RecordColumns((self.items[i],), self.source, None if self.rows is None else self.rows[i:i + 1])

    def __reduce__(self) -> tuple:  # record numbers as a list: a one-row block stays small in a shuffle
        return _record_columns, (self.items, self.source, None if self.rows is None else self.rows.tolist())


def _record_columns(items: tuple, source: str | None, rows: list | None) -> RecordColumns:
    return RecordColumns(items, source, None if rows is None else np.asarray(rows, dtype=np.int64))


def by_record(block: RecordColumns, one: Callable[[Any, RecordColumns], Iterable]) -> Iterator:
    """A parse stage's outputs for ``block``: ``one(element, original)`` of each row, ``original`` its
    one-row block (sent on, so a later letter knows the source too), its dead letters with the row's source."""
    for i in range(len(block)):
        for out in one(block.items[i], block.one(i)):
            yield sourced(out, block.source_of(i)) if isinstance(out, TaggedOutput) else out


def alone(original: Any) -> Any:
    """The ``original`` of one element sent on by itself (not in a block): a one-row block as its
    :class:`OneOriginal`, so a later letter is written with its source; any other element as it is."""
    return OneOriginal((original.record(0), original.source_of(0))) if isinstance(original, RowColumns) else original


def _joined(items: list) -> list:
    """Originals with each run of :class:`RecordColumns` of one file joined into one item."""
    out: list = []
    for key, run in groupby(items, lambda item: (item.source, item.rows is None)
                            if isinstance(item, RecordColumns) else None):
        parts = list(run)
        if key is None or len(parts) == 1:
            out += parts
        else:
            out.append(RecordColumns(tuple(x for part in parts for x in part.items), key[0],
                                     None if key[1] else np.concatenate([part.rows for part in parts])))
    return out


register_block_coders(LabelledColumns, ElementColumns, RecordColumns)  # Beam's sizing must not pickle them


class BlockOriginals(tuple):
    """The elements of one block, in its order (the ``original`` the keyed stage gets with the block);
    a :class:`~beam_dp.steps.columns.RowColumns` item (``LabelledColumns``, ``ElementColumns``) stands
    for its rows' records."""

    def __reduce__(self) -> tuple:  # as a tuple: originals of one element stay cheap in a shuffle
        return type(self), (tuple(self),)

    def letters(self, letter: DeadLetter) -> list[DeadLetter]:
        """A dead letter written for the whole block, as one letter per element (a columnar row's with its source)."""
        out = []
        for item in self:
            if isinstance(item, RowColumns):
                out += [letter._replace(element=item.record(i), source=item.source_of(i)) for i in range(len(item))]
            else:
                out.append(letter._replace(element=item))
        return out

    def sources(self) -> Iterator[str | None]:
        """Each element's source (``file#record=n`` of a columnar row, else None), in :meth:`elements` order."""
        for item in self:
            if isinstance(item, RowColumns):
                yield from (item.source_of(i) for i in range(len(item)))
            else:
                yield None

    def elements(self) -> Iterator[Any]:
        """The elements, a columnar item's records built now."""
        for item in self:
            if isinstance(item, RowColumns):
                yield from item.records()
            else:
                yield item

    def parts(self, groups: list[np.ndarray]) -> list[BlockOriginals]:
        """The originals of each group of the block's rows (increasing row positions, a columnar item
        counting as its rows), a columnar item's rows in a group taken as one item."""
        sizes = np.array([len(item) if isinstance(item, RowColumns) else 1 for item in self], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        out = []
        for rows in groups:
            which = np.searchsorted(starts, rows, side="right") - 1
            cuts = np.flatnonzero(np.diff(which)) + 1
            items = []
            for part, k in zip(np.split(rows, cuts), which[np.r_[0, cuts]].tolist() if len(rows) else []):
                item = self[k]
                items.append(item.take(part - starts[k]) if isinstance(item, RowColumns) else item)
            out.append(BlockOriginals(items))
        return out


class OneOriginal(BlockOriginals):
    """The original of one element sent on by itself, ``(element, source)``: a letter written for it is
    one letter, with its source (a pair in a shuffle, not a block)."""

    def letters(self, letter: DeadLetter) -> list[DeadLetter]:
        return [letter._replace(element=self[0], source=self[1])]

    def sources(self) -> Iterator[str | None]:
        yield self[1]

    def elements(self) -> Iterator[Any]:
        yield self[0]


class _Open:
    """One open block: its row items (rows, or chunks of rows), their originals, the row count, the
    latest timestamp and whether one-row originals of records read one by one are to be joined."""

    __slots__ = ("rows", "originals", "count", "latest", "joins")

    def __init__(self) -> None:
        self.rows: list = []
        self.originals: list = []
        self.count = 0
        self.latest = MIN_TIMESTAMP
        self.joins = False

    def stamp(self, timestamp: Any) -> None:
        if timestamp is not None and timestamp > self.latest:
            self.latest = timestamp

    def block_originals(self) -> BlockOriginals:
        return BlockOriginals(_joined(self.originals) if self.joins else self.originals)


class BundleBlocks:
    """Rows of one bundle by (key, window), ``key`` a stream or a (stream, step); ``make(key, rows,
    originals)`` turns a list of rows and their :class:`BlockOriginals` into the keyed stage's outputs
    (the block's element, and any ``TaggedOutput`` dead letters of rows a block-wide check refused).
    ``add`` (one row) and ``add_rows`` (a chunk) return the outputs of the blocks they fill
    (``max_rows`` rows), else nothing."""

    def __init__(self, make: Callable[[Any, list, BlockOriginals], list], max_rows: int):
        self._make, self._max = make, max_rows
        self._open: dict[tuple[Any, Any], _Open] = {}

    def add(self, key: Any, row: Any, element: Any, timestamp: Any, window: Any) -> list:
        block = self._open.setdefault((key, window), _Open())
        block.rows.append(row)
        block.originals.append(element)
        block.joins = block.joins or type(element) is RecordColumns
        block.count += 1
        block.stamp(timestamp)
        return self._full(key, window, block)

    def add_rows(self, key: Any, rows: Any, originals: RowColumns, timestamp: Any, window: Any) -> list:
        """A chunk of rows (a rows dataclass, :func:`~beam_dp.steps.policies.split_rows`) and its
        originals, cut where a block fills."""
        out: list = []
        while len(rows):
            block = self._open.setdefault((key, window), _Open())
            need = self._max - block.count
            if len(rows) > need:
                (rows, rest), cut = split_rows(rows, need), np.arange(len(rows))
                originals, left = originals.take(cut[:need]), originals.take(cut[need:])
            else:
                rest = left = None
            block.rows.append(rows)
            block.originals.append(originals)
            block.count += len(rows)
            block.stamp(timestamp)
            out += self._full(key, window, block)
            if rest is None:
                break
            rows, originals = rest, left
        return out

    def _full(self, key: Any, window: Any, block: _Open) -> list:
        if block.count < self._max:
            return []
        del self._open[(key, window)]
        return self._make(key, block.rows, block.block_originals())

    def flush(self, where: Callable[[Any], bool] | None = None) -> Iterator[Any]:
        """Every open block's outputs (or those whose key satisfies ``where``: a marker that must follow
        its stream's rows), as windowed values stamped with their latest element's timestamp."""
        for (key, window) in [k for k in self._open if where is None or where(k[0])]:
            block = self._open.pop((key, window))
            for out in self._make(key, block.rows, block.block_originals()):
                if isinstance(out, TaggedOutput):
                    yield TaggedOutput(out.tag, WindowedValue(out.value, block.latest, (window,)))
                else:
                    yield WindowedValue(out, block.latest, (window,))


def stack_rows(rows: list, block_type: type, pair: Callable[[Any], tuple]) -> Any:
    """The rows of one block as one ``block_type(features, labels)``, in order: single rows
    (``pair(row) -> (features, label)``) and chunks that already are ``block_type``."""
    parts, singles = [], []
    for row in rows + [None]:
        if row is not None and not isinstance(row, block_type):
            singles.append(pair(row))
            continue
        if singles:
            parts.append(block_type(np.stack([x for x, _ in singles]), np.array([y for _, y in singles])))
            singles = []
        if row is not None:
            parts.append(row)
    if len(parts) == 1:
        return parts[0]
    return block_type(np.concatenate([p.features for p in parts]), np.concatenate([p.labels for p in parts]))


class ColumnRows:
    """What :func:`column_rows` found in a block: the dead letters (in row order) and the valid rows in
    arrival order, by stream (``chunks``: ``(stream, row indices, features, labels)`` in order of
    first appearance)."""

    __slots__ = ("letters", "chunks", "valid")

    def __init__(self, letters: list[DeadLetter], chunks: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]):
        self.letters, self.chunks = letters, chunks
        self.valid = sum(len(rows) for _, rows, _, _ in chunks)


def column_rows(block: LabelledColumns, streams: frozenset[str] | None,
                check: Callable[[Any], tuple[str, tuple] | DeadLetter],
                vector: Callable[[LabelledColumns, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
                ) -> ColumnRows:
    """Validate a columnar block as its rows' records one by one would be: the stream ids for every
    row at once (``bad_stream_id``, ``undeclared_stream``); then ``vector(block, rows)`` -> ``(ok,
    features, labels)`` accepts rows in vectorised passes (``ok`` over ``rows``, the values of the
    accepted ones: exactly what ``check`` gives them); every other row (odd, or refused by ``vector``)
    is checked as one record by ``check(record) -> (stream, (features, label)) | DeadLetter``, the
    per-record path's own check, so its letter (reason, detail, element) is the per-record one."""
    n = len(block)
    plain = np.ones(n, dtype=bool)
    if block.odd:
        plain[np.fromiter(block.odd, dtype=np.int64, count=len(block.odd))] = False
    reasons, good_id, _ = stream_reasons(block.stream_ids, streams)
    head_ok = plain & (reasons == "")
    candidates = np.flatnonzero(head_ok)
    ok, features, labels = vector(block, candidates)
    accepted = candidates[ok]
    letters: list[tuple[int, DeadLetter]] = []
    for i in np.flatnonzero(plain & ~head_ok).tolist():  # a bad stream id: the letter split_event writes
        letters.append((i, DeadLetter(reasons[i], DETAIL[reasons[i]], block.stream_ids[i] if good_id[i] else None,
                                      block.record(i))))
    single = ~plain | head_ok
    single[accepted] = False
    extra: list[tuple[int, str, tuple]] = []
    for i in np.flatnonzero(single).tolist():
        checked = check(block.record(i))
        if isinstance(checked, DeadLetter):
            letters.append((i, checked))
        else:
            extra.append((i, *checked))
    letters.sort(key=lambda item: item[0])
    letters = [(i, sourced(letter, block.source_of(i))) for i, letter in letters]
    rows, ids = accepted, block.stream_ids[accepted]
    if extra:  # rows only the per-record check accepted, merged in arrival order
        rows = np.concatenate([accepted, [i for i, _, _ in extra]])
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        ids = np.concatenate([ids, np.array([s for _, s, _ in extra], dtype=object)])[order]
        features = np.concatenate([features, np.stack([x for _, _, (x, _) in extra])])[order]
        labels = np.concatenate([labels, np.array([y for _, _, (_, y) in extra])])[order]
    chunks = [(name, rows[part], features[part], labels[part]) for name, part in stream_parts(ids)]
    return ColumnRows([letter for _, letter in letters], chunks)


def sourced(out: Any, source: str | None) -> Any:
    """A dead letter (or a ``TaggedOutput`` of one) with ``source`` where it has none; anything else unchanged."""
    if isinstance(out, TaggedOutput) and isinstance(out.value, DeadLetter):
        return TaggedOutput(out.tag, sourced(out.value, source))
    if isinstance(out, DeadLetter) and out.source is None and source is not None:
        return out._replace(source=source)
    return out


def stream_parts(ids: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Rows by stream: ``(stream, positions in ids)`` per distinct id (valid stream ids, ``str``), in
    order of first appearance, each stream's positions in arrival order."""
    if not len(ids):
        return []
    encoded = pc.dictionary_encode(pa.array(ids, type=pa.string()))
    names = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    parts = np.split(np.argsort(codes, kind="stable"), np.cumsum(np.bincount(codes, minlength=len(names)))[:-1])
    return list(zip(names, parts))


class ColumnarParse:
    """The part of a parse DoFn (ERM's, the learners') that takes a :class:`LabelledColumns` block:
    :func:`column_rows` with the DoFn's ``_check`` and ``_vector``, its dead letters, then each stream's
    valid rows added to ``_blocks`` as one ``rows_type(features, labels)`` chunk."""

    rows_type: type

    def _chunk_seen(self, block: LabelledColumns, rows: np.ndarray, labels: np.ndarray) -> None:
        """Called for each stream's chunk of valid rows before it is added (operator metrics)."""

    def _process_columns(self, block: LabelledColumns, timestamp: Any, window: Any) -> Iterator:
        found = column_rows(block, self._streams, self._check, self._vector)
        for letter in found.letters:
            yield self._dead_letter(*letter)
        self._elements.inc(found.valid)
        for stream, rows, x, y in found.chunks:
            self._chunk_seen(block, rows, y)
            yield from self._blocks.add_rows(stream, self.rows_type(x, y), block.take(rows), timestamp, window)
