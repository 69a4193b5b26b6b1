"""Event-file sources that emit columnar ``EventBatch`` blocks (the fast path into the transforms).

Files are CSV or Parquet with columns ``stream_id``, ``timestamp`` (seconds since the epoch or an
ISO-8601 string) and either ``value`` (dim 1) or ``value_0 .. value_{d-1}``; CSV as common writers
write it (quoting, CRLF, a byte-order mark: :func:`beam_dp.io.tables.read_csv_rows`). Rows that cannot
be parsed (wrong column count, text in a number column) go to the ``dead_letter`` output with the
reason ``malformed``, a line over ``beam_dp.io.tables.MAX_LINE_BYTES`` with ``line_too_long``, each
with its ``source`` ``<file>#record=<n>``; they never stop the job.
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from beam_dp.io.coders import register_block_coders
from beam_dp.io.tables import iter_parquet_batches, read_csv_rows
from beam_dp.steps.events import DEAD_LETTER, DETAIL, DeadLetter, EventBatch, Reason, record_source, to_micros

__all__ = ["STRUCTURAL", "ReadEventFiles", "StructuralInputError", "nested_value_column", "value_columns"]

#: Marks an error that rejects a whole file for one structural cause (a missing column, a column of
#: the wrong type); a job's runner turns it into a one-line usage error instead of a traceback.
STRUCTURAL = "structural input error"


class StructuralInputError(ValueError):
    """A whole input file is unusable for one structural cause; the message starts with :data:`STRUCTURAL`."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{STRUCTURAL}: {path}: {problem}")

_VALUE_COLUMN = re.compile(r"^value(_(\d+))?$")
register_block_coders(EventBatch)  # blocks of 262,144 events: Beam's size sampling must not pickle them


def value_columns(names: list[str]) -> list[str]:
    """The value columns of a header, in order: ``value`` or ``value_0..value_{d-1}``."""
    indexed = sorted((int(m.group(2)), n) for n in names if (m := _VALUE_COLUMN.match(n)) and m.group(2))
    if indexed:
        if [i for i, _ in indexed] != list(range(len(indexed))):
            raise ValueError("value columns must be value_0 .. value_{d-1} without gaps")
        return [n for _, n in indexed]
    if "value" in names:
        return ["value"]
    raise ValueError("no value column: expected 'value' or 'value_0', 'value_1', ...")


