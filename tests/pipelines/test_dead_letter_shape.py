"""One dead-letter shape for every job: ``reason`` from ``beam_dp.steps.events.REASONS``, ``source``
``<file>#record=<n>`` (the n-th record after the header, rejected records counted), the element as
read (a NaN as ``"nan"``, reason ``non_finite``). Each job reads a file written by a real writer
(pyarrow, the csv module with QUOTE_ALL) with a NaN row and a short row among good ones."""

from __future__ import annotations

import json

import pytest

from beam_dp.steps.events import REASONS, Reason
from tests.io.test_csv_writers import write_csv

pytestmark = pytest.mark.pipeline


def _letters(out) -> list[dict]:
    private = out.with_name(out.name + ".private")
    letters = [json.loads(line) for f in private.glob("dead_letter-*") for line in f.read_text().splitlines() if line]
    assert all(set(d) == {"stage", "reason", "detail", "stream", "source", "element"} for d in letters), letters
    assert all(d["reason"] in REASONS for d in letters), letters
    return letters


def _with_short_row(path: str, after: int, line: str) -> None:
    """Put ``line`` (one field short) in the file after its ``after``-th data record."""
    with open(path, newline="") as fh:
        lines = fh.read().splitlines(keepends=True)
    lines.insert(after + 1, line + "\r\n")
    with open(path, "w", newline="") as fh:
        fh.write("".join(lines))


def _by_reason(letters: list[dict]) -> dict[str, tuple]:
    return {d["reason"]: (d["source"], d["element"]) for d in letters}


def test_the_reasons_are_one_tuple_of_distinct_strings_holding_every_familys_reasons():
    from beam_dp.beam import erm, growing_db, lifelong
    from beam_dp.steps.batch import ROW_REASONS
    from beam_dp.steps.coder import UNREADABLE_STATE
    from beam_dp.steps.policies import TaskPolicy

    assert len(set(REASONS)) == len(REASONS) and all(isinstance(r, str) and r for r in REASONS)
    family = {erm.BAD_LABEL, lifelong.UNKNOWN_TASK, lifelong.BAD_LABEL, TaskPolicy.TASK_BACKWARDS, UNREADABLE_STATE,
              *(v for k, v in vars(growing_db.GrowingReason).items() if k.isupper()), *ROW_REASONS[1:]}
    assert family <= set(REASONS), family - set(REASONS)
    assert {Reason.NON_FINITE, Reason.LINE_TOO_LONG, Reason.MALFORMED} <= set(REASONS)


def test_continual_stats_numbers_records_past_unparsable_ones(tmp_path):
    """Record numbers do not drift after rows the parser or the number check rejected."""
    from pipelines import continual_stats

    rows = [["a", 1, "0.5"], ["a", 2, "abc"], ["b", 3, "0.25"], ["a", 4, "nan"], ["b", 5, "0.125"]]
    src = write_csv(tmp_path / "e.csv", ["stream_id", "timestamp", "value"], rows, "quote_all")
    _with_short_row(src, 1, '"a","9"')  # record 2
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={src}", f"--output={out}", "--start=0", "--period=10", "--end=40"]) == 0
    letters = _letters(out)
    assert sorted((d["reason"], d["source"]) for d in letters) == [
        ("malformed", f"{src}#record=2"), ("malformed", f"{src}#record=3"), ("non_finite", f"{src}#record=5")]
    elements = {d["source"]: d["element"] for d in letters}
    assert elements[f"{src}#record=2"] == '"a","9"'  # the line as written
    assert elements[f"{src}#record=3"] == {"stream_id": "a", "timestamp": 2, "value": "abc"}
    assert elements[f"{src}#record=5"] == ["a", 4.0, ["nan"]]


def _record_job(tmp_path, job, header, rows, how, argv, short: str) -> tuple[str, list[dict]]:
    src = write_csv(tmp_path / "in.csv", header, rows, how)
    _with_short_row(src, 3, short)  # record 4
    out = tmp_path / "out"
    assert job.main([f"--input={src}", f"--output={out}", *argv]) == 0
    assert list(out.glob("*-*")), "nothing published"
    return src, _letters(out)


