"""Noise domains and the job budget in real pipelines: two transforms under one key never share noise,
a domain claimed twice is refused, replays are reproducible, every release carries the job's spend, and
the verifier passes on a job's written files and fails on doctored ones."""

import glob
import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    NoiseKey,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.core import StepClock
from beam_dp.core.budget import JobBudget
from beam_dp.io import WriteReleasesToParquet, read_releases
from beam_dp.verify import main as verify_main
from beam_dp.verify import verify_job
from tests.beam import collect
from tests.beam.helpers import batch_options

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=200.0)
R = 3.0


def _events(seed=3, n=200):
    rng = np.random.default_rng(seed)
    return [(f"s{int(i)}", float(t), float(v)) for i, t, v in
            zip(rng.integers(0, 3, n), rng.uniform(0, 200, n), rng.uniform(-R, R, n))]


def _sum_and_count(events, budget, noise="gamma"):
    def build(p):
        rows = p | beam.Create(events)
        sums = rows | "Sum" >> ContinualSum(ContinualSumParams(dim=1, clip_bound=R, clock=CLOCK, granularity=None,
                                                               noise=noise, **budget["sum"].params()))
        counts = rows | "Count" >> ContinualCount(ContinualCountParams(clock=CLOCK, granularity=None, noise=noise,
                                                                       **budget["count"].params()))
        return (sums.releases, counts.releases) | beam.Flatten()
    return collect.run(build)


def test_sum_and_count_under_one_key_draw_independent_noise(monkeypatch):
    """The reported attack: sum - R*count cancels the noise when both share it. With noise domains the
    residual (release combination minus the exact combination) has the noise's spread, not ~0."""
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    events = _events()
    budget = JobBudget(1.0).split({"sum": "pure", "count": "pure"})
    rows = _sum_and_count(events, budget)
    by = {(r.noise_domain, r.stream, r.step): r for r in rows}
    assert {r.noise_domain for r in rows} == {"Sum", "Count/Sum"}
    residuals = []
    for (domain, stream, step), row in by.items():
        if domain != "Sum":
            continue
        count = by[("Count/Sum", stream, step)]
        end = CLOCK.step_end_micros(step) / 1e6
        exact_s = sum(v for s, t, v in events if s == stream and t < end)
        exact_c = sum(1 for s, t, v in events if s == stream and t < end)
        residuals.append((row.value[0] - R * count.value[0]) - (exact_s - R * exact_c))
    # a shared noise would leave |residual| = 0; independent noise of std >> R leaves most residuals large
    assert np.median(np.abs(residuals)) > 5 * R


