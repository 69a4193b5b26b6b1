"""Parquet and CSV reading that starts no Arrow thread pool.

Arrow's global CPU and I/O pools are native threads that live until the process exits; when they are
torn down there, the interpreter can abort ("terminate called without an active exception", exit 134)
after a script has done its work. Reading a Parquet file without pre-buffering and decoding it on the
calling thread starts neither pool (nor does decoding a CSV file's bytes there), so a batch replay or
a script that reads its releases exits cleanly. ``iter_parquet_batches`` reads and decodes one batch
at a time.

CSV (:func:`read_csv_rows`) is read as RFC 4180 describes it and as common writers write it (pyarrow's
``write_csv``, pandas' ``to_csv``, Excel, the ``csv`` module with any quoting): quoted fields and
headers, ``""`` inside quotes, line breaks inside quoted fields, CRLF line ends and a UTF-8 byte-order
mark. Every row is numbered by its *record*: the n-th record after the header, 1-based, blank lines not
counted (a quoted field's line breaks do not start a record), whether the row was read or rejected. A
line longer than :data:`MAX_LINE_BYTES` is never parsed: it is rejected as ``line_too_long`` (its
first :data:`LONG_LINE_KEPT` bytes kept); Arrow's block grows to hold any other record.
"""

from __future__ import annotations

import csv
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from beam_dp.steps.events import DETAIL, DeadLetter, Reason, record_source

__all__ = ["BLOCK_BYTES", "LONG_LINE_KEPT", "MAX_LINE_BYTES", "CsvRows", "csv_header", "iter_parquet_batches",
           "read_csv_rows", "read_parquet_batches"]

BATCH_ROWS = 65_536
#: bytes: a CSV line longer than this (its line end excluded) is rejected as ``line_too_long``, never parsed
MAX_LINE_BYTES = 8 << 20
#: bytes of a too-long line kept as its dead letter's element
LONG_LINE_KEPT = 1024
#: bytes of CSV Arrow parses at a time: a line over twice this always fails the parse ("straddling
#: object"), so every line over ``MAX_LINE_BYTES`` is found (then cut, and the block fitted to the rest)
BLOCK_BYTES = MAX_LINE_BYTES // 2


def iter_parquet_batches(fh: BinaryIO, batch_size: int = BATCH_ROWS, columns: Sequence[str] | None = None,
                         missing_ok: bool = False, read_dictionary: Sequence[str] | None = None
                         ) -> Iterator[pa.RecordBatch]:
    """The record batches of the Parquet file open in ``fh`` (or of its ``columns``; with
    ``missing_ok`` those of them the file has), read and decoded on this thread one at a time as the
    iterator is consumed (so consume it while ``fh`` is open): the file is never held whole. No
    pre-buffering, which would start Arrow's I/O pool. ``read_dictionary``: text columns read as Arrow
    dictionary arrays (a dictionary-encoded column's strings are then decoded once, not once a row)."""
    reader = pq.ParquetFile(fh, pre_buffer=False, read_dictionary=read_dictionary)
    if columns is not None and missing_ok:
        columns = [c for c in columns if c in reader.schema_arrow.names]
    yield from reader.iter_batches(batch_size=batch_size, columns=None if columns is None else list(columns),
                                   use_threads=False)


def read_parquet_batches(fh: BinaryIO, batch_size: int = BATCH_ROWS) -> list[pa.RecordBatch]:
    """All record batches of the Parquet file open in ``fh``, decoded on this thread."""
    return list(iter_parquet_batches(fh, batch_size))


def csv_header(line: bytes) -> list[str]:
    """The column names of a CSV file's first line, as RFC 4180 quotes them (a UTF-8 byte-order mark and
    the line end dropped)."""
    return next(csv.reader([line.decode("utf-8-sig").rstrip("\r\n")]), [])


@dataclass(frozen=True)
class CsvRows:
    """A CSV file read in columns: ``batches``, ``records`` (int64, each row's record number, in batch
    order; None if the parser could not say) and ``rejected``: ``(record, reason, detail, text)`` of each
    record the parser rejected (``malformed``: a wrong column count; ``line_too_long``), in file order."""

    batches: list[pa.RecordBatch]
    records: np.ndarray | None
    rejected: list[tuple[int | None, str, str, str]]

    def letters(self, path: str) -> list[DeadLetter]:
        """A dead letter per rejected record, its ``source`` ``path#record=n``, its element the text as written."""
        return [DeadLetter(reason, detail, None, text, record_source(path, record))
                for record, reason, detail, text in self.rejected]