LABELLED = ["stream_id", "x_0", "x_1", "x_2", "label"]


def test_model_release_dead_letters_name_reason_and_record(tmp_path):
    from pipelines import model_release

    rows = [[f"s{i % 2}", 0.1, 0.2, 0.3, "ab"[i % 2]] for i in range(12)]
    rows[5][1] = float("nan")  # record 7 (after the short row at 4)
    src, letters = _record_job(tmp_path, model_release, LABELLED, rows, "pyarrow",
                               ["--algorithm=continual", "--classes=a,b", "--epsilon=1.0", "--clip-bound=2.0",
                                "--update-size=2", "--base-size=4"], '"s1","0.1"')
    assert sorted((d["stage"], d["reason"], d["source"]) for d in letters) == [
        ("models", "non_finite", f"{src}#record=7"), ("read", "malformed", f"{src}#record=4")]
    assert _by_reason(letters)["non_finite"][1] == ["s1", ["nan", 0.2, 0.3], "b"]


def test_online_learning_writes_nan_as_the_other_jobs_do(tmp_path):
    from pipelines import online_learning

    rows = [[f"s{i % 2}", 0.1, 0.2, 0.3, 1.0] for i in range(12)]
    rows[5][1] = float("nan")
    src, letters = _record_job(tmp_path, online_learning, LABELLED, rows, "quote_all",
                               ["--algorithm=cocol", "--constraint=l1_ball", "--window=8", "--mu=0.5",
                                "--epsilon=1.0"], '"s1","0.1"')
    assert sorted((d["stage"], d["reason"], d["source"]) for d in letters) == [
        ("models", "non_finite", f"{src}#record=7"), ("read", "malformed", f"{src}#record=4")]
    assert _by_reason(letters)["non_finite"][1] == ["s1", ["nan", 0.2, 0.3], 1.0]


def test_growing_db_queries_dead_letters_name_reason_and_record(tmp_path):
    from pipelines import growing_db_queries

    rows = [[f"s{i % 2}", 2.0 * i, "red", 0.5 + i % 9] for i in range(20)]
    rows[5][3] = float("nan")  # a size outside every bucket
    queries = write_csv(tmp_path / "q.csv", ["stream_id", "query_id", "t", "predicate", "weights"],
                        [["s1", "q1", 5, "", "[0, 4, 8]"]], "pyarrow")
    src, letters = _record_job(
        tmp_path, growing_db_queries, ["stream_id", "timestamp", "colour", "size"], rows, "pyarrow",
        [f"--queries={queries}", '--universe={"colour": ["red", "green"], "size": {"edges": [0, 1, 5, 10]}}',
         "--n=10", "--epsilon=1.0", "--delta=1e-6", "--mechanism=bbimprover", "--start=0", "--period=10",
         "--end=50"], '"s1","0.2"')
    elements = sorted((d["stage"], d["reason"], d["source"]) for d in letters if "query_id" not in d["element"])
    assert elements == [("answers", "outside_universe", f"{src}#record=7"), ("read", "malformed", f"{src}#record=4")]


def test_lifelong_dead_letters_name_reason_and_record(tmp_path):
    from pipelines import lifelong

    rows = [["s", str(i % 2), 0.1, 0.2, 0.1 * (i % 9), 1 - i % 2] for i in range(16)]
    rows[5][2] = float("nan")
    src, letters = _record_job(tmp_path, lifelong, ["stream_id", "task_id", "x_0", "x_1", "x_2", "label"], rows,
                               "quote_all", ["--tasks=0,1", "--classes=0,1", "--steps-per-task=1", "--task-size=16",
                                             "--device=cpu", "--torch-threads=1"], '"s","1"')
    # rows read one by one (not in columns): the reader's own letters know their record, the
    # learner's parse stage gets the row without it
    assert sorted((d["stage"], d["reason"]) for d in letters) == [("models", "non_finite"), ("read", "malformed")]
    assert _by_reason(letters)["malformed"][0] == f"{src}#record=4"
    assert _by_reason(letters)["non_finite"][1] == ["s", "1", ["nan", 0.2, 0.5], 0]
