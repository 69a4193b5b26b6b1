"""Run a CLI job on a small input in a fresh process, as a user does, and verify its output folder with
``python -m beam_dp.verify --strict`` (which fails on any release whose spend it cannot recompute)."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TEST_KEY

ROOT = Path(__file__).resolve().parents[2]


def run_and_verify_strictly(job: str, args: list[str], out: Path) -> None:
    """``python -m pipelines.<job> *args --output out``, then the strict verifier on ``out``: both must pass,
    the verifier with no note (every release declares)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    done = subprocess.run([sys.executable, "-m", f"pipelines.{job}", *args, "--output", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    verified = subprocess.run([sys.executable, "-m", "beam_dp.verify", str(out), "--strict"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert "note:" not in verified.stdout and verified.stdout.strip().endswith("verified: within the job's total")
