"""Release sinks: Parquet (pyarrow schema) and JSON lines, for release rows or release columns.

A transform keyed by stream emits :class:`ReleaseRow` s; one keyed by groups of streams
(``stream_groups``) emits :class:`~beam_dp.steps.schema.ReleaseColumns` (one per group and step): pass
``columnar=True``, and the Parquet sink gathers them into tables of up to ``ROWS_PER_TABLE`` releases
(:func:`~beam_dp.steps.schema.release_table`) and writes those whole, without per-row objects.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import filebasedsink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.transforms.window import GlobalWindows

from beam_dp.io.coders import register_block_coders
from beam_dp.steps.schema import RELEASE_SCHEMA, ReleaseColumns, ReleaseRow, release_table

__all__ = ["DICTIONARY_COLUMNS", "RELEASE_ID", "ROWS_PER_TABLE", "GatherReleaseTables", "WriteReleasesToJsonLines",
           "WriteReleasesToParquet", "WriteReleasesToPubSub", "release_dicts", "release_id", "release_message",
           "release_parquet_writer"]

ROWS_PER_TABLE = 65_536  # releases per table (a Parquet row group) when gathering release columns
RELEASE_ID = "release_id"  # the Pub/Sub attribute naming a release: its (stream, step)
#: the Parquet columns (leaf paths: a list's values are ``<name>.list.item``) of a release file that are
#: dictionary-encoded: all but ``value``'s. The others repeat a step's or a part's facts, while a noisy
#: value's doubles never repeat, so a dictionary tried on them is built and dropped (over the dictionary
#: page limit) for nothing: half of a release table's write, for 2% more bytes
DICTIONARY_COLUMNS = tuple(f"{field.name}.list.item" if pa.types.is_list(field.type) else field.name
                           for field in RELEASE_SCHEMA if field.name != "value")
register_block_coders(ReleaseColumns, pa.Table)  # tables of 65,536 releases: sized, not pickled, by Beam's sampler


def _as_dict(row: ReleaseRow) -> dict:
    return row._asdict()


def release_id(row: ReleaseRow) -> str:
    """A release's id, ``<stream>/<step>``: public, the same on every retry, replay or restore."""
    return f"{row.stream}/{row.step}"


def release_message(row: ReleaseRow, id_attribute: str = RELEASE_ID):
    """One Pub/Sub message per release: the row as JSON, its id (:func:`release_id`) as an attribute."""
    from apache_beam.io.gcp.pubsub import PubsubMessage

    data = json.dumps(_as_dict(row), sort_keys=True).encode()
    return PubsubMessage(data, {id_attribute: release_id(row)})


def release_dicts(table: pa.Table) -> list[dict]:
    """The rows of a release table as dicts shaped like ``ReleaseRow._asdict()`` (times in µs)."""
    for name in ("step_start", "step_end"):
        table = table.set_column(table.schema.get_field_index(name), name, table[name].cast(pa.int64()))
    return table.to_pylist()


class GatherReleaseTables(beam.DoFn):
    """``ReleaseColumns`` -> ``pyarrow.Table`` s of up to ``ROWS_PER_TABLE`` releases (per bundle)."""

    def __init__(self, rows_per_table: int = ROWS_PER_TABLE):
        self._limit = rows_per_table

    def start_bundle(self) -> None:
        self._parts: list[ReleaseColumns] = []
        self._rows = 0

    def process(self, columns: ReleaseColumns) -> Iterator[pa.Table]:
        self._parts.append(columns)
        self._rows += len(columns.batch)
        if self._rows >= self._limit:
            yield self._flush()

    def finish_bundle(self):
        if self._parts:
            yield GlobalWindows.windowed_value(self._flush())

    def _flush(self) -> pa.Table:
        table = release_table(self._parts)
        self._parts, self._rows = [], 0
        return table


def release_parquet_writer(fh) -> pq.ParquetWriter:
    """A Parquet writer of release tables into the open file ``fh``: :data:`RELEASE_SCHEMA`, uncompressed,
    lists named as Beam's Parquet sink names them (``list<item>``), :data:`DICTIONARY_COLUMNS` only."""
    return pq.ParquetWriter(fh, RELEASE_SCHEMA, compression="none", use_compliant_nested_type=False,
                            use_dictionary=list(DICTIONARY_COLUMNS))


