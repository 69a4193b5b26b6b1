"""Load releases written by the sinks back into plain Python structures (no pandas), from any Beam
filesystem (local, ``gs://``, ...)."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from beam_dp.core.release import Release
from beam_dp.io.tables import iter_parquet_batches, read_parquet_batches
from beam_dp.steps.schema import RELEASE_SCHEMA

__all__ = ["iter_release_tables", "read_release_table", "read_releases", "row_to_release"]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _micros(value: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    return (value - _EPOCH) // _dt.timedelta(microseconds=1)


def _match(pattern: str) -> list[str]:
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except BeamIOError:  # e.g. a bucket that does not exist
        return []


def _paths(pattern: str) -> list[str]:
    paths = _match(pattern) or _match(pattern + "*")
    if not paths:
        raise FileNotFoundError(f"no release files match {pattern!r}")
    return paths


def iter_release_tables(pattern: str, columns: "list[str] | tuple[str, ...] | None" = None,
                        dictionary_text: bool = False) -> Iterator[pa.Table]:
    """The releases of every ``.parquet`` or JSON-lines file matching ``pattern``, as Arrow tables of
    :data:`~beam_dp.io.RELEASE_SCHEMA` (or its ``columns``) of up to 65,536 rows, in file order: one
    batch of a Parquet file in memory at a time (a JSON-lines file whole), for summaries and checks of
    outputs of any size without a Python object per release. ``dictionary_text``: the text columns as
    Arrow dictionary arrays (``dictionary<int32, string>``): a step's stream names, meta and noise
    declarations are then decoded once per file page, not once per release (~9x faster)."""
    from apache_beam.io.filesystems import FileSystems

    schema = _schema(columns, dictionary_text)
    text = [field.name for field in schema if pa.types.is_dictionary(field.type)]
    for path in _paths(pattern):
        with FileSystems.open(path) as fh:
            if path.endswith(".parquet"):
                for batch in iter_parquet_batches(fh, columns=schema.names, missing_ok=True, read_dictionary=text):
                    yield _with_columns(pa.Table.from_batches([batch]), schema)
                continue
            rows = [json.loads(line) for line in fh.read().decode("utf-8").splitlines() if line.strip()]
        table = pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA).select(schema.names).cast(schema)
        for batch in table.to_batches(65_536):
            yield pa.Table.from_batches([batch])


def _with_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in order, a column a file written by an older version lacks
    (e.g. ``purpose``) filled with nulls."""
    for field in schema:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names)


def read_release_table(pattern: str, columns: "list[str] | tuple[str, ...] | None" = None) -> pa.Table:
    """The releases of every ``.parquet`` or JSON-lines file matching ``pattern`` as one Arrow table of
    :data:`~beam_dp.io.RELEASE_SCHEMA` (or its ``columns``), in file order (``iter_release_tables``
    concatenated)."""
    tables = list(iter_release_tables(pattern, columns))
    return pa.concat_tables(tables) if tables else _schema(columns).empty_table()


_TEXT_AS_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def _schema(columns: "list[str] | tuple[str, ...] | None", dictionary_text: bool = False) -> pa.Schema:
    """:data:`~beam_dp.io.RELEASE_SCHEMA`, or its ``columns``; with ``dictionary_text`` its text columns
    typed as dictionaries."""
    fields = list(RELEASE_SCHEMA) if columns is None else [RELEASE_SCHEMA.field(c) for c in columns]
    if dictionary_text:
        fields = [field.with_type(_TEXT_AS_DICTIONARY) if pa.types.is_string(field.type) else field
                  for field in fields]
    return pa.schema(fields)


def read_releases(pattern: str) -> list[dict]:
    """Read every ``.parquet`` or JSON-lines file matching ``pattern`` (a glob or a file prefix).

    Returns dicts with the release columns; ``meta`` parsed from JSON, ``step_start``/``step_end``
    as µs since the epoch; sorted by (stream, step).
    """
    from apache_beam.io.filesystems import FileSystems

    rows: list[dict] = []
    for path in _paths(pattern):
        with FileSystems.open(path) as fh:
            if path.endswith(".parquet"):
                rows.extend(row for batch in read_parquet_batches(fh) for row in batch.to_pylist())
            else:
                rows.extend(json.loads(line) for line in fh.read().decode("utf-8").splitlines() if line.strip())
    for row in rows:
        row["meta"] = json.loads(row["meta"]) if isinstance(row["meta"], str) else row["meta"]
        row["step_start"], row["step_end"] = _micros(row["step_start"]), _micros(row["step_end"])
    rows.sort(key=lambda r: (r["stream"], r["step"]))
    return rows


def row_to_release(row: dict) -> Release:
    """Rebuild a ``Release`` (numpy values) from a row dict."""
    flat = np.asarray(row["value"], dtype=np.float64)
    if row.get("parts"):
        value, offset = {}, 0
        for name, shape in json.loads(row["parts"]):
            size = int(np.prod(shape)) if shape else 1
            value[name] = flat[offset : offset + size].reshape(shape)
            offset += size
    else:
        value = flat.reshape(row["shape"])
    meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"])
    return Release(row["stream"], row["step"], row["mechanism"], value, row["epsilon_spent"], row["delta_spent"], meta,
                   row.get("purpose") or "", row.get("noise") or "")