def _to_float(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Column -> (float64 values, parse-ok mask); unparsable entries are NaN and not ok."""
    try:
        return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), np.ones(len(column), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = np.full(len(column), np.nan)
        ok = np.zeros(len(column), dtype=bool)
        for i, item in enumerate(column.to_pylist()):  # slow path, only for a batch with bad text
            try:
                out[i] = float(item)
                ok[i] = True
            except (TypeError, ValueError):
                pass
        return out, ok


def _timestamps(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    if pa.types.is_timestamp(column.type):
        micros = pc.cast(column, pa.timestamp("us")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        return micros / 1e6, np.ones(len(column), dtype=bool)
    seconds, ok = _to_float(column)
    if not ok.all():  # ISO strings
        for i in np.flatnonzero(~ok):
            try:
                seconds[i] = to_micros(column[i].as_py()) / 1e6
                ok[i] = True
            except (TypeError, ValueError, OverflowError):
                pass
    return seconds, ok


def _stream_ids(column: pa.Array) -> "tuple[pa.Array | np.ndarray, np.ndarray]":
    """Column -> (stream ids, ok mask); bytes that are not UTF-8 are not ok. The ids stay one Arrow string
    array when the whole column is valid UTF-8 (the common case: no ``str`` object per row), else they
    are ``str`` objects (None where not ok)."""
    try:  # vectorised: the cast validates the whole column
        return pc.cast(column, pa.string()), np.ones(len(column), dtype=bool)
    except pa.ArrowInvalid:
        pass
    ids, ok = np.empty(len(column), dtype=object), np.ones(len(column), dtype=bool)
    for i, raw in enumerate(column.to_pylist()):
        try:
            ids[i] = None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            ok[i] = False
    return ids, ok


def nested_value_column(types: "pa.Schema | Mapping[str, pa.DataType]", columns: list[str]) -> str | None:
    """What is wrong with the first value column (of a schema, or of a mapping column -> Arrow type)
    that holds lists, structs or maps (a value column holds one number per row), naming its Arrow
    type; None if none does."""
    if isinstance(types, pa.Schema):
        types = {f.name: f.type for f in types}
    for name in columns:
        kind = types.get(name)
        if kind is not None and pa.types.is_nested(kind):
            what = ("structs" if pa.types.is_struct(kind) else "maps" if pa.types.is_map(kind)
                    else "lists" if pa.types.is_list(kind) or pa.types.is_large_list(kind)
                    or pa.types.is_fixed_size_list(kind) else "nested values")
            return f"value column {name!r} holds {what} ({kind}): give one number per column, value_0..value_{{d-1}}"
    return None


class _ReadEventFile(beam.DoFn):
    def __init__(self, batch_rows: int, timestamps: bool):
        self._batch_rows = batch_rows
        self._timestamps = timestamps

    def process(self, path: str) -> Iterator:
        if path.endswith(".parquet"):
            offset = 0  # rows of the file before the batch
            with FileSystems.open(path) as fh:
                for batch in iter_parquet_batches(fh, self._batch_rows):
                    yield from self._convert(batch, path, np.arange(offset + 1, offset + 1 + batch.num_rows))
                    offset += batch.num_rows
            return
        with FileSystems.open(path) as fh:
            try:
                read = read_csv_rows(
                    fh,
                    # stream ids as bytes: a non-UTF-8 id is one dead letter, not a failed file
                    column_types={"stream_id": pa.binary()},
                    batch_size=self._batch_rows,
                )
            except ValueError as exc:  # a header line over the line bound
                raise StructuralInputError(path, str(exc)) from None
        for letter in read.letters(path):
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, letter)
        offset = 0
        for batch in read.batches:
            records = (np.arange(offset + 1, offset + 1 + batch.num_rows) if read.records is None
                       else read.records[offset:offset + batch.num_rows])
            yield from self._convert(batch, path, records)
            offset += batch.num_rows

    def _convert(self, batch: pa.RecordBatch, path: str, records: np.ndarray) -> Iterator:
        """Rows of one batch (``records``: their record numbers in ``path``) -> an ``EventBatch`` of the
        good rows (with their record numbers) and a dead letter per bad row (with ``path#record=n``)."""
        names = batch.schema.names
        if "stream_id" not in names or (self._timestamps and "timestamp" not in names):
            raise StructuralInputError(path, f"event files need columns stream_id, timestamp, value...; got {names}")
        try:
            cols = value_columns(names)
        except ValueError as exc:
            raise StructuralInputError(path, str(exc)) from None
        problem = nested_value_column(batch.schema, cols)
        if problem:
            raise StructuralInputError(path, problem)
        streams, utf8 = _stream_ids(batch.column("stream_id"))
        for i in np.flatnonzero(~utf8):
            row = {name: batch.column(name)[i].as_py() for name in names}
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(
                Reason.BAD_STREAM_ID, DETAIL[Reason.BAD_STREAM_ID], None, row, record_source(path, int(records[i]))))
        ok = utf8.copy()
        values = np.empty((batch.num_rows, len(cols)))
        for j, name in enumerate(cols):
            values[:, j], col_ok = _to_float(batch.column(name))
            ok &= col_ok
        seconds = None
        if self._timestamps:
            seconds, ts_ok = _timestamps(batch.column("timestamp"))
            ok &= ts_ok
        for i in np.flatnonzero(~ok & utf8).tolist():
            row = {name: batch.column(name)[i].as_py() for name in names}
            stream = streams[i].as_py() if isinstance(streams, pa.Array) else streams[i]
            row["stream_id"] = stream  # the id as read (UTF-8 text), not the reader's bytes
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(
                Reason.MALFORMED, "unparsable number", stream or None, row, record_source(path, int(records[i]))))
        if ok.all():
            yield EventBatch(streams, seconds, values, path, records)
        elif ok.any():
            kept = streams.filter(pa.array(ok)) if isinstance(streams, pa.Array) else streams[ok]
            yield EventBatch(kept, None if seconds is None else seconds[ok], values[ok], path, records[ok])


class ReadEventFiles(beam.PTransform):
    """Read CSV/Parquet event files matching ``pattern`` into ``EventBatch`` blocks.

    Returns ``(batches, dead_letter)``. ``timestamps=False`` for count-step jobs. ``batch_rows``: rows
    per block (fewer, larger blocks mean fewer per-(stream, step) blocks to shuffle; ~16 MB at d = 8).
    """

    def __init__(self, pattern: str, batch_rows: int = 262_144, timestamps: bool = True):
        super().__init__()
        self.pattern = pattern
        self.batch_rows = batch_rows
        self.timestamps = timestamps

    def expand(self, pbegin):
        paths = (
            pbegin
            | "Pattern" >> beam.Create([self.pattern])
            | "Match" >> beam.FlatMap(lambda p: sorted(m.path for m in FileSystems.match([p])[0].metadata_list))
            | "Spread" >> beam.Reshuffle()
        )
        out = paths | "Read" >> beam.ParDo(_ReadEventFile(self.batch_rows, self.timestamps)).with_output_types(
            EventBatch).with_outputs(
            DEAD_LETTER, main="batches"
        )
        return out.batches, out[DEAD_LETTER]
