"""The one runner: quiet by default (no third-party warnings or logs on stdout/stderr), ``--verbose``
brings the logs back, ``--streaming=true|false`` as a Flex Template passes it, and every job module
keeps ``python -m pipelines.<job>`` and ``main(argv)``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import StandardOptions

from pipelines import continual_stats
from pipelines.runner import _normalise, parse
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1,0.5\nb,12,0.25\nb,13,oops\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    return subprocess.run([sys.executable, "-m", "pipelines.continual_stats", f"--input={tmp_path / 'e.csv'}",
                           f"--output={tmp_path / 'out'}", "--start=0", "--period=10", "--end=30", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_job_is_quiet_by_default_and_verbose_on_request(tmp_path):
    quiet = _job(tmp_path)
    rejected = (f"warning: 1 of 3 input rows were rejected (raw-data count, not private); dead letters under "
                f"{tmp_path / 'out.private'}\n")  # the one bad row: beam_dp's own warning
    assert quiet.returncode == 0 and quiet.stderr == rejected, quiet.stderr[-2000:]  # no apitools warning, no INFO
    assert quiet.stdout.startswith("beam_dp continual_stats: releases written under")
    assert "dead letters" in quiet.stdout and "malformed" not in quiet.stdout  # exact counts only on request
    counted = _job(tmp_path, "--print-exact-counts")
    assert counted.returncode == 0 and counted.stderr == rejected, counted.stderr[-2000:]
    assert ("exact counts (NOT private, they describe the raw data): 2 events accepted (all transforms), "
            "1 dead letters {'read:malformed': 1}") in counted.stdout
    loud = _job(tmp_path, "--verbose")
    assert loud.returncode == 0 and "INFO" in loud.stderr


@pytest.mark.parametrize("flag,streaming", [("--streaming=true", True), ("--streaming=false", False),
                                            ("--streaming", True)])
def test_streaming_takes_a_template_value(flag, streaming):
    options = parse(_normalise(["--output=/tmp/x", flag]), continual_stats.JOB)
    assert options.view_as(StandardOptions).streaming is streaming


def test_a_bad_streaming_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        continual_stats.main(["--streaming=maybe"])
    assert exc.value.code == 2 and "expected true or false" in capsys.readouterr().err
