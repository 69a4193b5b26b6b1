"""``run_yaml`` at launch: ``--help`` describes the command without importing Beam; a named key
source that the run cannot read is one line, exit 2, before the pipeline runs (as the jobs); a
schedule end beyond the int64-microsecond clock is a usage error, not an OverflowError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m pipelines.run_yaml"


def test_help_describes_the_command_and_imports_no_beam():
    code = ("import sys; from pipelines.run_yaml import main; code = main(['--help']); "
            "assert code == 0 and not [m for m in sys.modules if m.startswith('apache_beam')], 'Beam imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    for text in ("--yaml_pipeline_file", "--jinja_variables", "--verbose", "Run a beam_dp Beam YAML pipeline"):
        assert text in done.stdout


def _variables(tmp_path: Path, **extra) -> dict:
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    return {"input": str(tmp_path / "e.csv"), "output": str(tmp_path / "out"), "start": 0, "period": 10, "end": 40,
            **extra}


def _main(variables: dict) -> list[str]:
    return ["--yaml_pipeline_file=continual_sum.yaml", f"--jinja_variables={json.dumps(variables)}"]


def test_a_named_key_env_var_that_is_unset_is_refused_before_running(tmp_path, capsys, monkeypatch):
    from pipelines.run_yaml import main

    monkeypatch.chdir(ROOT / "templates" / "yaml")
    monkeypatch.delenv("H3_UNSET_KEY", raising=False)
    assert_usage_error(main, PROG, _main(_variables(tmp_path, noise_key_env="H3_UNSET_KEY")),
                       "the env var H3_UNSET_KEY is not set", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv"]


def test_a_missing_key_file_is_refused_and_a_key_file_beside_the_default_env_var_is_used(tmp_path, capsys,
                                                                                        monkeypatch):
    from pipelines.run_yaml import main

    monkeypatch.chdir(ROOT / "templates" / "yaml")
    monkeypatch.delenv("BEAM_DP_NOISE_KEY", raising=False)
    assert_usage_error(main, PROG, _main(_variables(tmp_path, noise_key_file=str(tmp_path / "nokey"))),
                       "does not exist", capsys)
    (tmp_path / "key").write_text(TEST_KEY.hex())
    assert main(_main(_variables(tmp_path, noise_key_file=str(tmp_path / "key")))) == 0  # the template's default
    assert (tmp_path / "out" / "_beam_dp_manifest.json").exists()                         # env var is not a 2nd source


@pytest.mark.parametrize("flag", ["--end=1e20", "--start=-1e20"])
def test_a_schedule_beyond_the_clock_is_a_usage_error(flag, tmp_path, capsys):
    from pipelines import continual_stats

    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1.0,0.5\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", "--start=0", "--period=10", "--end=40"]
    argv = [a for a in argv if not a.startswith(flag.split("=")[0] + "=")] + [flag]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv, "epoch seconds", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv"]
