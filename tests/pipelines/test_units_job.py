"""continual_stats with --privacy-unit-column: bounded per unit, unit-level noise, declared, verified."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core import StepClock
from beam_dp.core.budget import JobBudget
from beam_dp.core.units import UnitLedger, bound_block, unit_hash
from beam_dp.io import read_releases
from beam_dp.io.manifest import read_manifest
from pipelines import continual_stats
from tests.beam.helpers import expected_rows
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters

pytestmark = pytest.mark.pipeline

START, PERIOD, END = 100.0, 5.0, 150.0  # 10 steps
PROG = "python -m pipelines.continual_stats"


def _events(n=80, seed=0):
    rng = np.random.default_rng(seed)
    users = rng.choice(["ann", "bob", "cy", "dee"], n, p=[0.55, 0.25, 0.15, 0.05])
    ids = rng.choice(["x", "y", "z"], n)
    ts = START + rng.random(n) * (END - START)
    return users, ids, ts, rng.normal(0, 1, n)


def _write(path, users, ids, ts, values, extra=()):
    lines = ["stream_id,timestamp,value,user"] + [f"{i},{float(t)!r},{float(v)!r},{u}"
                                                 for u, i, t, v in zip(users, ids, ts, values)]
    path.write_text("\n".join(lines + list(extra)) + "\n")


def _bounded(users, ids, ts, values, unit: PrivacyUnit, clip: float, clock: StepClock):
    steps = clock.step_of_micros(np.round(np.asarray(ts) * 1e6).astype(np.int64))
    bounds, kept = unit.bounds(), []
    for user in sorted(set(users)):
        rows = np.flatnonzero(np.asarray(users) == user)
        ledger, h = UnitLedger.empty(bounds), unit_hash(TEST_KEY, [user])[0]
        for step in sorted(set(steps[rows].tolist())):
            mine = rows[steps[rows] == step]
            block = bound_block(ledger, step, np.full(len(mine), h, np.uint64), [str(s) for s in ids[mine]],
                                values[mine], bounds, TEST_KEY, clip_bound=clip)
            ledger = block.ledger
            kept += [(str(s), step, float(v)) for s, v in zip(block.streams, block.sums)]
    return kept


def test_unit_level_job_matches_the_bounded_replay_declares_and_verifies(tmp_path, capsys):
    users, ids, ts, values = _events()
    path = tmp_path / "events.csv"
    _write(path, users, ids, ts, values, extra=["x,120.0,1.0,", "y,121.0,abc,bob"])
    out = tmp_path / "out"
    argv = ["--input", str(path), "--output", str(out), "--start", str(START), "--period", str(PERIOD),
            "--end", str(END), "--epsilon", "1.0", "--noise", "gaussian", "--delta", "1e-6", "--clip-bound", "1.5",
            "--privacy-unit-column", "user", "--max-unit-steps", "3", "--min-separation", "2",
            "--max-streams-per-step", "2", "--max-contributions-per-step", "2"]
    assert continual_stats.main(argv) == 0
    summary = capsys.readouterr().out
    assert "verified" in summary.lower() and "problem" not in summary.lower(), summary
    unit = PrivacyUnit("user", 2, 2, 3, 2)
    clock = StepClock(START, PERIOD, END)
    share = JobBudget(1.0, 1e-6).split({"sum": "gaussian"})["sum"]
    params = ContinualSumParams(dim=1, clip_bound=1.5, clock=clock, noise="gaussian", **share.params())
    unit_params = params.with_privacy_unit(unit)
    kept = _bounded(users, ids, ts, values, unit, 1.5, clock)
    assert 0 < len(kept) < len(values)  # the heavy units were bounded
    want = expected_rows(unit_params, [s for s, _, _ in kept], [START + (t - 0.5) * PERIOD for _, t, _ in kept],
                         [v for _, _, v in kept], domain="ContinualSum")
    got = read_releases(str(out / "sum-*"))
    assert [(r["stream"], r["step"]) for r in got] == sorted((r.stream, r.step) for r in want)
    want = sorted(want, key=lambda r: (r.stream, r.step))
    for g, w in zip(got, want):
        assert np.allclose(g["value"], w.value, rtol=1e-9, atol=1e-9)
        assert g["noise"] == w.noise and g["epsilon_spent"] == pytest.approx(w.epsilon_spent)
        meta = json.loads(g["meta"]) if isinstance(g["meta"], str) else g["meta"]
        assert meta == {**json.loads(w.meta), **unit_params.unit_declaration()}
    manifest = read_manifest(str(out))
    assert [t.privacy_unit for t in manifest.transforms] == ["user"]
    assert dead_letters(out) == {"sum:bad_unit_id": 1, "sum:bad_value": 1}
    private = out.with_name(out.name + ".private")
    assert "bob" not in "".join(f.read_text() for f in private.glob("dead_letter-*"))  # no clear id


@pytest.mark.parametrize("flags, fix", [
    (["--max-unit-steps=3"], "give --privacy-unit-column"),
    (["--max-streams-per-step=2"], "give --privacy-unit-column"),
    (["--privacy-unit-column=user"], "--max-unit-steps"),
    (["--privacy-unit-column=nope", "--max-unit-steps=2"], "no column 'nope'"),
    (["--privacy-unit-column=user", "--max-unit-steps=2", "--noise=gaussian", "--delta=1e-6", "--max-unit-steps=300"],
     "at most 256"),
])
def test_unit_flags_refused_in_one_line(flags, fix, tmp_path, capsys):
    users, ids, ts, values = _events(10)
    _write(tmp_path / "e.csv", users, ids, ts, values)
    argv = [f"--input={tmp_path / 'e.csv'}", f"--start={START}", f"--period={PERIOD}", f"--end={END}",
            f"--output={tmp_path / 'o'}"]
    assert_usage_error(continual_stats.main, PROG, argv + flags, fix, capsys)


def test_unit_column_needs_input_and_a_batch_replay(tmp_path, capsys):
    assert_usage_error(continual_stats.main, PROG, ["--privacy-unit-column=user", "--max-unit-steps=2",
                                                    f"--output={tmp_path / 'o'}"], "demo dataset has no unit ids", capsys)


def test_event_level_job_writes_no_unit(tmp_path, capsys):
    users, ids, ts, values = _events(20)
    _write(tmp_path / "e.csv", users, ids, ts, values)
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={tmp_path / 'e.csv'}", f"--start={START}", f"--period={PERIOD}",
                                 f"--end={END}", f"--output={out}"]) == 0
    assert "privacy_unit" not in (out / "_beam_dp_manifest.json").read_text()
    assert all("privacy_unit" not in (r["meta"] if isinstance(r["meta"], str) else json.dumps(r["meta"]))
               for r in read_releases(str(out / "sum-*")))


def test_unit_column_needs_a_named_key(tmp_path, capsys, monkeypatch):
    users, ids, ts, values = _events(10)
    _write(tmp_path / "e.csv", users, ids, ts, values)
    monkeypatch.delenv("BEAM_DP_NOISE_KEY", raising=False)
    argv = [f"--input={tmp_path / 'e.csv'}", f"--start={START}", f"--period={PERIOD}", f"--end={END}",
            f"--output={tmp_path / 'o'}", "--privacy-unit-column=user", "--max-unit-steps=2",
            "--allow-random-noise-key"]
    assert_usage_error(continual_stats.main, PROG, argv, "never with a random key", capsys)


def test_parquet_unit_column_and_non_string_ids(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    users, ids, ts, values = _events(30)
    pq.write_table(pa.table({"stream_id": ids, "timestamp": ts, "value": values, "user": users}), tmp_path / "e.parquet")
    pq.write_table(pa.table({"stream_id": ["x"], "timestamp": [START + 1], "value": [1.0], "user": [7]}),
                   tmp_path / "n.parquet")
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'e.parquet'}", f"--start={START}", f"--period={PERIOD}", f"--end={END}",
            f"--output={out}", "--privacy-unit-column=user", "--max-unit-steps=2"]
    assert continual_stats.main(argv) == 0
    assert read_releases(str(out / "sum-*")) and dead_letters(out) == {}
    out = tmp_path / "out2"
    argv[0], argv[4] = f"--input={tmp_path / 'n.parquet'}", f"--output={out}"
    assert continual_stats.main(argv) == 0
    assert dead_letters(out) == {"sum:bad_unit_id": 1}
