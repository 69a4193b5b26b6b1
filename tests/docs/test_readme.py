"""Every Python block of README.md and docs/*.md runs exactly as written, in a fresh interpreter in an
empty working folder, unless it is marked ``<!-- not-run: reason -->``."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, all_blocks

PYTHON_BLOCKS = all_blocks("python")
#: optional engines that a block may need and this environment may lack (their own venvs)
OPTIONAL_ENGINES = {"beam_dp.flink": "pyflink"}


def run_block(code: str, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` exactly as written, saved as a script (as a user pastes it into a file). Run with
    ``python -c``, Beam's FnApiRunner followed by pyarrow reads can abort at interpreter exit."""
    script = Path(cwd) / "readme_block.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_docs_have_python_blocks_and_few_are_not_run():
    assert len(PYTHON_BLOCKS) >= 8
    not_run = [b.id for b in PYTHON_BLOCKS if b.not_run]
    assert len(not_run) <= 2, not_run


@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if not b.not_run], ids=lambda b: b.id)
def test_python_block_runs_as_written(block, tmp_path):
    for module, dependency in OPTIONAL_ENGINES.items():
        if module in block.code and importlib.util.find_spec(dependency) is None:
            pytest.skip(f"{dependency} lives in its own venv (make flink-test)")
    assert not any(isinstance(node, ast.Constant) and node.value is Ellipsis for node in ast.walk(ast.parse(block.code))), \
        "a literal ... stands for code the reader cannot run"
    result = run_block(block.code, tmp_path)
    assert result.returncode == 0, f"{block.id} failed:\n{result.stderr[-3000:]}"
    assert "assert" in block.code, f"{block.id} shows no visible check (a release count, an accuracy)"
