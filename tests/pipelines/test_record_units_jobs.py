"""model_release and growing_db_queries with --privacy-unit-column / --max-unit-records (pipelines.record_units)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_dp.io.manifest import manifest_path, read_manifest
from beam_dp.verify import main as verify_main
from pipelines.runner import UsageError


def _examples_csv(path, users: int = 6, per_user: int = 6, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = ["stream_id,x_0,x_1,label,user"]
    for i in range(users * per_user):
        x = rng.uniform(-0.7, 0.7, 2)
        lines.append(f"s,{x[0]:.4f},{x[1]:.4f},{rng.uniform():.4f},{100 + i % users}")  # numeric ids: text
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _rows(folder: str, prefix: str) -> list[dict]:
    from pathlib import Path

    return [r for f in sorted(Path(folder).glob(f"{prefix}-*.parquet")) for r in pq.read_table(f).to_pylist()]


def _model_release(tmp_path, *extra: str) -> str:
    from pipelines.model_release import main

    out = str(tmp_path / "models")
    assert main(["--input", _examples_csv(tmp_path / "in.csv"), "--output", out, "--algorithm", "multiresolution",
                 "--block-size", "4", *extra]) == 0
    return out


def test_model_release_per_unit_declares_the_unit_and_verifies(tmp_path, capsys):
    out = _model_release(tmp_path, "--privacy-unit-column", "user", "--max-unit-records", "4")
    rows = _rows(out, "models")
    assert rows and all(json.loads(r["meta"])["max_records"] == 4 for r in rows)
    assert max(r["epsilon_budget"] for r in rows) == pytest.approx(0.25)  # record budget: 1/4 (pure)
    assert all(r["job_epsilon_spent"] <= 1.0 * (1 + 1e-12) for r in rows)
    (transform,) = read_manifest(manifest_path(out)).transforms
    assert transform.privacy_unit == "user" and transform.epsilon == 1.0
    assert verify_main([out]) == 0, capsys.readouterr().out
    # 6 units of 6 examples, bounded to 4: 24 examples, 6 blocks of 4 at level 0
    assert sum(1 for r in rows if [e["level"] for e in json.loads(r["meta"])["events"]] == [0]) == 6


def test_model_release_without_the_flags_is_record_level(tmp_path):
    rows = _rows(_model_release(tmp_path), "models")
    assert rows and all("privacy_unit" not in json.loads(r["meta"]) for r in rows)
    assert max(r["epsilon_budget"] for r in rows) == pytest.approx(1.0)


def _growing_inputs(tmp_path) -> tuple[str, str]:
    rng = np.random.default_rng(1)
    lines = ["stream_id,timestamp,colour,user"]
    for i in range(48):
        lines.append(f"s,{2.0 * i + 0.5:.2f},{'abcd'[int(rng.integers(0, 4))]},u{i % 8}")
    (tmp_path / "e.csv").write_text("\n".join(lines) + "\n")
    queries = [json.dumps({"stream_id": "s", "query_id": f"q{t}", "t": t, "indices": [0]}) for t in range(4, 40, 4)]
    (tmp_path / "q.jsonl").write_text("\n".join(queries) + "\n")
    return str(tmp_path / "e.csv"), str(tmp_path / "q.jsonl")


GROWING = ["--universe", '{"colour": ["a", "b", "c", "d"]}', "--start", "0", "--period", "10", "--end", "100",
           "--n", "4"]


@pytest.mark.parametrize("mechanism", ["pmwg", "bbscheduler"])
def test_growing_db_queries_per_unit_declares_the_unit_and_verifies(tmp_path, capsys, mechanism):
    from pipelines.growing_db_queries import main

    elements, queries = _growing_inputs(tmp_path)
    out = str(tmp_path / "answers")
    assert main(["--input", elements, "--queries", queries, "--output", out, *GROWING, "--mechanism", mechanism,
                 "--privacy-unit-column", "user", "--max-unit-records", "5"]) == 0
    rows = _rows(out, "answers")
    assert rows and all(json.loads(r["meta"])["max_records"] == 5 for r in rows)
    assert max(r["epsilon_budget"] for r in rows) == pytest.approx(0.2)
    # 8 units of 6 elements, bounded to 5: a database of 40, every query (t <= 36) answered
    assert len([r for r in rows if r["purpose"].startswith("query:")]) == 9
    assert read_manifest(manifest_path(out)).transforms[0].privacy_unit == "user"
    assert verify_main([out]) == 0, capsys.readouterr().out


def _plan_error(module: str, argv: list[str]) -> str:
    import importlib

    from pipelines.runner import parse

    job = importlib.import_module(f"pipelines.{module}")
    with pytest.raises(UsageError) as err:
        job.plan(parse(argv, job.JOB))
    return str(err.value)


@pytest.mark.parametrize("argv,message", [
    (["--max-unit-records", "4"], "give --privacy-unit-column"),
    (["--privacy-unit-column", "user"], "needs --max-unit-records"),
    (["--privacy-unit-column", "nobody", "--max-unit-records", "4"], "nobody"),
    (["--privacy-unit-column", "user", "--max-unit-records", "0"], "max"),  # max_records (or the flag's check)
])
def test_bad_unit_flags_are_one_line_usage_errors(tmp_path, argv, message):
    csv = _examples_csv(tmp_path / "in.csv")
    assert message in _plan_error("model_release", ["--input", csv, "--output", str(tmp_path / "o"), *argv])
    elements, queries = _growing_inputs(tmp_path)
    text = _plan_error("growing_db_queries", ["--input", elements, "--queries", queries, "--output",
                                              str(tmp_path / "g"), *GROWING, *argv])
    assert message in text and "\n" not in text


def test_the_demo_dataset_is_refused_and_a_stream_reads_the_unit_field(tmp_path, monkeypatch):
    from pipelines import growing_db_queries, model_release
    from pipelines.runner import parse
    from tests.conftest import TEST_KEY

    unit = ["--privacy-unit-column", "user", "--max-unit-records", "4"]
    assert "needs --input" in _plan_error("model_release", ["--output", str(tmp_path / "o"), *unit])
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    kafka = ["--source", "kafka", "--kafka-bootstrap-servers", "localhost:9092", "--kafka-topic", "t", "--streaming"]
    models = model_release.plan(parse([*kafka, "--dim", "2", "--output", str(tmp_path / "o"), *unit],
                                      model_release.JOB))
    answers = growing_db_queries.plan(parse([*kafka, "--output", str(tmp_path / "g"), *GROWING, *unit],
                                            growing_db_queries.JOB))
    for job in (models, answers):  # each message's field "user": no header to check
        assert job.streaming and job.params.privacy_unit.column == "user" and job.params.privacy_unit.max_records == 4


def test_a_streaming_growing_db_job_reads_the_unit_field_of_each_element_message(tmp_path, monkeypatch):
    # the same elements and queries as JSON messages on a stream and as a file replay: the same answers; "big"
    # sends 8 identical elements (any 5 kept are the same), so the order a stream delivers them in does not matter
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    from beam_dp.io import read_releases
    from pipelines import growing_db_queries
    from tests.conftest import TEST_KEY

    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    elements = [{"stream_id": "s", "timestamp": 1.5, "colour": "a", "user": "big"}] * 8 + [
        {"stream_id": "s", "timestamp": 12.0 + 2 * i, "colour": "abcd"[i % 4], "user": f"u{i}"} for i in range(12)]
    queries = [{"stream_id": "s", "query_id": f"q{t}", "t": t, "indices": [0]} for t in range(4, 20, 4)]
    (tmp_path / "e.csv").write_text("stream_id,timestamp,colour,user\n" + "".join(
        f"{e['stream_id']},{e['timestamp']},{e['colour']},{e['user']}\n" for e in elements))
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    unit = ["--privacy-unit-column", "user", "--max-unit-records", "5", "--format", "jsonl"]
    assert growing_db_queries.main(["--input", str(tmp_path / "e.csv"), "--queries", str(tmp_path / "q.jsonl"),
                                    "--output", str(tmp_path / "batch"), *GROWING, *unit]) == 0
    want = read_releases(str(tmp_path / "batch" / "answers-*"))
    options = PipelineOptions(["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming",
                               "--output", str(tmp_path / "stream"), *GROWING, *unit])
    job = growing_db_queries.plan(options)
    messages = (TestStream().add_elements([TimestampedValue(json.dumps(q).encode(), 0) for q in queries])
                .add_elements([TimestampedValue(json.dumps(e).encode(), e["timestamp"]) for e in elements])
                .advance_watermark_to_infinity())
    with beam.Pipeline(options=options) as p:
        growing_db_queries.build(p, job, options.view_as(growing_db_queries.GrowingDbOptions),
                                 messages=messages)
    got = read_releases(str(tmp_path / "stream" / "answers-*"))
    assert [r["meta"]["query_id"] for r in got] == [r["meta"]["query_id"] for r in want]
    assert len(want) == 4 and all(r["meta"]["max_records"] == 5 for r in got)  # 5 + 12 kept: every query
    for a, b in zip(got, want):
        np.testing.assert_allclose(a["value"], b["value"], rtol=1e-9, atol=1e-9)
