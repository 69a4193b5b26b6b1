"""online_learning and lifelong with --privacy-unit-column / --max-unit-records: bounded per unit, calibrated at
the record-level budget of the unit's, declared in every row and in the manifest, one-line usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_dp.core.group_privacy import record_budget, unit_spend
from beam_dp.io import read_releases
from beam_dp.io.manifest import read_manifest
from pipelines import lifelong, online_learning
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters

pytestmark = pytest.mark.pipeline


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key.hex"
    path.write_text(TEST_KEY.hex())
    return str(path)


def _online_csv(path, users: list, dim: int = 3) -> None:
    rng = np.random.default_rng(3)
    lines = ["stream_id," + ",".join(f"x_{i}" for i in range(dim)) + ",label,user"]
    lines += [f"s,{','.join(repr(float(v)) for v in rng.uniform(-1, 1, dim) / 2)},{1 - 2 * (i % 2)}.0,{user}"
              for i, user in enumerate(users)]
    path.write_text("\n".join(lines) + "\n")


def _declares_the_unit(rows, out, k: int, composition: str) -> None:
    for row in rows:
        assert (row["meta"]["privacy_unit"], row["meta"]["max_records"]) == ("user", k)
        # the job's spend is the unit's (one share alone: its epsilon; delta reported at the job's)
        spent = unit_spend(composition, row["epsilon_spent"], row["delta_spent"], k) if row["epsilon_spent"] > 0 else (
            0.0, 0.0)
        assert row["job_epsilon_spent"] == pytest.approx(spent[0], rel=1e-9)
        assert spent[1] <= row["job_delta_spent"] * (1 + 1e-12) <= row["job_delta_budget"] * (1 + 1e-12)
        assert row["job_epsilon_spent"] <= row["job_epsilon_budget"] * (1 + 1e-12)
    (transform,) = read_manifest(str(out)).transforms
    assert transform.privacy_unit == "user"
    _verifies_only_as_declared(out, k)


def _verifies_only_as_declared(out, k: int) -> None:
    """``python -m beam_dp.verify`` passes the job's folder, and fails its rows with ``max_records`` lowered or
    removed (with the manifest, which names the unit)."""
    import pyarrow.parquet as pq

    from beam_dp.verify import main as verify
    from beam_dp.verify import verify_job

    assert verify([str(out)]) == 0
    rows = [row for path in sorted(out.glob("models-*")) for row in pq.read_table(path).to_pylist()]
    manifest = read_manifest(str(out))
    for change in ({"max_records": k - 1} if k > 1 else {"max_records": None}, {"max_records": None}):
        tampered = [dict(r, meta=json.dumps({key: v for key, v in {**json.loads(r["meta"]), **change}.items()
                                             if v is not None})) for r in rows]
        assert not verify_job(tampered, manifest=manifest).ok, change


def test_online_job_keeps_k_records_per_unit_and_declares_the_unit(tmp_path, key_file, capsys):
    _online_csv(tmp_path / "r.csv", ["ann"] * 6 + ["bob"] * 2 + ["", "cat"])
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={out}", "--window=8", "--epsilon=1.0",
            f"--noise-key-file={key_file}", "--privacy-unit-column=user", "--max-unit-records=3"]
    assert online_learning.main(argv) == 0
    rows = read_releases(str(out / "models-*"))
    assert [r["step"] for r in rows] == list(range(1, 7))  # one release per kept record: ann 3, bob 2, cat 1
    assert all(r["epsilon_budget"] == pytest.approx(1.0 / 3) for r in rows)  # pure: the record budget is epsilon/k
    _declares_the_unit(rows, out, 3, "pure")
    assert dead_letters(out) == {"models:bad_unit_id": 1}
    assert "ann" not in "".join(p.read_text() for p in out.parent.glob("out.private/dead_letter-*"))


def test_numeric_unit_ids_are_ids(tmp_path, key_file):
    # the reader infers a column of integers: each is read as its decimal text, not refused
    _online_csv(tmp_path / "r.csv", [7] * 5 + [12])
    out = tmp_path / "out"
    assert online_learning.main([f"--input={tmp_path / 'r.csv'}", f"--output={out}", "--window=8",
                                 f"--noise-key-file={key_file}", "--privacy-unit-column=user",
                                 "--max-unit-records=3"]) == 0
    assert len(read_releases(str(out / "models-*"))) == 3 + 1
    assert dead_letters(out) == {}


def test_regression_job_calibrates_at_the_approx_record_budget(tmp_path, key_file):
    _online_csv(tmp_path / "r.csv", ["ann"] * 5 + ["bob"] * 3)
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={out}", "--learner=regression", "--block-size=2",
            "--epsilon=1.0", "--delta=1e-6", f"--noise-key-file={key_file}", "--privacy-unit-column=user",
            "--max-unit-records=2"]
    assert online_learning.main(argv) == 0
    rows = read_releases(str(out / "models-*"))
    assert [r["step"] for r in rows] == [1, 2]  # ann 2 + bob 2 records kept: two steps of 2
    epsilon, delta = record_budget("approx", 1.0, 1e-6, 2)
    assert all((r["epsilon_budget"], r["delta_budget"]) == pytest.approx((epsilon, delta)) for r in rows)
    _declares_the_unit(rows, out, 2, "approx")


def test_lifelong_job_bounds_training_rows_per_unit(tmp_path, key_file):
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    lines = ["stream_id,task_id,x_0,x_1,x_2,x_3,label,user"]
    lines += [f"s,{task},{','.join(f'{v:.4f}' for v in rng.uniform(-1, 1, 4))},{i % 2},{user}"
              for task, users in (("0", ["ann"] * 5 + ["bob"]), ("1", ["cat", "ann"])) for i, user in enumerate(users)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 't.csv'}", f"--output={out}", "--tasks=0,1", "--classes=0,1", "--learner=l2dp",
            "--steps-per-task=2", "--hidden=4", "--g-layers=4", "--batch-size=2", "--device=cpu", "--torch-threads=1",
            f"--noise-key-file={key_file}", "--privacy-unit-column=user", "--max-unit-records=2"]
    assert lifelong.main(argv) == 0
    rows = read_releases(str(out / "models-*"))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["epsilon_budget"] == pytest.approx(0.5) for r in rows)  # L2DP-ML's claim is pure: epsilon/k
    _declares_the_unit(rows, out, 2, "approx")
    assert all(json.loads(json.dumps(r["meta"]))["guarantee_basis"].startswith("paper_claim") for r in rows)


@pytest.mark.parametrize("extra, fix", [
    (["--max-unit-records=2"], "give --privacy-unit-column"),
    (["--privacy-unit-column=user"], "needs --max-unit-records"),
    (["--privacy-unit-column=owner", "--max-unit-records=2"], "no column 'owner'"),
    (["--privacy-unit-column=user", "--max-unit-records=0"], "max_records"),
])
@pytest.mark.parametrize("main, prog", [(online_learning.main, online_learning.PROG), (lifelong.main, lifelong.PROG)])
def test_unit_flags_misused_are_one_line_usage_errors(main, prog, extra, fix, tmp_path, key_file, capsys):
    header = "stream_id,task_id,x_0,label,user\ns,0,0.5,1,ann\n"
    (tmp_path / "r.csv").write_text(header)
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={tmp_path / 'out'}", f"--noise-key-file={key_file}",
            "--tasks=0", "--classes=0,1"] if main is lifelong.main else [
        f"--input={tmp_path / 'r.csv'}", f"--output={tmp_path / 'out'}", f"--noise-key-file={key_file}"]
    assert_usage_error(main, prog, argv + extra, fix, capsys)


def test_a_unit_level_lifelong_job_is_a_batch_replay(tmp_path, key_file, capsys):
    # with a unit, END_OF_TASK markers are dead letters: on a stream the tasks would never close
    assert_usage_error(lifelong.main, lifelong.PROG, [
        "--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=1", "--tasks=0",
        "--classes=0,1", f"--output={tmp_path / 'out'}", f"--noise-key-file={key_file}", "--privacy-unit-column=user",
        "--max-unit-records=2"], "tasks close at the end of the input", capsys)


def test_a_streaming_regression_job_reads_the_unit_field_of_each_message(tmp_path, key_file):
    # the same rows as JSON messages on a stream and as a file replay: the same releases, ann's 6 (identical:
    # any 2 kept are the same) kept to 2; event-time steps sum their records, so delivery order does not matter
    ann = {"stream_id": "s", "timestamp": 11.0, "x_0": 0.5, "x_1": -0.25, "x_2": 0.25, "label": 0.75, "user": "ann"}
    rows = [ann] * 6 + [dict(ann, timestamp=12.0 + 7 * i, x_0=0.1 * i, label=-0.5, user=f"u{i}") for i in range(3)]
    common = ["--learner=regression", "--start=0", "--period=10", "--end=40", "--epsilon=50", "--delta=1e-6",
              f"--noise-key-file={key_file}", "--privacy-unit-column=user", "--max-unit-records=2", "--format=jsonl"]

    def replay(name: str, records: list[dict]) -> list[dict]:
        (tmp_path / f"{name}.csv").write_text("\n".join([",".join(ann)] + [",".join(str(v) for v in row.values())
                                                                          for row in records]) + "\n")
        assert online_learning.main([f"--input={tmp_path / f'{name}.csv'}", f"--output={tmp_path / name}",
                                     *common]) == 0
        return read_releases(str(tmp_path / name / "models-*"))

    want = replay("batch", rows)
    for a, b in zip(replay("two", rows[4:]), want):  # ann's 2 alone: what the bound keeps
        np.testing.assert_allclose(a["value"], b["value"], rtol=1e-9, atol=1e-9)
    got = _streamed(tmp_path / "stream", rows + [{**rows[0], "user": None}], common)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a["value"], b["value"], rtol=1e-9, atol=1e-9)
        assert (a["meta"]["privacy_unit"], a["meta"]["max_records"]) == ("user", 2)
    assert dead_letters(tmp_path / "stream") == {"models:bad_unit_id": 1}


def _streamed(out, rows: list[dict], common: list[str]) -> list[dict]:
    """``online_learning`` on ``--source pubsub --streaming``, its messages ``rows`` (a TestStream in their place)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    argv = ["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=3",
            f"--output={out}", *common]
    options = PipelineOptions(argv)
    job = online_learning.plan(options)
    messages = TestStream().add_elements([TimestampedValue(json.dumps(row).encode(), row["timestamp"])
                                          for row in rows]).advance_watermark_to_infinity()
    with beam.Pipeline(options=options) as p:
        online_learning.build(p, job, options.view_as(online_learning.OnlineLearningOptions), messages=messages)
    return sorted(read_releases(str(out / "models-*")), key=lambda r: r["step"])


@pytest.mark.parametrize("main, prog, argv", [(online_learning.main, online_learning.PROG, []),
                                              (lifelong.main, lifelong.PROG, [])])
def test_the_demo_has_no_unit_ids(main, prog, argv, tmp_path, capsys):
    assert_usage_error(main, prog, [f"--output={tmp_path / 'out'}", "--privacy-unit-column=user",
                                    "--max-unit-records=2"], "demo dataset has no unit ids", capsys)
