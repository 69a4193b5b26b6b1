"""Growing-database elements read in columns (``ElementColumns``): the releases and dead letters of the per-row path.

Each case writes one element file (CSV, Parquet or JSON lines) with good rows of several streams and bad
ones (NaN / infinite / missing / out-of-range timestamps, empty and undeclared stream ids, unknown
categories, bucket values outside the edges, integer codes that are not codes, empty cells, nulls, a
wrong column count), then runs ``GrowingDatabaseQueries`` twice in this process on it with the same
queries: once on the per-row elements (``ReadRecords`` rows mapped by the job's ``to_element``: the path
before columns and the one messages take) and once on the job's columnar blocks (``elements(universe)``).
The releases must be equal value for value and the dead letters equal in reason, detail, stream and
element. The parse stage is also compared directly: the same blocks per stream, in the same order.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.beam import GrowingDatabaseQueries
from beam_dp.beam.growing_db import GrowingDatabaseParams, ParseGrowing
from beam_dp.beam.shell.blocks import BlockOriginals
from beam_dp.core import StepClock
from beam_dp.io.coders import BlockCoder
from beam_dp.steps.events import DeadLetter
from pipelines import growing_db_queries as job
from pipelines.records import ReadRecordFile, ReadRecords
from tests.beam.collect import run
from tests.pipelines.test_columnar_records import _assert_same, _sourceless

pytestmark = pytest.mark.pipeline

FILES = SimpleNamespace(source="files")
UNIVERSE = job.parse_universe('{"colour": ["red", "green", "blue"], "size": {"edges": [0, 1, 5, 10]}, '
                              '"k": {"range": 3}}')
GRADES = job.parse_universe('{"grade": ["1", "2", "3"], "size": {"edges": [0, 1, 5, 10]}}')
CLOCK = StepClock(0.0, 5.0, end=50.0)
HEADER = "stream_id,timestamp,colour,size,k"


def _params(universe=UNIVERSE, streams=None) -> GrowingDatabaseParams:
    return GrowingDatabaseParams(universe=universe, n=8, epsilon=1.0, clock=CLOCK, streams=streams)


def _good(n=60, streams=("s1", "s2", "s3"), seed=0) -> list[list]:
    rng = np.random.default_rng(seed)
    colours = ("red", "green", "blue")
    ts = np.sort(rng.uniform(0, 50, n))
    return [[streams[i % len(streams)], float(ts[i]), colours[int(rng.integers(0, 3))], float(rng.uniform(0, 10)),
             int(rng.integers(0, 3))] for i in range(n)]


def _csv(path, header: str, rows: list[list], bad: list[str]) -> str:
    lines = [header] + [",".join(repr(v) if isinstance(v, float) else str(v) for v in row) for row in rows]
    lines[7:7] = bad[: len(bad) // 2]  # bad rows among the good ones, and at the end
    path.write_text("\n".join(lines + bad[len(bad) // 2:]) + "\n")
    return str(path)


def _queries(path, streams=("s1", "s2", "s3", "s4")) -> str:
    lines = []
    for stream in streams:
        for k, t in enumerate(range(8, 22, 3)):
            query = {"indices": [0, 4, 8]} if k % 2 else {"predicate": {"size": [0, 5]}}
            lines.append(json.dumps({"stream_id": stream, "query_id": f"q{k}", "t": t, **query}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _both(elements: str, queries: str, params: GrowingDatabaseParams) -> tuple[tuple, tuple]:
    """(releases, dead letters) of the per-row path and of the columnar path, each sorted."""
    universe = params.universe
    results = []
    for columnar in (False, True):
        def build(p):
            if columnar:
                els, read_bad = p | "Elements" >> ReadRecords(FILES, elements, None, job.elements(universe))
            else:
                rows, read_bad = p | "Elements" >> ReadRecords(FILES, elements)
                els = rows | "ToElements" >> beam.Map(job.to_element, universe)
            query_rows, _ = p | "Queries" >> ReadRecords(FILES, queries)
            out = ({"elements": els, "queries": query_rows | beam.Map(job.to_query, universe.size)}
                   | "GrowingDatabaseQueries" >> GrowingDatabaseQueries(params))
            letters = ((read_bad, out.dead_letter) | "Letters" >> beam.Flatten()
                       | beam.Map(lambda d: ("d", json.dumps(d.to_json("x"), sort_keys=True))))
            return (out.releases | beam.Map(lambda r: ("r", r)), letters) | beam.Flatten()
        items = run(build)
        releases = sorted((v for k, v in items if k == "r"), key=lambda r: (r.stream, r.step, r.meta))
        results.append((releases, sorted(v for k, v in items if k == "d")))
    return results[0], results[1]


BAD_CSV = ["s1,inf,red,1.0,0", "s2,-inf,red,1.0,0", "s1,nan,red,1.0,0", ",5.0,red,1.0,0", "s4,5.0,red,1.0,0",
           "s1,5.5,purple,1.0,0", "s1,6.0,red,11.0,0", "s1,6.0,red,-1.0,1", "s2,7.0,red,,0", "s2,,red,1.0,0",
           "s3,7.5,,1.0,0", "s3,8.0,red,1.0,", "s1,8.0,red,1.0,5", "s1,8.0,red,1.0,1.5", "s1,8.5,red,1.0,1e30",
           "s1,70.0,red,1.0,0", "s1,-5.0,red,1.0,0", "s1,1e13,red,1.0,0", "s1,1e300,red,1.0,0", "s1,7.0,red",
           "s2,9.0000005,green,2.0,1", "s3,12.0,blue,nan,2"]


@pytest.mark.parametrize("declared", [None, ("s1", "s2", "s3")])
@pytest.mark.parametrize("max_rows", [None, 5])
def test_csv_elements_in_columns_equal_the_per_row_path(tmp_path, monkeypatch, declared, max_rows):
    # max_rows 5: a bundle's blocks fill inside a chunk and around the odd rows (cut like the per-row path's)
    if max_rows is not None:
        monkeypatch.setattr(ParseGrowing, "MAX_ROWS", max_rows)
    elements = _csv(tmp_path / "elements.csv", HEADER, _good(), BAD_CSV)
    per_row, columnar = _both(elements, _queries(tmp_path / "queries.jsonl"), _params(streams=declared))
    _assert_same(per_row, columnar, min_releases=9, min_letters=len(BAD_CSV) - 3)


def test_text_columns_and_numeric_categories_equal_the_per_row_path(tmp_path):
    # a text timestamp column (ISO-8601 and junk: every row odd), a text size column (cells converted one by
    # one), integer cells of text categories ("1".."3": the per-row path's str(value)), an unknown grade
    rows = [[r[0], r[1], 1 + r[4], r[3]] for r in _good()]
    bad = ["s1,abc,1,1.0", "s2,1970-01-01T00:00:20,2,2.0", "s1,9.0,4,1.0", "s3,9.5,2,abc", "s3,10.0,2,",
           "s2,11.0,,3.0"]
    elements = _csv(tmp_path / "grades.csv", "stream_id,timestamp,grade,size", rows, bad)
    per_row, columnar = _both(elements, _queries(tmp_path / "queries.jsonl"), _params(GRADES))
    _assert_same(per_row, columnar, min_releases=9, min_letters=4)
    rows = [[r[0], r[1], 1 + r[4], r[3]] for r in _good(seed=1)]
    elements = _csv(tmp_path / "sizes.csv", "stream_id,timestamp,grade,size", rows, bad[2:])
    per_row, columnar = _both(elements, _queries(tmp_path / "queries.jsonl"), _params(GRADES))
    _assert_same(per_row, columnar, min_releases=9, min_letters=3)


def test_parquet_nulls_and_types_equal_the_per_row_path(tmp_path):
    # typed columns with nulls and NaN; a dictionary-encoded (categorical) colour; float32 sizes; integer
    # timestamps (one beyond the range), and a 1-based categorical of integers
    rows = _good(n=64)
    rows[3][0], rows[5][1], rows[9][1], rows[11][2], rows[13][3], rows[15][3], rows[17][4] = \
        None, None, float("nan"), None, None, float("nan"), None
    rows[19][1], rows[21][0], rows[23][2], rows[25][1] = float("inf"), "", "mauve", 1e13
    table = pa.table({"stream_id": [r[0] for r in rows], "timestamp": [r[1] for r in rows],
                      "colour": pa.array([r[2] for r in rows]).dictionary_encode(),
                      "size": pa.array([r[3] for r in rows], pa.float32()), "k": [r[4] for r in rows]})
    pq.write_table(table, tmp_path / "elements.parquet")
    queries = _queries(tmp_path / "queries.jsonl")
    per_row, columnar = _both(str(tmp_path / "elements.parquet"), queries, _params())
    _assert_same(per_row, columnar, min_releases=9, min_letters=12)
    seconds = [int(r[1]) if r[1] == r[1] and abs(r[1]) < 1e12 else 10**12 + 1 for r in _good(n=64)]
    seconds[4], seconds[6] = -3, 10**15
    table = pa.table({"stream_id": [r[0] for r in rows], "timestamp": pa.array(seconds, pa.int64()),
                      "colour": [r[2] for r in _good(n=64)], "size": [r[3] for r in _good(n=64)],
                      "k": pa.array([r[4] for r in _good(n=64)], pa.int8())})
    pq.write_table(table, tmp_path / "ints.parquet")
    per_row, columnar = _both(str(tmp_path / "ints.parquet"), queries, _params())
    _assert_same(per_row, columnar, min_releases=9, min_letters=4)


def test_json_lines_equal_the_per_row_path(tmp_path):
    # rows built one by one: a nested record, a boolean size (a number only while no text shares its
    # block: the per-row path's encoding, kept), a text size, missing fields, a line that is not JSON
    rows = _good()
    lines = [json.dumps(dict(zip(HEADER.split(","), r))) for r in rows]
    lines[4:4] = ["not json", json.dumps({"stream_id": "s1", "timestamp": 3.0, "record": {"colour": "red",
                                                                                          "size": 2.0, "k": 1}}),
                  json.dumps({"stream_id": "s2", "timestamp": 4.0, "colour": "red", "size": True, "k": 1}),
                  json.dumps({"stream_id": "s2", "timestamp": 4.5, "colour": "red", "size": "big", "k": 1}),
                  json.dumps({"stream_id": "s3", "timestamp": "4.0", "colour": "red"}),
                  json.dumps({"stream_id": 7, "timestamp": 4.0, "colour": "red", "size": 1.0, "k": 0})]
    (tmp_path / "elements.jsonl").write_text("\n".join(lines) + "\n")
    per_row, columnar = _both(str(tmp_path / "elements.jsonl"), _queries(tmp_path / "queries.jsonl"), _params())
    _assert_same(per_row, columnar, min_releases=9, min_letters=4)


def _parsed(parse: ParseGrowing, elements: list) -> tuple[dict, list]:
    """The parse stage's outputs of one bundle: per stream, its blocks in order ``(step, micros, index,
    originals)``; and the dead letters, sorted."""
    parse.setup()
    parse.start_bundle()
    outputs = [out for element in elements for out in parse.process(element, MIN_TIMESTAMP, GlobalWindow())]
    outputs += [out.value if isinstance(out, WindowedValue) else out for out in parse.finish_bundle()]
    blocks: dict[str, list] = {}
    letters = []
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            value = out.value.value if isinstance(out.value, WindowedValue) else out.value
            letters.append(json.dumps(value.to_json("x"), sort_keys=True))
        else:
            stream, (_, step, micros, index, originals) = out
            assert isinstance(originals, BlockOriginals)
            blocks.setdefault(stream, []).append((step, micros.tolist(), index.tolist(),
                                                  json.dumps(list(originals.elements()))))
    return blocks, sorted(letters)


@pytest.mark.parametrize("max_rows", [4096, 5])
def test_the_parse_stage_makes_the_same_blocks_in_the_same_order(tmp_path, monkeypatch, max_rows):
    monkeypatch.setattr(ParseGrowing, "MAX_ROWS", max_rows)
    path = _csv(tmp_path / "elements.csv", HEADER, _good(n=90), BAD_CSV)
    read = list(ReadRecordFile(job.elements(UNIVERSE)).process(path))
    block = read[-1]
    assert 0 < len(block.odd) < 8  # the null cells only: the rest is read in columns
    rows = [job.to_element(row, UNIVERSE) for row in ReadRecordFile().process(path)
            if not isinstance(row, beam.pvalue.TaggedOutput)]
    assert repr([block.record(i) for i in range(len(block))]) == repr(rows)  # row i is the per-row element (NaN too)
    params = _params(streams=("s1", "s2", "s3"))
    per_row = _parsed(ParseGrowing(params, "element"), rows)
    checked = []
    parse = ParseGrowing(params, "element")
    element = parse._element

    def spy(record, timestamp, window, *where):
        checked.append(record)
        return element(record, timestamp, window, *where)

    parse._element = spy
    columnar = _parsed(parse, [block])
    assert columnar[0] == per_row[0] and len(per_row[0]["s1"]) >= 1 and len(per_row[1]) >= 15
    assert sorted(_sourceless(columnar[1])) == sorted(_sourceless(per_row[1]))  # columns know each row's record
    assert checked == [block.odd[i] for i in sorted(block.odd)]  # only odd rows take the per-row path


def test_block_originals_of_columns_and_single_elements():
    spec = job.elements(UNIVERSE)
    batch = pa.record_batch({"stream_id": ["s1", "s2", None, "s1"], "timestamp": [1.0, 2.0, 3.0, None],
                             "colour": ["red", "blue", "red", "green"], "size": [0.5, 2.0, 3.0, 4.0],
                             "k": [0, 1, 2, 0]})
    block = spec.columns(batch)
    assert set(block.odd) == {3}
    assert [block.record(i) for i in range(4)] == [spec.record(row) for row in batch.to_pylist()]
    assert isinstance(beam.coders.registry.get_coder(type(block)), BlockCoder)
    originals = BlockOriginals(["e0", block.take(np.array([1, 3])), "e1", block])
    first, second = originals.parts([np.array([0, 2, 3]), np.array([1, 4, 6])])
    assert list(first.elements()) == ["e0", block.record(3), "e1"]
    assert list(second.elements()) == [block.record(1), block.record(0), block.record(2)]
    letters = originals.letters(DeadLetter("stream_ended", "ended", "s1", None))
    assert [letter.element for letter in letters] == ["e0", block.record(1), block.record(3), "e1",
                                                      *block.records()]


def test_a_block_of_other_fields_is_checked_row_by_row():
    # a block whose fields are not the universe's (built for another one): every row takes the per-row path
    spec = job.elements(UNIVERSE)
    block = spec.columns(pa.record_batch({"stream_id": ["s1", "s2"], "timestamp": [1.0, 2.0],
                                          "colour": ["red", "blue"], "size": [0.5, 2.0], "k": [0, 1]}))
    params = _params(GRADES)
    assert _parsed(ParseGrowing(params, "element"), [block]) == \
        _parsed(ParseGrowing(params, "element"), block.records())