class _Rejected:
    """pyarrow's invalid-row handler: remember each row's record number and text, skip it; a row whose
    text is ``marker`` stands for the next cut too-long line (``cut``: their kept text, in order)."""

    def __init__(self, marker: str | None, cut: list[str]):
        self.marker, self.cut, self.used = marker, cut, 0
        self.rows: list[tuple[int | None, str, str, str]] = []

    def __call__(self, row) -> str:
        record = row.number - 1 if row.number is not None and row.number > 1 else None  # the header is record 1
        text = row.text or ""
        if text == self.marker and self.used < len(self.cut):
            self.rows.append((record, Reason.LINE_TOO_LONG, DETAIL[Reason.LINE_TOO_LONG], self.cut[self.used]))
            self.used += 1
        else:
            self.rows.append((record, Reason.MALFORMED, "wrong column count", text))
        return "skip"


def _cut_long_lines(data: bytes, bound: int) -> tuple[bytes, list[str], str, int]:
    """``(data with each line over bound bytes replaced by a marker line, their first LONG_LINE_KEPT
    bytes as text, the marker, the longest line left)``; the marker has one field more than the
    header, so the parser rejects it in the cut line's place (its record number kept). ``ValueError``
    if the header line is over the bound."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts, stops = np.concatenate([[0], ends + 1]), np.concatenate([ends, [len(arr)]])
    lengths = stops - starts
    long = np.flatnonzero(lengths > bound)
    if len(long) and long[0] == 0:
        raise ValueError(f"the header line is longer than {bound} bytes")
    header = csv_header(data[:stops[0]])
    # plain text (Arrow's parser mishandles a NUL byte next to a block boundary), unique to this read
    marker = f"{Reason.LINE_TOO_LONG}-{uuid.uuid4().hex}" + "," * max(len(header), 1)
    pieces, kept, at = [], [], 0
    for i in long.tolist():
        pieces += [data[at:starts[i]], marker.encode()]
        kept.append(data[starts[i]:starts[i] + LONG_LINE_KEPT].decode("utf-8", "backslashreplace"))
        at = int(stops[i])
    pieces.append(data[at:])
    rest = np.delete(lengths, long)
    return b"".join(pieces), kept, marker, int(rest.max()) if len(rest) else 0


def read_csv_rows(fh: BinaryIO, column_types: dict[str, pa.DataType] | None = None, batch_size: int = BATCH_ROWS,
                  block_size: int = BLOCK_BYTES, max_line_bytes: int = MAX_LINE_BYTES) -> CsvRows:
    """The CSV file open in ``fh`` in record batches (types inferred, but ``column_types``), decoded on
    this thread, with each row's record number; rejected records (a wrong column count, a line over
    ``max_line_bytes``) are listed, never fatal. A record longer than Arrow's block grows the block.
    Only an empty cell is missing (null): text such as ``nan``, ``inf``, ``NA`` or ``NULL`` is read as
    written (``nan`` and ``inf`` as numbers), and text cells are never null. ``ValueError`` if the header
    line itself is over ``max_line_bytes``."""
    convert_options = pacsv.ConvertOptions(strings_can_be_null=False, null_values=[""], column_types=column_types)
    data, marker = fh.read(), None
    cut: list[str] = []
    while True:
        handler = _Rejected(marker, cut)
        try:
            table = pacsv.read_csv(pa.BufferReader(data),
                                   read_options=pacsv.ReadOptions(use_threads=False, block_size=block_size),
                                   parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                                    invalid_row_handler=handler),
                                   convert_options=convert_options)
            break
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or block_size > len(data):
                raise
            if marker is None:  # lines over the bound straddle two blocks: cut them, then fit the rest
                data, cut, marker, longest = _cut_long_lines(data, max_line_bytes)
                block_size = max(block_size, longest + 1)
            else:  # a record of several lines (line breaks inside quotes) longer than the block
                block_size *= 2
    rejected = handler.rows
    records = None
    numbers = [r[0] for r in rejected]
    if None not in numbers:
        total = table.num_rows + len(rejected)
        records = np.delete(np.arange(1, total + 1, dtype=np.int64), np.asarray(numbers, dtype=np.int64) - 1)
        if len(records) != table.num_rows:  # pragma: no cover - the parser numbered rows otherwise
            records = None
    return CsvRows(table.to_batches(max_chunksize=batch_size), records, rejected)
