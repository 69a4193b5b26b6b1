"""The main job end to end on small files: outputs, dead letters, summary, equality with the pure mechanism."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.core import StepClock
from beam_dp.core.budget import JobBudget, compose
from beam_dp.io import read_releases
from beam_dp.verify import verify_job
from pipelines import continual_stats
from tests.beam.helpers import expected_rows
from tests.pipelines.jobs_helpers import dead_letters
from tests.release_checks import assert_close_values

pytestmark = pytest.mark.pipeline

START, PERIOD, END = 100.0, 5.0, 150.0  # 10 steps


def _events(n=120, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.choice(["x", "y"], n)
    ts = START + rng.random(n) * (END - START)
    values = rng.normal(0, 1, (n, 2))
    return ids, ts, values


def _write_csv(path, ids, ts, values, extra_lines=()):
    lines = ["stream_id,timestamp,value_0,value_1"]
    lines += [f"{i},{float(t)!r},{float(v0)!r},{float(v1)!r}" for i, t, (v0, v1) in zip(ids, ts, values)]
    lines += list(extra_lines)
    path.write_text("\n".join(lines) + "\n")


def _shares(epsilon, *names):
    """The CLI's split of ``--epsilon`` (pure noise): equal shares of one job budget, in run order."""
    return JobBudget(epsilon).split({name: "pure" for name in names})


def _assert_written_rows_equal(got, want):
    """Release files against expected rows: every column, floats within 1e-9 (the pipeline sums a step's
    events in another order than the pure replay: about n ulps for n events), the rest exact."""
    assert [(r["stream"], r["step"]) for r in got] == [(r.stream, r.step) for r in want]
    for g, w in zip(got, want):
        assert_close_values(g, {**w._asdict(), "meta": json.loads(w.meta)}, "release row", rtol=1e-9, atol=1e-9)


