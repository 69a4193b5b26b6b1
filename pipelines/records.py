"""Row-shaped inputs of the model, query and learning jobs: CSV / Parquet / JSON-lines rows as mappings.

``continual_stats`` reads columnar ``EventBatch`` blocks (``ReadEvents``); the other families take
records with named fields (features and a label, a universe record, a task id), so their jobs read
every row as a ``{column: value}`` mapping with :class:`ReadRecords` and map it to the family's
element with a small per-job function. The labelled-record jobs (``model_release``, count-step
``online_learning``) read CSV / Parquet in columns instead (:class:`Labelled`): one
:class:`~beam_dp.steps.columns.LabelledColumns` per Arrow batch, built column by column
(:func:`labelled_columns`), each row standing for the element the per-row function would make; so
does ``growing_db_queries`` with its elements (:class:`Elements`, one
:class:`~beam_dp.steps.columns.ElementColumns` per batch, :func:`element_columns`); records that no
columns describe (lifelong task rows, event-time records, queries) come per batch as one
:class:`~beam_dp.beam.shell.blocks.RecordColumns` of the job's per-row elements (:class:`Records`). Rows
that cannot be read (a wrong column count, a line that is not a JSON object) go to the dead letters
with reason ``malformed`` (a CSV line over ``beam_dp.io.tables.MAX_LINE_BYTES``: ``line_too_long``);
a value of the wrong type stays as it is, and the family's own parse stage dead-letters the element
(never a crash). CSV is read as common writers write it (quoting, CRLF, a byte-order mark); a file's
blocks carry where each row was read, so a dead letter's ``source`` is ``<file>#record=<n>``
(:func:`beam_dp.steps.events.record_source`) for every row read from a file and the reader's own letters.

Streaming: the same flags as ``continual_stats`` (``--source pubsub|kafka``); one JSON object per
message, with the same field names as the file columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from beam_dp.beam import DeadLetter, Reason
from beam_dp.beam.shell.blocks import (  # imported from here: registered with their coder
    ElementColumns,
    LabelledColumns,
    RecordColumns,
)
from beam_dp.beam.shell.parse import DEAD_LETTER
from beam_dp.io.sources import StructuralInputError
from beam_dp.io.tables import read_csv_rows, read_parquet_batches
from beam_dp.steps.events import record_source
from pipelines.common import ReadMessages, input_header, match_files
from pipelines.rows import features_of, indexed_columns, number
from pipelines.runner import UsageError

__all__ = ["Elements", "Labelled", "ReadRecordFile", "ReadRecords", "Records", "column_names", "element_columns",
           "features_of", "indexed_columns", "labelled_columns", "number", "read_rows"]


def column_names(pattern: str, flag: str = "--input") -> list[str]:
    """Column names of the files matching ``pattern``, checked alike (``pipelines.common.input_header``)."""
    return input_header(pattern, flag)[1]


def _is_jsonl(path: str) -> bool:
    return path.endswith((".jsonl", ".json", ".ndjson"))


@dataclass(frozen=True)
class Labelled:
    """How a job reads labelled records in columns: ``dim`` features (columns ``x_0 ..``), labels as
    numbers (``number``) or, with ``label``, as class labels ``label(cell)``; ``record(row)`` is the
    job's per-row element ``(stream_id, features, label)``, used for rows the columns cannot hold and
    for messages (streaming)."""

    dim: int
    record: Callable[[dict], tuple]
    label: Callable[[Any], Any] | None = None

    block_type: ClassVar[type] = LabelledColumns

    def columns(self, batch: pa.RecordBatch, source: str | None = None, records: np.ndarray | None = None
                ) -> LabelledColumns:
        """One Arrow batch as a block (:func:`labelled_columns`), its rows records ``records`` of ``source``."""
        return labelled_columns(batch, self, source, records)

    def rows(self, rows: list[dict], source: str | None = None, records: np.ndarray | None = None
             ) -> LabelledColumns:
        """Rows read one by one (a JSON-lines file; ``records``: their record numbers in ``source``) as a
        block of odd rows."""
        n = len(rows)
        return LabelledColumns(np.full(n, None, dtype=object), np.zeros((n, self.dim)), np.zeros(n), None,
                               dict(enumerate(map(self.record, rows))), source, records)


@dataclass(frozen=True)
class Elements:
    """How a job reads growing-database elements in columns (``stream_id``, ``timestamp``, one column
    per universe field): ``fields`` in universe order, each ``(name, value)``, ``value(cell)`` the
    element's value of a cell, applied once per distinct cell (a category, an integer code), or None
    for a number (``number``, the cells read as float64); ``record(row)`` is the job's per-row element,
    used for rows the columns cannot hold and for messages (streaming)."""

    fields: tuple[tuple[str, Callable[[Any], Any] | None], ...]
    record: Callable[[dict], dict]

    block_type: ClassVar[type] = ElementColumns

    def columns(self, batch: pa.RecordBatch, source: str | None = None, records: np.ndarray | None = None
                ) -> ElementColumns:
        """One Arrow batch as a block (:func:`element_columns`), its rows records ``records`` of ``source``."""
        return element_columns(batch, self, source, records)

    def rows(self, rows: list[dict], source: str | None = None, records: np.ndarray | None = None
             ) -> ElementColumns:
        """Rows read one by one (a JSON-lines file; ``records``: their record numbers in ``source``) as a
        block of odd rows."""
        n = len(rows)
        return ElementColumns(np.full(n, None, dtype=object), np.zeros(n), tuple(name for name, _ in self.fields),
                              tuple(np.zeros(n) for _ in self.fields), tuple(None for _ in self.fields),
                              dict(enumerate(map(self.record, rows))), source, records)


@dataclass(frozen=True)
class Records:
    """How a job reads records that no columns describe: ``record(row)`` is the job's per-row element;
    a file's batch is one :class:`~beam_dp.beam.shell.blocks.RecordColumns` of them with their record
    numbers (so a family's dead letter names ``file#record=n``), a message is ``record`` of it."""

    record: Callable[[dict], Any]

    block_type: ClassVar[type] = RecordColumns

    def columns(self, batch: pa.RecordBatch, source: str | None = None, records: np.ndarray | None = None
                ) -> RecordColumns:
        """One Arrow batch as a block of its rows' elements, records ``records`` of ``source``."""
        return self.rows(batch.to_pylist(), source, records)

    def rows(self, rows: list[dict], source: str | None = None, records: np.ndarray | None = None
             ) -> RecordColumns:
        """Rows read one by one (``records``: their record numbers in ``source``) as a block of their elements."""
        return RecordColumns(tuple(map(self.record, rows)), source, records)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """The column ``name`` as its rows read it (a dictionary-encoded Parquet column decoded; nulls if absent)."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return pa.nulls(batch.num_rows)
    column = batch.column(index)
    return column.dictionary_decode() if pa.types.is_dictionary(column.type) else column


def _numbers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(values, odd)``: the cells as ``number`` makes them, float64 (0 where ``odd``: a cell that is
    missing or that ``number`` leaves as it is). A column of text (a non-numeric cell in the file's
    first block makes the whole column text) is converted cell by cell, as the per-row path does."""
    if pa.types.is_integer(column.type) or pa.types.is_float32(column.type) or pa.types.is_float64(column.type):
        odd = ~column.is_valid().to_numpy(zero_copy_only=False)
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)
        values[odd] = 0.0
        return values, odd
    cells = [number(v) for v in column.to_pylist()]
    odd = np.array([type(v) is not float for v in cells], dtype=bool)
    return np.array([0.0 if type(v) is not float else v for v in cells], dtype=np.float64), odd


