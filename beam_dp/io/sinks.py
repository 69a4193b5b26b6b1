"""Release sinks: Parquet (pyarrow schema) and JSON lines."""

from __future__ import annotations

import json

import apache_beam as beam

from beam_dp.steps.schema import RELEASE_SCHEMA, ReleaseRow

__all__ = ["WriteReleasesToJsonLines", "WriteReleasesToParquet"]


def _as_dict(row: ReleaseRow) -> dict:
    return row._asdict()


class _ReleaseSink(beam.PTransform):
    """Shared constructor: where the shards go and how many (0 = the runner decides)."""

    def __init__(self, file_path_prefix: str, num_shards: int = 0):
        super().__init__()
        self.file_path_prefix = file_path_prefix
        self.num_shards = num_shards


class WriteReleasesToParquet(_ReleaseSink):
    """Write release rows to ``<prefix>-SSSSS-of-NNNNN.parquet`` with :data:`RELEASE_SCHEMA`."""

    def expand(self, rows):
        return (
            rows
            | "AsDict" >> beam.Map(_as_dict)
            | "Write" >> beam.io.WriteToParquet(
                self.file_path_prefix, RELEASE_SCHEMA, file_name_suffix=".parquet", num_shards=self.num_shards
            )
        )


class WriteReleasesToJsonLines(_ReleaseSink):
    """Write release rows as JSON lines to ``<prefix>-SSSSS-of-NNNNN.jsonl``."""

    def expand(self, rows):
        return (
            rows
            | "ToJson" >> beam.Map(lambda row: json.dumps(_as_dict(row), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self.file_path_prefix, file_name_suffix=".jsonl", num_shards=self.num_shards)
        )