def test_help_lists_every_option(capsys):
    assert continual_stats.main(["--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--input", "--epsilon", "--delta", "--noise", "--clip-bound", "--start", "--period", "--end",
                   "--window", "--streams", "--noise-key-file", "--horizon", "--format"):
        assert option in text


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_job_on_a_file_matches_pure_mechanisms_and_dead_letters_bad_rows(tmp_path, fmt, capsys):
    ids, ts, values = _events()
    if fmt == "csv":
        path = tmp_path / "events.csv"
        _write_csv(path, ids, ts, values, extra_lines=["x,110.0,abc,1.0", "y,111.0", "x,99.0,1.0,1.0",
                                                       "x,nan,1.0,1.0"])
        want_dead = {"read:malformed": 2, "sum:before_start": 1, "windowed:before_start": 1,
                     "sum:bad_timestamp": 1, "windowed:bad_timestamp": 1}
    else:
        path = tmp_path / "events.parquet"
        pq.write_table(pa.table({"stream_id": ids, "timestamp": ts, "value_0": values[:, 0],
                                 "value_1": values[:, 1]}), path)
        want_dead = {}
    out = tmp_path / "out"
    argv = ["--input", str(path), "--output", str(out), "--start", str(START), "--period", str(PERIOD),
            "--end", str(END), "--epsilon", "2.0", "--window", "4", "--clip-bound", "1.5"]
    assert continual_stats.main(argv) == 0
    summary = capsys.readouterr().out
    assert "sum: 20 releases" in summary and "windowed: 20 releases" in summary
    clock = StepClock(START, PERIOD, END)
    shares = _shares(2.0, "sum", "windowed")
    for name, domain, params in (
        ("sum", "ContinualSum", ContinualSumParams(dim=2, clip_bound=1.5, clock=clock, **shares["sum"].params())),
        ("windowed", "WindowedSum",
         WindowedSumParams(dim=2, clip_bound=1.5, clock=clock, window=4, **shares["windowed"].params())),
    ):
        got = read_releases(str(out / f"{name}-*"))
        want = sorted(expected_rows(params, ids, ts, values, domain=domain), key=lambda r: (r.stream, r.step))
        _assert_written_rows_equal(got, want)
        assert all(g["epsilon_spent"] <= 1.0 and g["job_epsilon_spent"] <= 2.0 for g in got)
    assert dead_letters(out) == want_dead


def test_input_needs_a_public_schedule(tmp_path):
    ids, ts, values = _events(10)
    _write_csv(tmp_path / "e.csv", ids, ts, values)
    with pytest.raises(SystemExit):
        continual_stats.main(["--input", str(tmp_path / "e.csv"), "--output", str(tmp_path / "o")])


# -- strict CLI: one-line errors, exit code 2 ------------------------------------------------------
@pytest.mark.parametrize("argv, fix", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--epsilon=abc"], "--epsilon"),
    (["--epsilon=0"], "--epsilon"),
    (["--input=/no/such/file.csv", "--start=0", "--period=1", "--end=10"], "no files match --input"),
    (["--noise-key-file=/no/such/key"], "--noise-key-file"),
    (["--source=pubsub"], "add --streaming"),
    (["--source=pubsub", "--streaming"], "--pubsub-subscription"),
    (["--source=kafka", "--streaming", "--kafka-topic=t"], "--kafka-bootstrap-servers"),
    (["--source=kafka", "--streaming", "--kafka-topic=t", "--kafka-bootstrap-servers=h:9092", "--start=0",
      "--period=1"], "--dim is required"),
    (["--period=60", "--end=600"], "--period, --end describe --input's clock"),  # the demo has its own clock
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fix, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        continual_stats.main(argv + [f"--output={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m pipelines.continual_stats: error:")
    assert fix in err


def test_count_output_and_budget_split(tmp_path, capsys):
    ids, ts, values = _events(60, seed=3)
    _write_csv(tmp_path / "e.csv", ids, ts, values)
    out = tmp_path / "out"
    argv = ["--input", str(tmp_path / "e.csv"), "--output", str(out), "--start", str(START), "--period",
            str(PERIOD), "--end", str(END), "--epsilon", "3.0", "--count", "--window", "2", "--format", "jsonl"]
    assert continual_stats.main(argv) == 0
    summary = capsys.readouterr().out
    # the job's budget is split into three pure shares that compose (add) to the total, and the summary
    # recomputes the worst contribution's spend from the written files
    from apache_beam.options.pipeline_options import PipelineOptions

    job_shares = [params.budget for params in continual_stats.plan(PipelineOptions(argv)).params.values()]
    assert [share.name for share in job_shares] == ["sum", "count", "windowed"]
    assert all(share.plan is job_shares[0].plan and share.composition == "pure" for share in job_shares)
    assert all(share.epsilon == pytest.approx(1.0, rel=1e-8) and share.delta == 0.0 for share in job_shares)
    total = compose([(share.composition, share.epsilon, share.delta) for share in job_shares], 0.0)
    assert total <= 3.0 and total == pytest.approx(3.0, rel=1e-8)  # the shares compose (add) to the total
    shares = _shares(3.0, "sum", "count", "windowed")
    assert ("job budget: (3, 0) per contribution, split as sum epsilon=1, count epsilon=1, windowed epsilon=1"
            in summary)
    assert "verified from the release files: worst contribution spends epsilon 3 of 3" in summary
    assert "exact counts" not in summary and "NOT verified" not in summary  # counts only on request
    every = [r for name in ("sum", "count", "windowed") for r in read_releases(str(out / f"{name}-*"))]
    verdict = verify_job(every)
    assert verdict.ok and {d.domain for d in verdict.domains} == {"ContinualSum", "ContinualCount/Sum", "WindowedSum"}
    assert verdict.worst_epsilon <= 3.0 and verdict.worst_epsilon == pytest.approx(3.0, rel=1e-8)
    assert all(r["job_epsilon_budget"] == 3.0 and r["job_epsilon_spent"] <= 3.0 for r in every)
    count_params = ContinualCountParams(clock=StepClock(START, PERIOD, END), **shares["count"].params())
    got = read_releases(str(out / "count-*"))
    want = sorted(expected_rows(count_params.as_sum_params(), ids, ts, np.ones((len(ids), 1))),
                  key=lambda r: (r.stream, r.step))
    _assert_written_rows_equal(got, want)
    assert all(r["epsilon_spent"] <= 1.0 for r in got)
    assert all(float(v) == round(float(v)) for r in got for v in r["value"])  # counts: exact integers


def test_granularity_flag_snaps_the_sums(tmp_path):
    ids, ts, values = _events(40, seed=4)
    _write_csv(tmp_path / "e.csv", ids, ts, values)
    argv = ["--input", str(tmp_path / "e.csv"), "--output", str(tmp_path / "out"), "--start", str(START),
            "--period", str(PERIOD), "--end", str(END), "--granularity", "0.1", "--format", "jsonl"]
    from apache_beam.options.pipeline_options import PipelineOptions

    sum_params = continual_stats.plan(PipelineOptions(argv)).params["sum"]
    assert sum_params.build_mechanism().granularity == 0.125
    assert continual_stats.main(argv) == 0
    got = read_releases(str(tmp_path / "out" / "sum-*"))
    assert got and all(v / 0.125 == round(v / 0.125) for r in got for v in r["value"])
    assert all(r["meta"]["granularity"] == 0.125 for r in got)


# -- streaming: the Pub/Sub / Kafka source replaced by a TestStream of the same JSON messages ----------
def _messages(events, late):
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    stream = TestStream()
    for watermark, batch in events:
        stream = stream.add_elements([TimestampedValue(json.dumps(e).encode(), e["timestamp"]) for e in batch])
        stream = stream.advance_watermark_to(watermark)
    stream = stream.add_elements([TimestampedValue(m, 130.0) for m in late])
    return stream.advance_watermark_to(END + 1).advance_watermark_to_infinity()


def test_streaming_source_replaced_by_teststream_matches_pure_mechanism(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that

    from tests.beam.helpers import rows_match

    ids, ts, values = _events(80, seed=5)
    order = np.argsort(ts)
    ids, ts, values = ids[order], ts[order], values[order]
    batches = []
    for lo, hi in ((START, 120.0), (120.0, 135.0), (135.0, END)):
        sel = (ts >= lo) & (ts < hi)
        batches.append((hi, [{"stream_id": str(i), "timestamp": float(t), "value_0": float(v[0]),
                              "value_1": float(v[1])} for i, t, v in zip(ids[sel], ts[sel], values[sel])]))
    late = [json.dumps({"stream_id": "x", "timestamp": 101.0, "value": [0.5, 0.5]}).encode(),  # step 1: closed
            b"not json", json.dumps({"stream_id": "y", "timestamp": 131.0, "value": [float("nan"), 1]}).encode()]
    argv = ["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=2",
            f"--start={START}", f"--period={PERIOD}", f"--end={END}", "--epsilon=2.0", "--window=4",
            f"--output={tmp_path}", "--format=jsonl"]
    options = PipelineOptions(argv)
    job = continual_stats.plan(options)
    clock = StepClock(START, PERIOD, END)
    shares = _shares(2.0, "sum", "windowed")
    want_sum = expected_rows(ContinualSumParams(dim=2, clip_bound=1.0, clock=clock, **shares["sum"].params()),
                             ids, ts, values, domain="ContinualSum")
    want_win = expected_rows(WindowedSumParams(dim=2, clip_bound=1.0, clock=clock, window=4,
                                               **shares["windowed"].params()), ids, ts, values, domain="WindowedSum")
    with beam.Pipeline(options=options) as p:
        outputs = continual_stats.build(p, job, options.view_as(continual_stats.ContinualStatsOptions),
                                        messages=_messages(batches, late))
        assert_that(outputs["sum"].releases, rows_match(want_sum), label="sum")
        assert_that(outputs["windowed"].releases, rows_match(want_win), label="windowed")
    assert dead_letters(tmp_path) == {"read:malformed": 1, "sum:late": 1, "windowed:late": 1, "sum:non_finite": 1,
                       "windowed:non_finite": 1}
    written = read_releases(str(tmp_path / "sum-*"))
    assert len(written) == 2 * clock.last_step
