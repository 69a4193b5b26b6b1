"""Parquet and CSV reading that starts no Arrow thread pool.

Arrow's global CPU and I/O pools are native threads that live until the process exits; when they are
torn down there, the interpreter can abort ("terminate called without an active exception", exit 134)
after a script has done its work. Reading a file's bytes and decoding them on the calling thread
starts neither pool, so a batch replay or a script that reads its releases exits cleanly. A file is
held in memory whole (its bytes and its batches), as the readers that used pyarrow's streaming
readers already held all its batches.
"""

from __future__ import annotations

from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = ["read_csv_batches", "read_parquet_batches"]

BATCH_ROWS = 65_536


def read_parquet_batches(fh: BinaryIO, batch_size: int = BATCH_ROWS) -> list[pa.RecordBatch]:
    """All record batches of the Parquet file open in ``fh``, decoded on this thread."""
    reader = pq.ParquetFile(pa.BufferReader(fh.read()))
    return list(reader.iter_batches(batch_size=batch_size, use_threads=False))


def read_csv_batches(fh: BinaryIO, parse_options: pacsv.ParseOptions, convert_options: pacsv.ConvertOptions,
                     batch_size: int = BATCH_ROWS, block_size: int = 1 << 22) -> list[pa.RecordBatch]:
    """All record batches of the CSV file open in ``fh`` (types inferred from its first block),
    decoded on this thread; rows the parser rejects go to ``parse_options.invalid_row_handler``."""
    table = pacsv.read_csv(pa.BufferReader(fh.read()),
                           read_options=pacsv.ReadOptions(use_threads=False, block_size=block_size),
                           parse_options=parse_options, convert_options=convert_options)
    return table.to_batches(max_chunksize=batch_size)
