"""One dead-letter shape for every job: ``reason`` from ``beam_dp.steps.events.REASONS``, ``source``
``<file>#record=<n>`` (the n-th record after the header, rejected records counted), the element as
read (a NaN as ``"nan"``, reason ``non_finite``). Each job reads a file written by a real writer
(pyarrow, the csv module with QUOTE_ALL) with a NaN row and a short row among good ones."""

from __future__ import annotations

import json

import numpy as np
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
    assert [(d["stage"], d["reason"], d["source"]) for d in letters if "query_id" in d["element"]] == [
        ("answers", "before_start", f"{queries}#record=1")]  # t = 5 < n = 10


def test_lifelong_dead_letters_name_reason_and_record(tmp_path):
    from pipelines import lifelong

    rows = [["s", str(i % 2), 0.1, 0.2, 0.1 * (i % 9), 1 - i % 2] for i in range(16)]
    rows[5][2] = float("nan")
    src, letters = _record_job(tmp_path, lifelong, ["stream_id", "task_id", "x_0", "x_1", "x_2", "label"], rows,
                               "quote_all", ["--tasks=0,1", "--classes=0,1", "--steps-per-task=1", "--task-size=16",
                                             "--device=cpu", "--torch-threads=1"], '"s","1"')
    assert sorted((d["stage"], d["reason"], d["source"]) for d in letters) == [
        ("models", "non_finite", f"{src}#record=7"), ("read", "malformed", f"{src}#record=4")]
    assert _by_reason(letters)["non_finite"][1] == ["s", "1", ["nan", 0.2, 0.5], 0]


def test_event_time_online_learning_dead_letters_name_reason_and_record(tmp_path):
    from pipelines import online_learning

    rows = [[f"s{i % 2}", 2.0 * i, 0.1, 0.2, 0.3, 0.5] for i in range(12)]
    rows[5][2] = float("nan")  # record 7
    rows[8][1] = 99.0  # record 10: after the schedule's end
    src, letters = _record_job(tmp_path, online_learning, ["stream_id", "timestamp", *LABELLED[1:]], rows, "pyarrow",
                               ["--learner=regression", "--start=0", "--period=10", "--end=40", "--epsilon=1.0",
                                "--delta=1e-6"], '"s1","0.1"')
    assert sorted((d["stage"], d["reason"], d["source"]) for d in letters) == [
        ("models", "after_end", f"{src}#record=10"), ("models", "non_finite", f"{src}#record=7"),
        ("read", "malformed", f"{src}#record=4")]


# -- family-stage letters of records read one by one: each names its file and record --------------------------
def _one_by_one(path: str, record) -> list:
    """The file's rows as the reader sends rows that no columns describe: per Arrow batch, one
    ``RecordColumns`` of the job's per-row elements (``record(row)``) with their record numbers."""
    from beam_dp.beam.shell.blocks import RecordColumns
    from beam_dp.io.tables import read_csv_rows

    with open(path, "rb") as fh:
        read = read_csv_rows(fh)
    blocks, at = [], 0
    for batch in read.batches:
        blocks.append(RecordColumns(tuple(map(record, batch.to_pylist())), path, read.records[at:at + batch.num_rows]))
        at += batch.num_rows
    return blocks


def _family_letters(build) -> list[dict]:
    """The dead letters of ``build(pipeline) -> ContinualOutputs`` as JSON objects (stage ``family``)."""
    import apache_beam as beam

    from tests.beam.collect import run

    letters = [json.loads(text) for text in run(lambda p: build(p).dead_letter | beam.Map(
        lambda d: json.dumps(d.to_json("family"))))]
    assert letters and all(d["reason"] in REASONS for d in letters), letters
    return letters


def _record_of(letters: list[dict], src: str) -> dict[str, list[int]]:
    """Each reason's record numbers (every letter must name ``src#record=n``)."""
    out: dict[str, list[int]] = {}
    for d in letters:
        assert d["source"] and d["source"].startswith(f"{src}#record="), d
        out.setdefault(d["reason"], []).append(int(d["source"].rpartition("=")[2]))
    return {reason: sorted(records) for reason, records in out.items()}