def _class_labels(column: pa.Array, label: Callable[[Any], Any]) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(codes, names, odd)``: ``label`` applied once per distinct cell (``names`` (k,) object, the
    last one ``label(None)`` for missing cells); ``odd`` when the column cannot be encoded (then every
    row is built on its own)."""
    try:
        encoded = pc.dictionary_encode(column)
    except pa.ArrowException:
        return np.zeros(len(column), dtype=np.int64), np.array([None], dtype=object), True
    values = encoded.dictionary.to_pylist() + [None]
    names = np.empty(len(values), dtype=object)
    for k, value in enumerate(values):  # one per distinct label
        names[k] = label(value)
    codes = pc.fill_null(encoded.indices, len(values) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, names, False


def _stream_ids(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """``(ids (n,) object, odd)``: the ``stream_id`` cells as read (str or None); every row odd when the
    column is not text."""
    ids = _column(batch, "stream_id")
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        return ids.to_numpy(zero_copy_only=False), np.zeros(len(ids), dtype=bool)
    return np.full(len(ids), None, dtype=object), np.ones(len(ids), dtype=bool)


def _odd_records(batch: pa.RecordBatch, odd: np.ndarray, record: Callable[[dict], Any]) -> dict[int, Any]:
    """``record`` of each odd row, by row."""
    rows = np.flatnonzero(odd)
    return dict(zip(rows.tolist(), map(record, batch.take(pa.array(rows)).to_pylist()))) if len(rows) else {}


def labelled_columns(batch: pa.RecordBatch, spec: Labelled, source: str | None = None,
                     records: np.ndarray | None = None) -> LabelledColumns:
    """One Arrow batch as a :class:`LabelledColumns` whose row ``i`` is ``spec.record(row i)``: stream
    ids, features and labels column by column; rows with a cell the arrays cannot hold (a missing or
    non-numeric value, a non-text stream id, a ``features`` list) keep ``spec.record`` of their row."""
    stream_ids, odd = _stream_ids(batch)
    features = np.empty((batch.num_rows, spec.dim), dtype=np.float64)
    for j in range(spec.dim):
        features[:, j], bad = _numbers(_column(batch, f"x_{j}"))
        odd |= bad
    odd |= _column(batch, "features").is_valid().to_numpy(zero_copy_only=False)
    names = None
    if spec.label is None:
        labels, bad = _numbers(_column(batch, "label"))
    else:
        labels, names, bad = _class_labels(_column(batch, "label"), spec.label)
    odd |= bad
    return LabelledColumns(stream_ids, features, labels, names, _odd_records(batch, odd, spec.record), source, records)


def _seconds(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(seconds, odd)``: a numeric timestamp column as read, float64 (or int64 for integers: the
    per-row path scales those exactly); a missing cell, or every cell of a column of another type
    (text, dates, unsigned 64-bit), is odd."""
    kind = column.type
    if pa.types.is_floating(kind) and not pa.types.is_float16(kind):
        dtype = np.float64
    elif pa.types.is_integer(kind) and not pa.types.is_uint64(kind):
        dtype = np.int64
    else:
        return np.zeros(len(column), dtype=np.float64), np.ones(len(column), dtype=bool)
    odd = ~column.is_valid().to_numpy(zero_copy_only=False)
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(dtype), odd


