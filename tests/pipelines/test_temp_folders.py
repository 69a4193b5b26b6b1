"""Beam makes a ``beam-pipeline-temp*`` folder in every ``Pipeline()`` and removes it only in ``run``.
beam_dp's launchers own theirs (``pipelines.runner.owned_pipeline``): a job, a YAML template (whose
budget plan builds a pipeline it never runs) and a construction that fails leave no folder behind.
Before, a YAML launch left one folder per run and a failed construction one per attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.runner import Job, owned_pipeline
from tests.conftest import TEST_KEY
from tests.templates.yaml_expectations import TEST_VARIABLES

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("beam-pipeline-temp*"))


def test_an_owned_pipeline_removes_its_folder_unrun_and_when_construction_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with owned_pipeline() as pipeline:
        folder = Path(pipeline.local_tempdir)
        assert folder.parent == tmp_path and folder.is_dir()  # Beam made it in the temporary folder
    assert not folder.exists()
    with pytest.raises(ValueError, match="construction failed"):
        with owned_pipeline():
            raise ValueError("construction failed")
    assert _left(tmp_path) == []


def test_a_job_whose_construction_fails_leaves_no_folder(tmp_path, monkeypatch):
    from pipelines.runner import parse, run

    def build(*_):
        raise ValueError("a transform refused its parameters")

    job = Job(name="continual_stats", description="", plan=lambda opts: None, build=build,
              summary=lambda plan, opts: [])
    opts = parse([f"--output={tmp_path / 'out'}"], job)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ValueError, match="refused its parameters"):
        run(opts, job, SimpleNamespace(out_dir=str(tmp_path / "out"), demo=False))
    assert _left(tmp_path) == []


def test_a_job_and_a_yaml_template_run_as_commands_leave_no_folder(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex(), TMPDIR=str(temp))
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\n")
    variables = dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "yaml_out"))
    yaml = subprocess.run([sys.executable, "-m", "pipelines.run_yaml", "--yaml_pipeline_file=continual_sum.yaml",
                           f"--jinja_variables={json.dumps(variables)}"], cwd=ROOT / "templates" / "yaml", env=env,
                          capture_output=True, text=True, timeout=300)
    assert yaml.returncode == 0, yaml.stderr[-2000:]
    (tmp_path / "j.csv").write_text("stream_id,timestamp,value\na,1.0,0.5\nb,12.0,0.25\n")
    job = subprocess.run([sys.executable, "-m", "pipelines.continual_stats", f"--input={tmp_path / 'j.csv'}",
                          f"--output={tmp_path / 'job_out'}", "--start=0", "--period=10", "--end=20"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    assert _left(temp) == []