class _ReleaseTableSink(filebasedsink.FileBasedSink):
    """Beam file sink of release tables: one Parquet file per shard (``release_parquet_writer``); on an
    unbounded input, per window too (the shard names Beam's ``WriteToParquetBatched`` gives it; an older
    Beam, such as the Flink venv's 2.61, has neither windowed file writes nor that template)."""

    def __init__(self, file_path_prefix: str, num_shards: int, windowed: bool = False):
        super().__init__(file_path_prefix, coder=None, file_name_suffix=".parquet", num_shards=num_shards,
                         shard_name_template=getattr(filebasedsink, "DEFAULT_WINDOW_SHARD_NAME_TEMPLATE", None)
                         if windowed else None,
                         mime_type="application/x-parquet", compression_type=CompressionTypes.UNCOMPRESSED)

    def open(self, temp_path: str) -> "tuple[Any, pq.ParquetWriter]":
        handle = super().open(temp_path)
        return handle, release_parquet_writer(handle)

    def write_record(self, file_handle: "tuple[Any, pq.ParquetWriter]", value: pa.Table) -> None:
        file_handle[1].write_table(value)

    def close(self, file_handle: "tuple[Any, pq.ParquetWriter]") -> None:
        handle, writer = file_handle
        writer.close()
        handle.close()


class _ReleaseSink(beam.PTransform):
    """Shared constructor: where the shards go, how many (0 = the runner decides), and whether the
    input holds ``ReleaseColumns`` (``columnar``) rather than rows."""

    def __init__(self, file_path_prefix: str, num_shards: int = 0, columnar: bool = False):
        super().__init__()
        self.file_path_prefix = file_path_prefix
        self.num_shards = num_shards
        self.columnar = columnar


class WriteReleasesToParquet(_ReleaseSink):
    """Write releases to ``<prefix>-SSSSS-of-NNNNN.parquet`` with :data:`RELEASE_SCHEMA`."""

    def expand(self, releases):
        if self.columnar:
            return (
                releases
                | "Gather" >> beam.ParDo(GatherReleaseTables()).with_output_types(pa.Table)
                | "Write" >> beam.io.Write(_ReleaseTableSink(self.file_path_prefix, self.num_shards,
                                                            windowed=not releases.is_bounded))
            )
        return (
            releases
            | "AsDict" >> beam.Map(_as_dict)
            | "Write" >> beam.io.WriteToParquet(
                self.file_path_prefix, RELEASE_SCHEMA, file_name_suffix=".parquet", num_shards=self.num_shards
            )
        )


class WriteReleasesToJsonLines(_ReleaseSink):
    """Write releases as JSON lines (one per release) to ``<prefix>-SSSSS-of-NNNNN.jsonl``."""

    def expand(self, releases):
        rows = releases | "Rows" >> beam.FlatMap(ReleaseColumns.rows) if self.columnar else releases
        return (
            rows
            | "ToJson" >> beam.Map(lambda row: json.dumps(_as_dict(row), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self.file_path_prefix, file_name_suffix=".jsonl", num_shards=self.num_shards)
        )


class WriteReleasesToPubSub(beam.PTransform):
    """Publish releases to a Pub/Sub ``topic``, one JSON message per release with the attribute
    ``id_attribute`` = ``<stream>/<step>`` (:func:`release_message`). A release retried by Beam or
    replayed after a restore carries the same id and the same value (keyed noise), so a reader
    deduplicates with ``ReadFromPubSub(..., id_label=id_attribute)``. ``columnar``: the input holds
    ``ReleaseColumns`` (``stream_groups``)."""

    def __init__(self, topic: str, id_attribute: str = RELEASE_ID, columnar: bool = False):
        super().__init__()
        self.topic, self.id_attribute, self.columnar = topic, id_attribute, columnar

    def expand(self, releases):
        rows = releases | "Rows" >> beam.FlatMap(ReleaseColumns.rows) if self.columnar else releases
        return (
            rows
            | "ToMessage" >> beam.Map(release_message, self.id_attribute)
            | "Publish" >> beam.io.WriteToPubSub(self.topic, with_attributes=True)
        )