def element_columns(batch: pa.RecordBatch, spec: Elements, source: str | None = None,
                    records: np.ndarray | None = None) -> ElementColumns:
    """One Arrow batch as an :class:`ElementColumns` whose row ``i`` is ``spec.record(row i)``: stream
    ids, timestamps and each field column by column (numbers as ``number`` makes them, other values
    once per distinct cell); rows with a cell the arrays cannot hold (a missing timestamp, a
    non-numeric number, a non-text stream id, a ``record`` struct) keep ``spec.record`` of their row."""
    stream_ids, odd = _stream_ids(batch)
    timestamps, bad = _seconds(_column(batch, "timestamp"))
    odd |= bad
    values, labels = [], []
    for name, value in spec.fields:
        if value is None:
            cells, bad = _numbers(_column(batch, name))
            names = None
        else:
            cells, names, bad = _class_labels(_column(batch, name), value)
        odd |= bad
        values.append(cells)
        labels.append(names)
    nested = _column(batch, "record")
    if pa.types.is_struct(nested.type):  # {"record": {field: ..}}: the fields come from it
        odd |= nested.is_valid().to_numpy(zero_copy_only=False)
    return ElementColumns(stream_ids, timestamps, tuple(name for name, _ in spec.fields), tuple(values),
                          tuple(labels), _odd_records(batch, odd, spec.record), source, records)


def _json_rows(fh, path: str) -> tuple[list[dict], np.ndarray, list[DeadLetter]]:
    """``(objects, their record numbers, letters)`` of a JSON-lines file: record ``n`` is its ``n``-th
    non-blank line; a line that is not a JSON object -> a ``malformed`` dead letter with its source."""
    rows, records, letters = [], [], []
    lines = (line for line in fh.read().decode("utf-8-sig").splitlines() if line.strip())
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
            records.append(n)
        else:
            letters.append(DeadLetter(Reason.MALFORMED, "line is not a JSON object", None, line,
                                      record_source(path, n)))
    return rows, np.asarray(records, dtype=np.int64), letters


