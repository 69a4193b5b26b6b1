"""Every job's CSV reader accepts what common writers write: pyarrow's ``write_csv`` (quoted header and
text), the ``csv`` module with ``QUOTE_ALL`` (CRLF line ends), Excel's defaults (a UTF-8 byte-order mark,
CRLF) and pandas' ``to_csv``; a quoted field may hold commas, quotes and line breaks. Each file must
read exactly as the same rows written plainly: the launch check's header, the continual_stats event
reader's blocks (with their record numbers) and the record jobs' readers (in columns and per row)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from beam_dp.io.sources import _ReadEventFile
from beam_dp.io.tables import csv_header, read_csv_rows
from beam_dp.steps.events import EventBatch
from pipelines import growing_db_queries, model_release, online_learning
from pipelines.common import input_header
from pipelines.records import ReadRecordFile

WRITERS = ["plain", "pyarrow", "quote_all", "excel", "pandas"]


def write_csv(path, header: list[str], rows: list[list], how: str) -> str:
    """``rows`` under ``header`` as the writer ``how`` writes them; returns the path."""
    if how == "plain":
        path.write_text("\n".join([",".join(header)] + [",".join(map(str, row)) for row in rows]) + "\n")
    elif how == "pyarrow":
        pacsv.write_csv(pa.table({name: [row[j] for row in rows] for j, name in enumerate(header)}), str(path))
    elif how in ("quote_all", "excel"):
        with open(path, "w", newline="", encoding="utf-8-sig" if how == "excel" else "utf-8") as fh:
            writer = csv.writer(fh, quoting=csv.QUOTE_ALL if how == "quote_all" else csv.QUOTE_MINIMAL)
            writer.writerow(header)
            writer.writerows(rows)
    elif how == "pandas":
        pd = pytest.importorskip("pandas")
        pd.DataFrame(rows, columns=header).to_csv(path, index=False)
    else:  # pragma: no cover
        raise ValueError(how)
    return str(path)


def test_the_writers_really_write_their_dialects(tmp_path):
    header, rows = ["stream_id", "value"], [["a", 0.5]]

    def written(how: str) -> bytes:
        with open(write_csv(tmp_path / f"{how}.csv", header, rows, how), "rb") as fh:
            return fh.read()

    assert written("pyarrow").startswith(b'"stream_id","value"\n')
    assert written("quote_all") == b'"stream_id","value"\r\n"a","0.5"\r\n'
    assert written("excel") == b'\xef\xbb\xbfstream_id,value\r\na,0.5\r\n'


def test_header_names_are_read_as_rfc_4180_quotes_them():
    assert csv_header(b'"stream_id","time, UTC","say ""hi"""\r\n') == ["stream_id", "time, UTC", 'say "hi"']
    assert csv_header(b"\xef\xbb\xbfstream_id,value\n") == ["stream_id", "value"]


EVENTS = (["stream_id", "timestamp", "value"],
          [["a", 1, 0.5], ["b, with comma", 2, -0.25], ['q"uote', 3, 1.0], ["line\nbreak", 4, 0.125], ["a", 5, 2.0]])


def _event_blocks(path: str) -> tuple[list, list, list, list]:
    out = list(_ReadEventFile(1000, True).process(path))
    assert all(isinstance(item, EventBatch) for item in out), out  # no dead letter
    ids = [s for b in out
           for s in (b.stream_ids.to_pylist() if isinstance(b.stream_ids, pa.Array) else b.stream_ids)]
    return (ids, np.concatenate([b.timestamps for b in out]).tolist(), np.concatenate([b.values for b in out]).tolist(),
            [b.source_of(i).rsplit("#", 1)[1] for b in out for i in range(len(b))])