def test_lifelong_rows_read_one_by_one_dead_letter_with_their_record_here_and_in_the_keyed_stage(tmp_path):
    """Parse-stage letters (unknown task, NaN, bad label) and the keyed stage's (a row after its task's
    marker: ``task_backwards``) name the row's record; the marker's own letter too."""
    pytest.importorskip("torch")
    import apache_beam as beam

    from beam_dp.beam import LifelongLearner, LifelongParams
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig
    from pipelines.lifelong import to_task_row

    header = ["stream_id", "task_id", "x_0", "x_1", "end_of_task", "label"]
    rows = [["s", "0", 0.25, -0.5, False, i % 2] for i in range(8)]
    rows[2][1] = "9"  # record 3: unknown task
    rows[4][3] = float("nan")  # record 5
    rows[6][5] = 7  # record 7: a label outside the classes
    rows += [["s", "0", 0.0, 0.0, True, 0], ["s", "0", 0.5, 0.5, False, 1],  # records 9, 10: task 0 closed first
             ["s", "1", 0.5, 0.5, False, 0], ["s", "1", 0.0, 0.0, True, 0], ["s", "0", 0.0, 0.0, True, 0]]
    src = write_csv(tmp_path / "tasks.csv", header, rows, "pyarrow")
    config = BoundedAGEMConfig(input_dim=2, n_classes=2, hidden=4, g_layers=(4,), batch_size=4, epochs=1,
                               task_ids=("0", "1"), device="cpu", epsilon=1.0, delta=1e-5, task_size=8)
    params = LifelongParams(config, streams=("s",), allow_cuda=False, torch_threads=1)
    blocks = _one_by_one(src, lambda row: to_task_row(row, 2, ("0", "1")))
    letters = _family_letters(lambda p: p | beam.Create(blocks) | LifelongLearner(params))
    assert _record_of(letters, src) == {"unknown_task": [3], "non_finite": [5], "bad_label": [7],
                                        "task_backwards": [10, 13]}
    assert {d["stream"] for d in letters} == {"s"}
    assert next(d for d in letters if d["reason"] == "non_finite")["element"] == ["s", "0", [0.25, "nan"], 0]


