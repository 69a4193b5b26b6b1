"""Which files the report reads, and their release columns one Arrow batch at a time.

An input is a job's output folder (its manifest ``_beam_dp_manifest.json`` names the release files,
as ``python -m beam_dp.verify`` reads them; a folder without one: its release files), the manifest
itself, a glob, a file prefix, or one file named exactly. A folder, glob or prefix yields only release
files (``.parquet``, ``.jsonl``, ``.ndjson``): the manifest, JSON summaries and dead letters are
skipped. A file named exactly is read whatever its name, and one that holds no release rows is a
:class:`ReportInputError`. Any Beam filesystem (local, ``gs://``, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from beam_dp.io.manifest import MANIFEST_NAME
from beam_dp.steps.schema import RELEASE_SCHEMA

__all__ = ["RELEASE_SUFFIXES", "REQUIRED_COLUMNS", "ReportInputError", "iter_batches", "release_files"]

#: Names of release files in a folder or glob (what the Parquet and JSON-lines sinks write).
RELEASE_SUFFIXES = (".parquet", ".jsonl", ".ndjson")
#: Columns every release row has (``beam_dp.io.RELEASE_SCHEMA``) that the report reads.
REQUIRED_COLUMNS = ("stream", "step", "mechanism", "value", "epsilon_spent", "delta_spent", "epsilon_budget", "meta")
#: Text columns read as Arrow dictionaries: a step's stream names and meta decode once per file page.
DICTIONARY_COLUMNS = ("stream", "mechanism", "meta")
#: Bytes of decoded columns per batch: rows per batch shrink as the released vectors widen.
BATCH_BYTES = 32 << 20
MAX_BATCH_ROWS = 65_536
_JSON_CHUNK_BYTES = 16 << 20


class ReportInputError(ValueError):
    """An input the report cannot read: no file matches, a file is unreadable or not releases."""


def _match(pattern: str) -> list[str]:
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except BeamIOError:  # e.g. a bucket that does not exist
        return []


def _is_release_name(path: str) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name.endswith(RELEASE_SUFFIXES) and not name.startswith("dead_letter")


def _folder_of(item: str) -> str | None:
    """The job folder ``item`` names (the folder, or its manifest), else None."""
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.io.manifest import manifest_path

    if item.rstrip("/").endswith(MANIFEST_NAME):
        return item.rstrip("/")[: -len(MANIFEST_NAME)] or "."
    if os.path.isdir(item) or ("://" in item and FileSystems.exists(manifest_path(item))):
        return item
    return None


def _folder_files(folder: str) -> tuple[list[str], list[str]]:
    """The release files of a job folder (manifest-aware) and notes on declared files that are missing."""
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.io.manifest import manifest_path, read_manifest
    from beam_dp.verify import manifest_release_files

    if not FileSystems.exists(manifest_path(folder)):
        return [p for p in _match(FileSystems.join(folder, "*")) if _is_release_name(p)], []
    patterns, missing = manifest_release_files(folder, read_manifest(folder))
    return [p for pattern in patterns for p in _match(pattern) if _is_release_name(p)], missing


def release_files(inputs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The release files ``inputs`` name (see the module docstring), in order without repeats, and notes
    (a manifest's declared files that are missing). ``ReportInputError`` when none match."""
    inputs = list(inputs)
    paths: list[str] = []
    notes: list[str] = []
    for item in inputs:
        folder = _folder_of(item)
        if folder is not None:
            found, missing = _folder_files(folder)
            notes += missing
        elif any(c in item for c in "*?["):
            found = [p for p in _match(item) if _is_release_name(p)]
        else:
            found = _match(item) or [p for p in _match(item + "*") if _is_release_name(p)]
        paths += [p for p in found if p not in paths]
    if not paths:
        raise ReportInputError(f"no release files match {' '.join(inputs)}")
    return paths, notes


def iter_batches(path: str, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> Iterator[pa.RecordBatch]:
    """The ``columns`` of the release file ``path`` (Parquet by its ``.parquet`` name, else JSON lines)
    as record batches of at most ``BATCH_BYTES`` decoded (``stream``, ``mechanism``, ``meta``: Arrow
    dictionaries), read one at a time on this thread. ``ReportInputError`` naming the file when it
    cannot be read or is not releases (a required column absent or null)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path) as fh:
            reader = _parquet_batches(fh, path, columns) if path.endswith(".parquet") else _json_batches(fh, columns)
            for batch in reader:
                nulls = [c for c in columns if batch.column(c).null_count]
                if nulls:
                    raise ReportInputError(f"{path} is not a beam_dp release file: its rows lack {', '.join(nulls)}")
                yield batch
    except ReportInputError:
        raise
    except OSError as exc:
        raise ReportInputError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    except (pa.ArrowException, ValueError, TypeError, KeyError) as exc:
        raise ReportInputError(f"{path} is not a beam_dp release file (Parquet or JSON lines of release rows): "
                               f"{type(exc).__name__}") from None


def _parquet_batches(fh, path: str, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    reader = pq.ParquetFile(fh, pre_buffer=False, read_dictionary=[c for c in DICTIONARY_COLUMNS if c in columns])
    missing = [c for c in columns if c not in reader.schema_arrow.names]
    if missing:
        raise ReportInputError(f"{path} is not a beam_dp release file: it has no "
                               f"{', '.join(missing)} column")
    meta = reader.metadata
    rows = max(meta.num_rows, 1)
    width = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) / rows
    batch_rows = int(min(MAX_BATCH_ROWS, max(1024, BATCH_BYTES // max(width, 1.0))))
    yield from reader.iter_batches(batch_size=batch_rows, columns=list(columns), use_threads=False)


def _json_batches(fh, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """JSON lines parsed by Arrow in chunks of ~16 MB (cut at a line end), on this thread."""
    schema = pa.schema([RELEASE_SCHEMA.field(c) for c in columns])
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    wanted = pa.schema([f.with_type(pa.dictionary(pa.int32(), pa.string())) if f.name in DICTIONARY_COLUMNS else f
                        for f in schema])
    rest = b""
    while True:
        block = fh.read(_JSON_CHUNK_BYTES)
        data = rest + block
        cut = len(data) if not block else data.rfind(b"\n") + 1
        chunk, rest = data[:cut], data[cut:]
        if chunk.strip():
            table = pajson.read_json(pa.BufferReader(chunk), parse_options=options,
                                     read_options=pajson.ReadOptions(use_threads=False, block_size=len(chunk) + 1))
            yield from table.select(schema.names).cast(wanted).to_batches(MAX_BATCH_ROWS)
        if not block:
            return