def _read_file(path: str) -> tuple[list[pa.RecordBatch], np.ndarray | None, list[DeadLetter]]:
    """``(batches, each row's record number or None, letters of unreadable records)`` of a CSV or
    Parquet file (CSV as common writers write it: ``beam_dp.io.tables.read_csv_rows``)."""
    with FileSystems.open(path) as fh:
        if path.endswith(".parquet"):
            batches = read_parquet_batches(fh)
            return batches, np.arange(1, 1 + sum(b.num_rows for b in batches), dtype=np.int64), []
        try:
            read = read_csv_rows(fh)
        except ValueError as exc:  # a header line over the line bound
            raise StructuralInputError(path, str(exc)) from None
    return read.batches, read.records, read.letters(path)


class ReadRecordFile(beam.DoFn):
    """One file -> its rows as mappings, or (``columns``) its batches as the spec's blocks (each row with
    its ``file#record=n``); unreadable records -> ``malformed`` or ``line_too_long`` dead letters."""

    def __init__(self, columns: Labelled | Elements | Records | None = None):
        self._columns = columns

    def process(self, path: str) -> Iterator:
        if _is_jsonl(path):
            with FileSystems.open(path) as fh:
                rows, records, letters = _json_rows(fh, path)
            yield from (beam.pvalue.TaggedOutput(DEAD_LETTER, letter) for letter in letters)
            if self._columns is None:
                yield from rows
            elif rows:
                yield self._columns.rows(rows, path, records)
            return
        batches, records, letters = _read_file(path)
        yield from (beam.pvalue.TaggedOutput(DEAD_LETTER, letter) for letter in letters)
        offset = 0
        for batch in batches:
            if self._columns is None:
                yield from batch.to_pylist()
            elif batch.num_rows:
                yield self._columns.columns(batch, path, None if records is None
                                            else records[offset:offset + batch.num_rows])
            offset += batch.num_rows


class ReadRecords(beam.PTransform):
    """Rows of CSV / Parquet / JSON-lines files matching ``pattern`` (``--source files``), or the JSON
    objects of Pub/Sub / Kafka messages (``messages``: a test source used in their place).
    Returns ``(records, dead_letter)``; records are ``{column: value}`` mappings or, with ``columns``
    (a :class:`Labelled`, :class:`Elements` or :class:`Records`), the family's elements: a file's batches
    as the spec's blocks (``LabelledColumns``, ``ElementColumns``, ``RecordColumns``), each message as
    ``columns.record``."""

    def __init__(self, opts, pattern: str | None = None, messages: beam.PTransform | None = None,
                 columns: Labelled | Elements | Records | None = None):
        super().__init__()
        self.opts = opts
        self.pattern = pattern
        self.messages = messages
        self.columns = columns

    def expand(self, pbegin):
        if self.messages is None and self.opts.source == "files":
            paths = (pbegin
                     | "Pattern" >> beam.Create([self.pattern])
                     | "Match" >> beam.FlatMap(lambda p: sorted(m.path for m in FileSystems.match([p])[0].metadata_list))
                     | "Spread" >> beam.Reshuffle())
            read = beam.ParDo(ReadRecordFile(self.columns))
            if self.columns is not None:
                read = read.with_output_types(self.columns.block_type)
            out = paths | "Read" >> read.with_outputs(DEAD_LETTER, main="rows")
            return out.rows, out[DEAD_LETTER]
        out = pbegin | "Messages" >> ReadMessages(self.opts, self.messages, as_event=False)
        if self.columns is None:
            return out.events, out[DEAD_LETTER]
        return out.events | "ToElements" >> beam.Map(self.columns.record), out[DEAD_LETTER]


def read_rows(pattern: str, flag: str) -> list[dict]:
    """Every row of the (small, public) files matching ``pattern``, read here on the launcher;
    an unreadable row is a usage error."""
    rows: list[dict] = []
    for path in match_files(pattern, flag):
        for item in ReadRecordFile().process(path):
            if isinstance(item, beam.pvalue.TaggedOutput):
                raise UsageError(f"{flag} {path}: unreadable row ({item.value.detail})")
            rows.append(item)
    return rows
