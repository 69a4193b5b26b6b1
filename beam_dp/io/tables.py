"""Parquet and CSV reading that starts no Arrow thread pool.

Arrow's global CPU and I/O pools are native threads that live until the process exits; when they are
torn down there, the interpreter can abort ("terminate called without an active exception", exit 134)
after a script has done its work. Reading a Parquet file without pre-buffering and decoding it on the
calling thread starts neither pool (nor does decoding a CSV file's bytes there), so a batch replay or
a script that reads its releases exits cleanly. ``iter_parquet_batches`` reads and decodes one batch
at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = ["iter_parquet_batches", "read_csv_batches", "read_parquet_batches"]

BATCH_ROWS = 65_536


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


def read_csv_batches(fh: BinaryIO, parse_options: pacsv.ParseOptions, convert_options: pacsv.ConvertOptions,
                     batch_size: int = BATCH_ROWS, block_size: int = 1 << 22) -> list[pa.RecordBatch]:
    """All record batches of the CSV file open in ``fh`` (types inferred from its first block),
    decoded on this thread; rows the parser rejects go to ``parse_options.invalid_row_handler``."""
    table = pacsv.read_csv(pa.BufferReader(fh.read()),
                           read_options=pacsv.ReadOptions(use_threads=False, block_size=block_size),
                           parse_options=parse_options, convert_options=convert_options)
    return table.to_batches(max_chunksize=batch_size)
