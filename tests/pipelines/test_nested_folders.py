"""Output folders that nest are refused at launch: a dead-letter folder inside ``--output`` (or the
reverse, or either inside the other's staging folder) is one line, exit 2, nothing written, for
every job, ``run_yaml`` and the Flink entry point (one shared check, ``beam_dp.io.locations``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_dp.io.locations import inside, overlap_error
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error
from tests.pipelines.test_outputs import _marker_cases

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
JOBS = ["continual_stats", "model_release", "online_learning", "growing_db_queries", "lifelong"]


@pytest.mark.parametrize("output,private,how", [
    ("O", "O/private", "lies inside it"), ("O", "O/./a/../private", "lies inside it"), ("O/x", "O", "contains it"),
    ("O", "O.staging-1/d", "lies inside its staging folder"), ("O.private.staging-2/o", "O.private", "staging"),
    ("O", "x/../O", "is the same folder"), ("gs://b/O", "gs://b/O/p", "lies inside it")])
def test_overlaps_are_named(output, private, how, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    error = overlap_error([("--output", output), ("--dead-letter-output", private)])
    assert error is not None and how in error and "\n" not in error


@pytest.mark.parametrize("output,private", [("O", "O.private"), ("O", "O2/private"), ("O", "Other"),
                                            ("gs://b/O", "gs://b/O2"), ("O.staging", "O")])
def test_side_by_side_folders_pass(output, private, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert overlap_error([("--output", output), ("--dead-letter-output", private)]) is None


def test_inside_resolves_links(tmp_path):
    (tmp_path / "O").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "O")
    assert inside(str(tmp_path / "link" / "private"), str(tmp_path / "O"))


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_job_refuses_nested_folders_at_launch(job, reverse, tmp_path, capsys):
    if job == "lifelong":
        pytest.importorskip("torch")
    main, argv = _marker_cases(tmp_path)[job]
    top = tmp_path / "O"
    out, raw = (top / "releases", top) if reverse else (top, top / "private")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_usage_error(main, f"python -m pipelines.{job}", [*argv, f"--output={out}", f"--dead-letter-output={raw}"],
                       "overlaps --output", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing published


def test_a_job_process_exits_2_with_one_line_and_publishes_nothing(tmp_path):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1.0,0.5\nb,2.0,0.25\n")
    done = subprocess.run([sys.executable, "-m", "pipelines.continual_stats", f"--input={tmp_path / 'e.csv'}",
                           "--start=0", "--period=10", "--end=40", f"--output={tmp_path / 'O'}",
                           f"--dead-letter-output={tmp_path / 'O' / 'private'}"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT)),
                          timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and "overlaps --output" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv"]


def test_run_yaml_refuses_nested_folders(tmp_path, capsys, monkeypatch):
    from pipelines.run_yaml import main

    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    monkeypatch.chdir(ROOT / "templates" / "yaml")
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    variables = {"input": str(tmp_path / "e.csv"), "output": str(tmp_path / "O"), "start": 0, "period": 10,
                 "end": 40, "dead_letter_output": str(tmp_path / "O" / "private")}
    assert_usage_error(main, "python -m pipelines.run_yaml",
                       ["--yaml_pipeline_file=continual_sum.yaml", f"--jinja_variables={json.dumps(variables)}"],
                       "overlaps output", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv"]


@pytest.mark.parametrize("flag,path", [("--dead-letter-output", "O/dead"), ("--checkpoint-dir", "O/ck"),
                                       ("--dead-letter-output", "O.staging-1/dead")])
def test_the_flink_entry_refuses_nested_folders(flag, path, tmp_path, capsys):
    from beam_dp.flink.run import _args  # its argument parsing needs no pyflink

    with pytest.raises(SystemExit) as ended:
        _args(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "O"), flag, str(tmp_path / path),
               "--start", "0", "--period", "10", "--end", "40"])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and "overlaps --output" in err[-1], err
    assert not any(tmp_path.iterdir())
