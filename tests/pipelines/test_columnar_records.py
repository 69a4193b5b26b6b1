"""Labelled records read in columns (``LabelledColumns``) give the releases and dead letters of the per-row path.

Each case writes one input with good rows of several streams and bad ones (a NaN feature, a missing
cell, a non-numeric cell, a wrong label, an empty stream id, an undeclared stream, a wrong column
count), then runs the job's transform twice in this process on it: once on the per-row elements
(``ReadRecords`` rows mapped by the job's ``to_example`` / ``to_record``: the path before columns and
the one messages take) and once on the job's columnar blocks (``labelled(...)``). The releases must
be equal value for value and the dead letters equal in reason, detail, stream and element.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.beam import (
    ContinualModelParams,
    ContinualModelRelease,
    IncrementalRegression,
    IncrementalRegressionParams,
    OnlineLearner,
    OnlineLearnerParams,
)
from beam_dp.beam.shell.blocks import BlockOriginals
from beam_dp.io.coders import BlockCoder
from beam_dp.steps.events import DeadLetter
from pipelines import model_release, online_learning
from pipelines.records import ReadRecords, labelled_columns
from tests.beam.collect import run

pytestmark = pytest.mark.pipeline

FILES = SimpleNamespace(source="files")


def _rows(labels, n=40, dim=3, streams=("s1", "s2", "s3"), seed=0) -> list[list]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)) * 0.6
    return [[streams[i % len(streams)], *map(float, x[i]), labels[i % len(labels)]] for i in range(n)]


def _csv(path, rows: list[list], bad: list[str], dim=3) -> str:
    lines = ["stream_id," + ",".join(f"x_{j}" for j in range(dim)) + ",label"]
    lines += [",".join(repr(v) if isinstance(v, float) else str(v) for v in row) for row in rows]
    lines[5:5] = bad[: len(bad) // 2]  # bad rows among the good ones, and at the end
    path.write_text("\n".join(lines + bad[len(bad) // 2:]) + "\n")
    return str(path)


def _both(pattern: str, spec, to_element, transform) -> tuple[list, list]:
    """(releases, dead letters) of the per-row path and of the columnar path, each sorted."""
    results = []
    for columnar in (False, True):
        def build(p):
            if columnar:
                elements, read_bad = p | ReadRecords(FILES, pattern, columns=spec)
            else:
                rows, read_bad = p | ReadRecords(FILES, pattern)
                elements = rows | beam.Map(to_element)
            out = elements | type(transform).__name__ >> transform
            letters = ((read_bad, out.dead_letter) | "Letters" >> beam.Flatten()
                       | beam.Map(lambda d: ("d", json.dumps(d.to_json("x"), sort_keys=True))))
            return (out.releases | beam.Map(lambda r: ("r", r)), letters) | beam.Flatten()
        items = run(build)
        releases = sorted((v for k, v in items if k == "r"), key=lambda r: (r.stream, r.step))
        results.append((releases, sorted(v for k, v in items if k == "d")))
    return results[0], results[1]


def _sourceless(letters: list[str]) -> list[str]:
    return [json.dumps({**json.loads(d), "source": None}, sort_keys=True) for d in letters]


def _assert_same(per_row, columnar, min_releases: int, min_letters: int) -> None:
    (rel_a, dead_a), (rel_b, dead_b) = per_row, columnar
    assert len(rel_a) >= min_releases and len(dead_a) >= min_letters
    # equal but for the source: the columnar path knows each row's record (file#record=n), the per-row
    # path (messages) only the reader's own letters' records
    columnar = [json.loads(d) for d in dead_b]
    unsourced = [d for d in columnar if not (d["source"] or "").count("#record=")
                 and not (isinstance(d["element"], dict) and "query_id" in d["element"])]  # queries: read per row
    assert not unsourced, unsourced
    assert sorted(_sourceless(dead_b)) == sorted(_sourceless(dead_a))
    assert [(r.stream, r.step, r.meta) for r in rel_b] == [(r.stream, r.step, r.meta) for r in rel_a]
    for a, b in zip(rel_a, rel_b):
        np.testing.assert_array_equal(np.asarray(b.value), np.asarray(a.value))


BAD_ERM = ["s1,0.1,0.2", "s2,nan,0.0,0.0,a", "s1,0.1,,0.3,b", ",0.1,0.2,0.3,a", "s4,0.1,0.2,0.3,c",
           "s1,0.1,0.2,0.3,z", "s2,abc,0.0,0.0,b", "s3,inf,0.1,0.1,c", "s1,0.1,0.2,0.3,"]


@pytest.mark.parametrize("declared", [None, ("s1", "s2", "s3")])
def test_model_release_columns_equal_the_per_row_path(tmp_path, declared):
    pattern = _csv(tmp_path / "train.csv", _rows(["a", "b", "c"]), BAD_ERM)
    params = ContinualModelParams(n_features=3, classes=("a", "b", "c"), epsilon=1.0, update=4, base=8,
                                  streams=declared)
    per_row, columnar = _both(pattern, model_release.labelled(params),
                              model_release.labelled(params).record, ContinualModelRelease(params))
    _assert_same(per_row, columnar, min_releases=6, min_letters=len(BAD_ERM) - (declared is None))


def test_model_release_numeric_labels_and_huber_equal_the_per_row_path(tmp_path):
    # integer class labels (an int column: "3" and 3 are one class) and a text cell in the label column
    pattern = _csv(tmp_path / "ints.csv", _rows([0, 1, 2]), ["s1,0.1,0.2,0.3,7", "s2,0.5,nan,0.1,1"])
    params = ContinualModelParams(n_features=3, classes=("0", "1", "2"), epsilon=1.0, update=4, base=8)
    per_row, columnar = _both(pattern, model_release.labelled(params), model_release.labelled(params).record,
                              ContinualModelRelease(params))
    _assert_same(per_row, columnar, min_releases=6, min_letters=2)
    rows = _rows([0.5, -0.25, 1.5])
    pattern = _csv(tmp_path / "huber.csv", rows, ["s1,0.1,0.2,0.3,nan", "s2,0.1,0.2,0.3,x", "s3,0.1,0.2,0.3,"])
    params = ContinualModelParams(n_features=3, epsilon=1.0, update=4, base=8)
    per_row, columnar = _both(pattern, model_release.labelled(params), model_release.labelled(params).record,
                              ContinualModelRelease(params))
    _assert_same(per_row, columnar, min_releases=6, min_letters=3)


BAD_ONLINE = ["s1,0.1,0.2", "s2,nan,0.0,0.0,1", "s1,0.1,,0.3,-1", ",0.1,0.2,0.3,1", "s4,0.1,0.2,0.3,1",
              "s1,0.1,0.2,0.3,0.5", "s2,abc,0.0,0.0,1", "s3,0.1,0.1,0.1,", "s3,3.0,4.0,0.0,-1"]


@pytest.mark.parametrize("declared", [None, ("s1", "s2", "s3")])
def test_online_learner_columns_equal_the_per_row_path(tmp_path, declared):
    # a logistic label 0.5 is refused (bad_value); a feature row of norm 5 is clipped, not refused
    pattern = _csv(tmp_path / "records.csv", _rows([1.0, -1.0]), BAD_ONLINE)
    params = OnlineLearnerParams(dim=3, constraint={"kind": "l2_ball", "radius": 1.0}, epsilon=1.0, window=4,
                                 streams=declared)
    spec = online_learning.labelled(3)
    per_row, columnar = _both(pattern, spec, spec.record, OnlineLearner(params))
    _assert_same(per_row, columnar, min_releases=39, min_letters=7)


def test_incremental_regression_parquet_columns_equal_the_per_row_path(tmp_path):
    # a Parquet file: typed columns with nulls (a missing feature, a missing label), a NaN label
    rows = _rows([0.5, -0.5, 0.25], n=48)
    rows[7][2], rows[11][4], rows[13][4], rows[17][0] = None, None, float("nan"), ""
    table = pa.table({"stream_id": [r[0] for r in rows], **{f"x_{j}": [r[1 + j] for r in rows] for j in range(3)},
                      "label": [r[4] for r in rows]})
    pq.write_table(table, tmp_path / "records.parquet")
    params = IncrementalRegressionParams(dim=3, epsilon=1.0, delta=1e-6, block_size=4)
    spec = online_learning.labelled(3)
    per_row, columnar = _both(str(tmp_path / "records.parquet"), spec, spec.record, IncrementalRegression(params))
    _assert_same(per_row, columnar, min_releases=9, min_letters=4)


def test_a_block_row_is_the_per_row_record_and_its_originals_stay_columns_until_a_letter():
    batch = pa.record_batch({"stream_id": ["s1", None, "s2"], "x_0": [0.5, 1.0, None], "x_1": [1, 2, 3],
                             "label": ["a", "b", None]})
    params = ContinualModelParams(n_features=2, classes=("a", "b"), epsilon=1.0, update=4, base=8)
    spec = model_release.labelled(params)
    block = labelled_columns(batch, spec)
    assert [block.record(i) for i in range(3)] == [spec.record(row) for row in batch.to_pylist()]
    assert set(block.odd) == {2} and block.features.dtype == np.float64
    originals = BlockOriginals(["e0", block.take(np.array([2, 0]))])
    letters = originals.letters(DeadLetter("stream_ended", "ended", "s1", None))
    assert [letter.element for letter in letters] == ["e0", spec.record(batch.to_pylist()[2]),
                                                      spec.record(batch.to_pylist()[0])]
    assert isinstance(beam.coders.registry.get_coder(type(block)), BlockCoder)  # sized, not pickled, by Beam
    encoded = pa.record_batch({name: column.dictionary_encode() if name != "x_0" else column
                               for name, column in zip(batch.schema.names, batch.columns)})
    block = labelled_columns(encoded, spec)  # dictionary-encoded (Parquet categorical) columns read as their values
    assert [block.record(i) for i in range(3)] == [spec.record(row) for row in batch.to_pylist()]
    assert set(block.odd) == {2}


def test_json_lines_and_a_features_list_column_equal_the_per_row_path(tmp_path):
    # JSON-lines rows are built one by one (a block of odd rows); a Parquet ``features`` list column wins
    # over x_0.. where it is set, as in the per-row path
    params = ContinualModelParams(n_features=3, classes=("a", "b", "c"), epsilon=1.0, update=4, base=8)
    spec = model_release.labelled(params)
    rows = _rows(["a", "b", "c"])
    lines = [json.dumps({"stream_id": r[0], "x_0": r[1], "x_1": r[2], "x_2": r[3], "label": r[4]}) for r in rows]
    lines[3:3] = ["not json", json.dumps({"stream_id": "s1", "features": [0.1, None, 0.2], "label": "a"})]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    _assert_same(*_both(str(tmp_path / "train.jsonl"), spec, spec.record, ContinualModelRelease(params)),
                 min_releases=6, min_letters=2)
    features = [None] * len(rows)
    features[2], features[9], features[11] = [0.5, 0.5, 0.5], [0.5, float("nan"), 0.5], [1.0, 2.0]
    table = pa.table({"stream_id": [r[0] for r in rows], **{f"x_{j}": [r[1 + j] for r in rows] for j in range(3)},
                      "features": pa.array(features, pa.list_(pa.float64())), "label": [r[4] for r in rows]})
    pq.write_table(table, tmp_path / "train.parquet")
    _assert_same(*_both(str(tmp_path / "train.parquet"), spec, spec.record, ContinualModelRelease(params)),
                 min_releases=6, min_letters=2)


@pytest.mark.parametrize("family", ["erm", "online"])
def test_only_odd_and_refused_rows_take_the_per_record_check(family):
    from beam_dp.beam.erm import ParseLabelledExamples
    from beam_dp.beam.online import ParseRecords
    from beam_dp.beam.shell.blocks import column_rows

    rng = np.random.default_rng(1)
    n = 200
    labels = ["a", "b"] * (n // 2) if family == "erm" else [1.0, -1.0] * (n // 2)
    x = rng.normal(size=(n, 3))
    x[17, 1] = np.nan  # refused by the vectorised check
    cells = {"stream_id": [f"s{i % 3}" for i in range(n)], **{f"x_{j}": list(x[:, j]) for j in range(3)},
             "label": labels}
    cells["x_2"][40] = None  # odd
    if family == "erm":
        params = ContinualModelParams(n_features=3, classes=("a", "b"), epsilon=1.0, update=4, base=8)
        parse, spec = ParseLabelledExamples(params), model_release.labelled(params)
    else:
        params = OnlineLearnerParams(dim=3, constraint={"kind": "l2_ball", "radius": 1.0}, epsilon=1.0, window=4)
        parse, spec = ParseRecords(params), online_learning.labelled(3)
    parse.setup()
    block = labelled_columns(pa.record_batch(cells), spec)
    checked = []

    def check(element):
        checked.append(element)
        return parse._check(element)

    found = column_rows(block, None, check, parse._vector)
    # the learners bisect around a refused row: at most BISECT_ROWS rows about it are checked one by one
    assert {str(block.record(17)), str(block.record(40))} <= set(map(str, checked))
    assert len(checked) <= 2 + (0 if family == "erm" else ParseRecords.BISECT_ROWS)
    assert [letter.reason for letter in found.letters] == ["non_finite", "bad_value"]
    per_record = [parse._check(block.record(i)) for i in range(n)]
    for stream, rows, xs, ys in found.chunks:  # the vectorised values are the per-record ones, in order
        assert all(per_record[i][0] == stream for i in rows.tolist())
        np.testing.assert_array_equal(xs, np.stack([per_record[i][1][0] for i in rows.tolist()]))
        np.testing.assert_array_equal(ys, np.array([per_record[i][1][1] for i in rows.tolist()]))
    assert sum(len(rows) for _, rows, _, _ in found.chunks) == n - 2
