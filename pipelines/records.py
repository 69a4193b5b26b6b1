"""Row-shaped inputs of the model, query and learning jobs: CSV / Parquet / JSON-lines rows as mappings.

``continual_stats`` reads columnar ``EventBatch`` blocks (``ReadEvents``); the other families take
records with named fields (features and a label, a universe record, a task id), so their jobs read
every row as a ``{column: value}`` mapping with :class:`ReadRecords` and map it to the family's
element with a small per-job function. Rows that cannot be read (a wrong column count, a line that
is not a JSON object) go to the dead letters with reason ``malformed``; a value of the wrong type
stays as it is, and the family's own parse stage dead-letters the element (never a crash).

Streaming: the same flags as ``continual_stats`` (``--source pubsub|kafka``); one JSON object per
message, with the same field names as the file columns.
"""

from __future__ import annotations

import json
from typing import Iterator

import apache_beam as beam
import pyarrow.csv as pacsv
from apache_beam.io.filesystems import FileSystems

from beam_dp.beam import DeadLetter, Reason
from beam_dp.beam.parse import DEAD_LETTER
from beam_dp.io.tables import read_csv_batches, read_parquet_batches
from pipelines.common import ReadMessages, input_header, match_files
from pipelines.rows import features_of, indexed_columns, number
from pipelines.runner import UsageError

__all__ = ["ReadRecords", "column_names", "features_of", "indexed_columns", "number", "read_rows"]


def column_names(pattern: str, flag: str = "--input") -> list[str]:
    """Column names of the files matching ``pattern``, checked alike (``pipelines.common.input_header``)."""
    return input_header(pattern, flag)[1]


def _is_jsonl(path: str) -> bool:
    return path.endswith((".jsonl", ".json", ".ndjson"))


class _BadCsvRows:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, row) -> str:
        self.texts.append(row.text or "")
        return "skip"


class _ReadRecordFile(beam.DoFn):
    """One file -> its rows as mappings; unreadable rows -> ``malformed`` dead letters."""

    def process(self, path: str) -> Iterator:
        if _is_jsonl(path):
            with FileSystems.open(path) as fh:
                for line in fh.read().decode("utf-8-sig").splitlines():
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except ValueError:
                        row = None
                    if isinstance(row, dict):
                        yield row
                    else:
                        yield beam.pvalue.TaggedOutput(
                            DEAD_LETTER, DeadLetter(Reason.MALFORMED, "line is not a JSON object", None, line))
            return
        with FileSystems.open(path) as fh:
            if path.endswith(".parquet"):
                batches = read_parquet_batches(fh)
                bad: list[str] = []
            else:
                handler = _BadCsvRows()
                batches = read_csv_batches(
                    fh, parse_options=pacsv.ParseOptions(invalid_row_handler=handler),
                    convert_options=pacsv.ConvertOptions(strings_can_be_null=False))
                bad = handler.texts
        for text in bad:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(Reason.MALFORMED, "wrong column count", None, text))
        for batch in batches:
            yield from batch.to_pylist()


class ReadRecords(beam.PTransform):
    """Rows of CSV / Parquet / JSON-lines files matching ``pattern`` (``--source files``), or the JSON
    objects of Pub/Sub / Kafka messages (``messages``: a test source used in their place).
    Returns ``(records, dead_letter)``; records are ``{column: value}`` mappings."""

    def __init__(self, opts, pattern: str | None = None, messages: beam.PTransform | None = None):
        super().__init__()
        self.opts = opts
        self.pattern = pattern
        self.messages = messages

    def expand(self, pbegin):
        if self.messages is None and self.opts.source == "files":
            paths = (pbegin
                     | "Pattern" >> beam.Create([self.pattern])
                     | "Match" >> beam.FlatMap(lambda p: sorted(m.path for m in FileSystems.match([p])[0].metadata_list))
                     | "Spread" >> beam.Reshuffle())
            out = paths | "Read" >> beam.ParDo(_ReadRecordFile()).with_outputs(DEAD_LETTER, main="rows")
            return out.rows, out[DEAD_LETTER]
        out = pbegin | "Messages" >> ReadMessages(self.opts, self.messages, as_event=False)
        return out.events, out[DEAD_LETTER]


def read_rows(pattern: str, flag: str) -> list[dict]:
    """Every row of the (small, public) files matching ``pattern``, read here on the launcher;
    an unreadable row is a usage error."""
    rows: list[dict] = []
    for path in match_files(pattern, flag):
        for item in _ReadRecordFile().process(path):
            if isinstance(item, beam.pvalue.TaggedOutput):
                raise UsageError(f"{flag} {path}: unreadable row ({item.value.detail})")
            rows.append(item)
    return rows