@pytest.mark.parametrize("how", WRITERS[1:])
def test_continual_stats_reads_every_writer_as_written(tmp_path, how):
    path = write_csv(tmp_path / f"{how}.csv", *EVENTS, how)
    assert input_header(path)[1] == EVENTS[0]
    ids, seconds, values, records = _event_blocks(path)
    assert ids == ["a", "b, with comma", 'q"uote', "line\nbreak", "a"]
    np.testing.assert_allclose(seconds, [1, 2, 3, 4, 5], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.ravel(values), [0.5, -0.25, 1.0, 0.125, 2.0], rtol=0, atol=1e-12)
    assert records == [f"record={n}" for n in range(1, 6)]  # a quoted line break starts no record


LABELLED = (["stream_id", "x_0", "x_1", "label"],
            [["s1", 0.1, -0.2, "a"], ["s 2", 0.3, 0.4, "b"], ["s1", 0.5, 0.0, "a"]])
NUMBERED = (["stream_id", "x_0", "x_1", "label"], [["s1", 0.1, -0.2, 1.0], ["s 2", 0.3, 0.4, -1.0]])
ELEMENTS = (["stream_id", "timestamp", "colour", "size"], [["s1", 1.5, "red", 0.5], ["s 2", 2.5, "dark blue", 7.0]])
UNIVERSE = growing_db_queries.parse_universe('{"colour": ["red", "dark blue"], "size": {"edges": [0, 1, 5, 10]}}')


def _records(path: str, spec) -> list:
    out = list(ReadRecordFile(spec).process(path))
    assert out and all(hasattr(o, "records") for o in out), out  # blocks only, no dead letter
    return [(r, b.source_of(i).rsplit("#", 1)[1]) for b in out for i, r in enumerate(b.records())]


@pytest.mark.parametrize("how", WRITERS[1:])
@pytest.mark.parametrize("reader", ["model_release", "online_learning", "growing_db_queries"])
def test_record_jobs_read_every_writer_in_columns_as_the_plain_file(tmp_path, how, reader):
    header, rows = {"model_release": LABELLED, "online_learning": NUMBERED, "growing_db_queries": ELEMENTS}[reader]
    spec = {"model_release": lambda: model_release.labelled(_erm_params()),
            "online_learning": lambda: online_learning.labelled(2),
            "growing_db_queries": lambda: growing_db_queries.elements(UNIVERSE)}[reader]()
    plain = _records(write_csv(tmp_path / "plain.csv", header, rows, "plain"), spec)
    path = write_csv(tmp_path / f"{how}.csv", header, rows, how)
    assert input_header(path)[1] == header
    got = _records(path, spec)
    assert [n for _, n in plain] == [f"record={i}" for i in range(1, len(rows) + 1)]
    assert repr(got) == repr(plain)  # the same elements, types included, and the same record numbers


def _erm_params():
    from beam_dp.beam import ContinualModelParams

    return ContinualModelParams(n_features=2, classes=("a", "b"), epsilon=1.0, clip_bound=2.0, update=2, base=4)


TASK_ROWS = (["stream_id", "task_id", "x_0", "label"], [["s", "0", 0.5, 1], ["s t", "1", -0.5, 0]])


@pytest.mark.parametrize("how", WRITERS[1:])
def test_per_row_readers_read_every_writer_as_the_plain_file(tmp_path, how):
    """lifelong's rows and growing_db_queries' queries: mappings, one per row."""
    plain = list(ReadRecordFile().process(write_csv(tmp_path / "plain.csv", *TASK_ROWS, "plain")))
    path = write_csv(tmp_path / f"{how}.csv", *TASK_ROWS, how)
    assert input_header(path)[1] == TASK_ROWS[0]
    got = list(ReadRecordFile().process(path))
    assert len(got) == 2 and repr(got) == repr(plain)


def test_a_quoted_record_longer_than_arrows_block_grows_the_block():
    text = b'a,b\n1,2\n"' + b"x\n" * 3000 + b'",3\n4,5\n'
    read = read_csv_rows(io.BytesIO(text), block_size=1000, max_line_bytes=2000)
    assert read.records.tolist() == [1, 2, 3] and not read.rejected
    assert [len(r["a"]) for b in read.batches for r in b.to_pylist()] == [1, 6000, 1]
