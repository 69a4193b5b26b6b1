"""Every honest job the project makes verifies from its folder (manifest, releases, recomputed
spends): the demo runs of the jobs other than ``continual_stats`` (which ``test_verify_doctored``
covers), each in a fresh process as a user runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_dp.io.manifest import read_manifest
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("job", ["growing_db_queries", "model_release", "online_learning", "lifelong"])
def test_a_jobs_demo_run_writes_a_manifest_and_verifies(job, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    done = subprocess.run([sys.executable, "-m", f"pipelines.{job}", "--output", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = read_manifest(str(out))
    assert manifest.job == job and manifest.transforms and not manifest.problems()
    assert all(t.files and t.noise_domain for t in manifest.transforms)
    assert json.loads((out / "_beam_dp_manifest.json").read_text())["beam_dp_manifest"] == 1
    verified = subprocess.run([sys.executable, "-m", "beam_dp.verify", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert verified.stdout.strip().endswith("verified: within the job's total")
