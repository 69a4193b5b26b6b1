"""``python -m pipelines.run_yaml``: a YAML template runs quiet (one summary line, nothing on stderr),
``--verbose`` brings Beam's logs back, and a bad parameter is one line with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY
from tests.templates.yaml_expectations import TEST_VARIABLES

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, variables: dict, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pipelines.run_yaml", "--yaml_pipeline_file=continual_sum.yaml",
                           f"--jinja_variables={json.dumps(variables)}", *extra], cwd=ROOT / "templates" / "yaml",
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_template_runs_quiet_and_verbose_brings_the_logs_back(tmp_path):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\n")
    variables = dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "out"))
    done = _run(tmp_path, variables)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout == "beam_dp yaml: ran continual_sum.yaml\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_beam_dp_manifest.json",  # beam_dp.verify reads it
                                                                    "sum-00000-of-00001.parquet"]
    assert sorted(p.name for p in (tmp_path / "out.private").iterdir()) == ["dead_letter-00000-of-00001.jsonl"]
    loud = _run(tmp_path, dict(variables, output=str(tmp_path / "out2")), "--verbose")
    assert loud.returncode == 0 and "INFO" in loud.stderr


@pytest.mark.parametrize("change,fix", [({"epsilon": -1.0}, "epsilon must be"), ({"start": None}, "start"),
                                        ({"input": "/no/such/events.csv"}, "no files")])
def test_a_bad_parameter_is_one_line_with_exit_code_2(tmp_path, change, fix):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    variables = {**TEST_VARIABLES, "input": str(tmp_path / "e.csv"), "output": str(tmp_path / "out"), **change}
    variables = {k: v for k, v in variables.items() if v is not None}
    done = _run(tmp_path, variables)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("python -m pipelines.run_yaml: error:")
    assert fix in done.stderr.lower().replace("found no files", "no files")
