"""The job-budget example of docs/budget.md runs as written (a budget split, two transforms, the verifier)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.pipeline


def test_readme_budget_block_runs_as_written(tmp_path):
    text = (ROOT / "docs" / "budget.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- readme-test: budget -->\n```python\n(.*?)```", text, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=bytes(range(32)).hex())
    (tmp_path / "block.py").write_text(block, encoding="utf-8")  # as a user pastes it into a script
    done = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verified: within the job's total" in done.stdout