def test_replays_are_reproducible_and_every_release_carries_the_job_spend(monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    budget = JobBudget(1.0, 1e-6).split({"sum": "gaussian", "count": "gaussian"})
    events = _events(seed=4)
    first = _sum_and_count(events, budget, "gaussian")
    again = _sum_and_count(events, budget, "gaussian")
    key = lambda r: (r.noise_domain, r.stream, r.step)  # noqa: E731
    assert [(key(r), r.value) for r in sorted(first, key=key)] == [(key(r), r.value) for r in sorted(again, key=key)]
    rows = first
    for row in rows:
        assert row.composition == "gaussian"
        assert row.epsilon_spent <= row.job_epsilon_spent <= 1.0 + 1e-9
        assert (row.job_epsilon_budget, row.job_delta_budget) == (1.0, 1e-6)
    assert verify_job([r._asdict() for r in rows]).ok


def test_a_noise_domain_claimed_twice_is_refused_at_construction():
    params = ContinualSumParams(dim=1, clip_bound=1.0, clock=CLOCK, noise_key=NoiseKey(domain="shared"))
    p = beam.Pipeline(options=batch_options())
    rows = p | beam.Create([("a", 1.0, 0.5)])
    _ = rows | "A" >> ContinualSum(params)
    with pytest.raises(ValueError, match="already used"):
        _ = rows | "B" >> WindowedSum(WindowedSumParams(dim=1, clip_bound=1.0, clock=CLOCK, window=4,
                                                        noise_key=NoiseKey(domain="shared")))


def test_a_transform_that_does_not_fit_its_share_is_refused():
    budget = JobBudget(1.0, 1e-6).split({"sum": "gaussian"})
    with pytest.raises(ValueError, match="compose as 'pure'"):
        ContinualSumParams(dim=1, clip_bound=1.0, clock=CLOCK, noise="gamma", epsilon=0.5, delta=0.0,
                           budget=budget["sum"])
    with pytest.raises(ValueError, match="exceeds its budget share"):
        ContinualSumParams(dim=1, clip_bound=1.0, clock=CLOCK, noise="gaussian", epsilon=0.9, delta=1e-6,
                           budget=budget["sum"])


def _write_job(tmp_path, budget):
    out = str(tmp_path / "job")
    with beam.Pipeline(options=batch_options()) as p:
        rows = p | beam.Create(_events(seed=5))
        s = rows | "Sum" >> ContinualSum(ContinualSumParams(dim=1, clip_bound=R, clock=CLOCK, **budget["sum"].params()))
        w = rows | "Windowed" >> WindowedSum(WindowedSumParams(dim=1, clip_bound=R, clock=CLOCK, window=4,
                                                               **budget["windowed"].params()))
        s.releases | "WriteSum" >> WriteReleasesToParquet(out + "/sum")
        w.releases | "WriteWindowed" >> WriteReleasesToParquet(out + "/windowed")
    return out


def test_verifier_passes_on_a_job_and_fails_on_doctored_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    out = _write_job(tmp_path, JobBudget(1.0).split({"sum": "pure", "windowed": "pure"}))
    assert verify_main([out + "/*.parquet"]) == 0
    assert "verified: within the job's total" in capsys.readouterr().out
    # a stricter declared total than the job's fails
    assert verify_main([out + "/*.parquet", "--epsilon", "0.9", "--delta", "0"]) == 1
    # doctor one release: it now claims more spend than its share
    path = sorted(glob.glob(out + "/sum*.parquet"))[0]
    table = pq.read_table(path).to_pylist()
    table[0]["epsilon_spent"] = table[0]["epsilon_budget"] * 1.5
    doctored = tmp_path / "doctored"
    doctored.mkdir()
    pq.write_table(pq.read_table(path).from_pylist(table, schema=pq.read_schema(path)), doctored / "sum.parquet")
    for f in glob.glob(out + "/windowed*.parquet"):
        pq.write_table(pq.read_table(f), doctored / "windowed.parquet")
    assert verify_main([str(doctored / "*.parquet")]) == 1
    printed = capsys.readouterr().out
    assert "more than its own budget" in printed and "NOT verified" in printed


def test_verifier_catches_a_shared_domain_and_unlabelled_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    out = _write_job(tmp_path, JobBudget(1.0).split({"sum": "pure", "windowed": "pure"}))
    rows = read_releases(out + "/*.parquet")
    sums = [dict(r, noise_domain="one") for r in rows if r["noise_domain"] == "Sum"]
    # a second transform's releases (other values): exact copies of rows would count as one release
    shared = sums + [dict(r, value=[v + 1.0 for v in r["value"]]) for r in sums]
    assert any("share the noise domain" in p for p in verify_job(shared).problems)
    assert not verify_job([dict(r, noise_domain="") for r in rows]).ok
    assert json.dumps(verify_job(rows).worst_epsilon) and verify_job(rows).worst_epsilon <= 1.0 + 1e-9


def test_the_verifier_gives_one_verdict_for_rows_and_for_their_table(tmp_path, monkeypatch):
    """``verify_job`` on release dicts and on the Arrow table of the same files (what the jobs' summaries
    and the CLI read), honest and doctored (a spend over its budget, an unlabelled row, a duplicate)."""
    from beam_dp.io import read_release_table
    from beam_dp.verify import VERIFIED_COLUMNS

    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    out = _write_job(tmp_path, JobBudget(1.0).split({"sum": "pure", "windowed": "pure"}))
    rows = read_releases(out + "/*.parquet")
    table = read_release_table(out + "/*.parquet", VERIFIED_COLUMNS)
    doctored = [dict(rows[0], epsilon_spent=rows[0]["epsilon_budget"] * 1.5), dict(rows[1], noise_domain=""),
                rows[2], dict(rows[2], value=[v + 1.0 for v in rows[2]["value"]])] + rows[3:]
    for given in (rows, doctored):
        by_rows, by_table = verify_job(given), verify_job(pa.Table.from_pylist(
            [{k: json.dumps(r[k], sort_keys=True) if k == "meta" else r[k] for k in VERIFIED_COLUMNS} for r in given]))
        assert (by_rows.ok, by_rows.worst_epsilon, len(by_rows.problems)) == (
            by_table.ok, by_table.worst_epsilon, len(by_table.problems))
    assert verify_job(table).ok and verify_job(table).worst_epsilon == pytest.approx(verify_job(rows).worst_epsilon)
    # over its own budget, no domain, appears twice, and the over-budget spend breaks the job total
    assert len(verify_job(doctored).problems) == 4


def test_the_verifier_reads_a_job_batch_by_batch(tmp_path, monkeypatch):
    """``verify_job`` over the release files' batches (what the jobs' summaries and the CLI do: one
    batch in memory at a time) gives the verdict of the whole table, and a release written twice is
    found when its two copies lie in different batches."""
    from beam_dp.io import iter_release_tables, read_release_table
    from beam_dp.verify import VERIFIED_COLUMNS, JobVerifier

    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(32)).hex())
    out = _write_job(tmp_path, JobBudget(1.0).split({"sum": "pure", "windowed": "pure"}))
    table = read_release_table(out + "/*.parquet", VERIFIED_COLUMNS)
    whole = verify_job(table)
    assert whole.ok
    by_batch = verify_job(iter_release_tables(out + "/*.parquet", VERIFIED_COLUMNS))
    assert (by_batch.ok, by_batch.worst_epsilon, [d.releases for d in by_batch.domains]) == (
        True, whole.worst_epsilon, [d.releases for d in whole.domains])
    last = table.slice(table.num_rows - 1, 1)  # released again with another value (an exact copy is one release)
    value = VERIFIED_COLUMNS.index("value")
    last = last.set_column(value, "value", pa.array([[v + 1.0 for v in last.column("value")[0].as_py()]],
                                                     table.schema.field("value").type))
    doubled = pa.concat_tables([table, last])
    verifier = JobVerifier()
    for start in range(0, doubled.num_rows, 7):  # the copy lands 6+ batches after its original
        verifier.add(doubled.slice(start, 7))
    verdict = verifier.verdict()
    assert [p for p in verdict.problems if "appears 2 times" in p] == [p for p in verify_job(doubled).problems
                                                                       if "appears" in p]
    assert len(verdict.problems) == 1 and verifier.rows == doubled.num_rows
    # a row of another domain's budget breaks agreement even in a later batch
    other = table.slice(0, 1).set_column(VERIFIED_COLUMNS.index("epsilon_budget"), "epsilon_budget",
                                         pa.array([9.0]))
    verifier.add(other)
    assert any("disagrees" in p for p in verifier.verdict().problems)
