"""``python -m beam_dp.report``: figures from release files, the summary line, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.core import NoiseSource, Release, StepClock
from beam_dp.io import RELEASE_SCHEMA, release_to_row
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.report.__main__ import main
from tests.conftest import TEST_KEY

PNG = b"\x89PNG\r\n\x1a\n"


def _write_releases(folder, steps=12):
    clock = StepClock(0.0, 10.0, 10.0 * steps)
    mechanism = make_tree_sum(dim=2, epsilon=1.0, clip_bound=1.0)
    noise = NoiseSource(TEST_KEY)
    rows = []
    for stream in ("s1", "s2"):
        state = mechanism.init_state(stream)
        for step in range(1, steps + 1):
            state, releases = mechanism.step(state, np.full((3, 2), 0.2), noise)
            rows += [release_to_row(r, mechanism.guarantee, clock.step_start_micros(step), clock.step_end_micros(step))
                     for r in releases]
    snapshot = Release("s1", 1, "model_snapshot", {"w": np.zeros(3), "b": np.zeros(1)}, 0.5, 0.0,
                       {"accuracy": 0.75, "noise_std": 0.1})
    rows.append(release_to_row(snapshot, mechanism.guarantee))
    pq.write_table(pa.Table.from_pylist([r._asdict() for r in rows], schema=RELEASE_SCHEMA),
                   folder / "sum-00000-of-00001.parquet")
    (folder / "dead_letter-00000-of-00001.jsonl").write_text(
        json.dumps({"stage": "sum", "reason": "late"}) + "\n"
        + json.dumps({"stage": "read", "reason": "malformed"}) + "\n")
    return len(rows)


def test_report_draws_values_spend_and_accuracy_and_prints_a_summary(tmp_path, capsys):
    n_rows = _write_releases(tmp_path)
    out = tmp_path / "report"
    assert main([str(tmp_path / "sum-*"), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"beam_dp report: {n_rows} release rows from 1 files; 2 streams")
    assert "dead letters: 2" in line
    summary = json.loads((out / "summary.json").read_text())
    mechanism = make_tree_sum(dim=2, epsilon=1.0, clip_bound=1.0).name
    assert summary["figures"] == [f"values_{mechanism}.png", "values_model_snapshot.png", "privacy_spend.png",
                                  "accuracy.png"]
    for name in summary["figures"]:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


@pytest.mark.parametrize("argv", [["/no/such/releases-*", "--out", "x"], ["--out", "x"],
                                  ["r.parquet", "--out", "x", "--max-streams", "zero"]])
def test_bad_arguments_are_one_line_errors_with_exit_code_2(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([a.replace("x", str(tmp_path / "x")) if a == "x" else a for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m beam_dp.report: error:")