def test_event_time_records_read_one_by_one_dead_letter_with_their_record_in_parse_and_release_stages(tmp_path):
    """Event-time records: the parse stage's letters and a late record's (the release stage, a step its
    watermark closed) name the record."""
    import apache_beam as beam
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    from beam_dp.beam import IncrementalRegression, IncrementalRegressionParams
    from beam_dp.core import StepClock
    from pipelines.online_learning import to_record
    from tests.beam.helpers import streaming_options

    header = ["stream_id", "timestamp", "x_0", "x_1", "label"]
    rows = [["u", 1.0 + i, 0.25, -0.25, 0.5] for i in range(6)] + [["u", 2.0, 0.1, 0.1, 0.5]]  # record 7: late
    rows[1][2] = float("nan")  # record 2
    rows[3][1] = 99.0  # record 4: after the schedule's end
    src = write_csv(tmp_path / "r.csv", header, rows, "quote_all")
    params = IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6, clock=StepClock(0.0, 10.0, end=40.0),
                                         constraint={"kind": "l2_ball", "radius": 1.0})
    (block,) = _one_by_one(src, lambda row: to_record(row, 2, True))
    on_time, late = block.take(np.arange(6)), block.take([6])
    stream = (TestStream().add_elements([TimestampedValue(on_time, 1.0)]).advance_watermark_to(15.0)
              .add_elements([TimestampedValue(late, 2.0)]).advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        letters = p | stream | IncrementalRegression(params)
        found = letters.dead_letter | beam.Map(lambda d: (d.reason, d.source))
        from apache_beam.testing.util import assert_that, equal_to

        assert_that(found, equal_to([("non_finite", f"{src}#record=2"), ("after_end", f"{src}#record=4"),
                                     ("late", f"{src}#record=7")]))


def test_growing_db_queries_and_elements_read_one_by_one_dead_letter_with_their_record(tmp_path):
    """A query refused by the parse stage and elements refused there or by the block check (outside the
    universe, after the schedule) name their record."""
    import apache_beam as beam

    from beam_dp.beam import GrowingDatabaseParams, GrowingDatabaseQueries
    from beam_dp.core import StepClock
    from pipelines.growing_db_queries import parse_universe, to_element, to_query

    universe = parse_universe('{"colour": ["red", "green"]}')
    queries = write_csv(tmp_path / "q.csv", ["stream_id", "query_id", "t", "predicate", "weights"],
                        [["s", "q1", 1, "", "[0, 1]"], ["s", "q2", 4, "", "[0, 1, 1]"], ["s", "q3", 2, "", "[1, 0]"]],
                        "pyarrow")  # q1: t < n (before_start), q2: three weights for two records
    elements = write_csv(tmp_path / "e.csv", ["stream_id", "timestamp", "colour"],
                         [["s", 1.0, "red"], ["s", 2.0, "blue"], ["s", 3.0, "green"], ["s", 95.0, "red"],
                          ["", 4.0, "red"]], "quote_all")
    params = GrowingDatabaseParams(universe=universe, n=2, epsilon=1.0, clock=StepClock(0.0, 10.0, end=50.0),
                                   streams=("s",))

    def build(p):
        return {"elements": p | "E" >> beam.Create(_one_by_one(elements, lambda r: to_element(r, universe))),
                "queries": p | "Q" >> beam.Create(_one_by_one(queries, lambda r: to_query(r, universe.size)))
                } | GrowingDatabaseQueries(params)

    letters = _family_letters(build)
    assert _record_of([d for d in letters if "query_id" in d["element"]], queries) == {
        "before_start": [1], "wrong_shape": [2]}
    assert _record_of([d for d in letters if "query_id" not in d["element"]], elements) == {
        "outside_universe": [2], "after_end": [4], "bad_stream_id": [5]}


def test_labelled_examples_read_one_by_one_dead_letter_with_their_record(tmp_path):
    import apache_beam as beam

    from beam_dp.beam import ContinualModelParams, ContinualModelRelease
    from pipelines.model_release import to_example

    rows = [[f"s{i % 2}", 0.1, 0.2, 0.3, "ab"[i % 2]] for i in range(12)]
    rows[5][1] = float("nan")  # record 6
    rows[8][4] = "c"  # record 9: not a declared class
    src = write_csv(tmp_path / "in.csv", LABELLED, rows, "pyarrow")
    params = ContinualModelParams(n_features=3, classes=("a", "b"), epsilon=1.0, clip_bound=2.0, update=2, base=4)
    blocks = _one_by_one(src, lambda row: to_example(row, 3, True))
    letters = _family_letters(lambda p: p | beam.Create(blocks) | ContinualModelRelease(params))
    assert _record_of(letters, src) == {"non_finite": [6], "bad_label": [9]}


def test_a_blocks_records_read_one_by_one_leave_as_one_item_and_a_whole_block_letter_names_each_record():
    from beam_dp.beam.shell.blocks import BundleBlocks, RecordColumns, by_record
    from beam_dp.steps.events import DeadLetter

    block = RecordColumns((("s", 1), ("s", 2), ("t", 3), ("s", 4)), "in.csv", np.array([2, 3, 5, 6]))
    made: list = []
    blocks = BundleBlocks(lambda key, rows, originals: made.append((key, rows, originals)) or [], max_rows=8)
    list(by_record(block, lambda row, original: blocks.add(row[0], row[1], original, None, None)))
    list(blocks.flush())
    (_, s_rows, s_originals), (_, t_rows, t_originals) = sorted(made, key=lambda m: m[0])
    assert s_rows == [1, 2, 4] and t_rows == [3]
    assert len(s_originals) == 1 and s_originals[0].rows.tolist() == [2, 3, 6]  # one item for the run of one file
    letters = s_originals.letters(DeadLetter("late", "step 1 was already absorbed", "s", None))
    assert [(d.element, d.source) for d in letters] == [(("s", 1), "in.csv#record=2"), (("s", 2), "in.csv#record=3"),
                                                        (("s", 4), "in.csv#record=6")]
