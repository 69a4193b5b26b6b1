"""The main job end to end on small files: outputs, dead letters, summary, equality with the pure mechanism."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.beam import ContinualSumParams, WindowedSumParams
from beam_dp.core import StepClock
from beam_dp.io import read_releases
from pipelines import continual_stats
from tests.beam.helpers import expected_rows

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
    for name, params in (
        ("sum", ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.5, clock=clock)),
        ("windowed", WindowedSumParams(dim=2, epsilon=1.0, clip_bound=1.5, clock=clock, window=4)),
    ):
        got = read_releases(str(out / f"{name}-*"))
        want = sorted(expected_rows(params, ids, ts, values), key=lambda r: (r.stream, r.step))
        assert [(r["stream"], r["step"]) for r in got] == [(r.stream, r.step) for r in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g["value"], w.value, rtol=1e-9, atol=1e-9)
            assert g["epsilon_spent"] == w.epsilon_spent <= 1.0
    dead = [json.loads(line) for f in out.glob("dead_letter-*") for line in f.read_text().splitlines() if line]
    reasons = {}
    for d in dead:
        key = f"{d['stage']}:{d['reason']}"
        reasons[key] = reasons.get(key, 0) + 1
    assert reasons == want_dead


def test_input_needs_a_public_schedule(tmp_path):
    ids, ts, values = _events(10)
    _write_csv(tmp_path / "e.csv", ids, ts, values)
    with pytest.raises(SystemExit):
        continual_stats.main(["--input", str(tmp_path / "e.csv"), "--output", str(tmp_path / "o")])
