"""The README's offline shell commands, run as shown: the demo (what ``make demo`` runs after installing),
then the report command of the README on the demo's output, and ``--help`` of every job."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from tests.docs.blocks import ROOT, all_blocks

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _make_demo_command() -> list[str]:
    """The demo command of the Makefile (``$(PY) -m pipelines.continual_stats ...``) with this interpreter."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "-m pipelines.continual_stats" in line and line.startswith("\t$(PY)"):
            return [sys.executable, *shlex.split(line.strip())[1:]]
    raise AssertionError("the Makefile has no demo command")


def _readme_command(starts: str) -> str:
    for block in all_blocks("bash"):
        if block.path.name == "README.md":
            for line in block.code.splitlines():
                if line.startswith(starts):
                    return line.split("  #")[0]
    raise AssertionError(f"no README command starts with {starts!r}")


@pytest.mark.slow
def test_demo_then_the_readme_report_command(tmp_path):
    demo = subprocess.run(_make_demo_command(), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "releases written under" in demo.stdout and "dead letters (raw data, not private)" in demo.stdout
    command = _readme_command("python -m beam_dp.report")
    report = subprocess.run(command.replace("python", shlex.quote(sys.executable), 1), shell=True, cwd=tmp_path,
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.startswith("beam_dp report: 6720 release rows from 2 files; 10 streams, steps released up to 336")
    assert "Traceback" not in report.stderr
    figures = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert "privacy_spend.png" in figures and len(figures) == 3


@pytest.mark.parametrize("job", ["continual_stats", "model_release", "growing_db_queries", "online_learning", "lifelong"])
def test_every_job_explains_its_options(job):
    result = subprocess.run([sys.executable, "-m", f"pipelines.{job}", "--help"], env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "--output" in result.stdout
    assert "Traceback" not in result.stderr
