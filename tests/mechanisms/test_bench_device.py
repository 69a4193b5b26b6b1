"""CI-sized smoke test of benchmarks/bench_device.py (issue 27.6): ``--quick`` runs its CPU rows where there
is no GPU and replaces only its marked section of the output file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- bench_device:start -->", "<!-- bench_device:end -->"


def test_quick_run_writes_its_section(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(f"# intro\n\n{START}\nold table\n{END}\n\n## after\n", encoding="utf-8")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_device.py"), "--quick", "--devices", "cpu",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=300, cwd=ROOT)
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# intro\n") and text.endswith("## after\n") and "old table" not in text
    assert text.count(START) == 1 and text.count(END) == 1
    section = text.split(START)[1].split(END)[0]
    for workload in ("lifelong bounded, small", "lifelong l2dp, small", "ERM certified solver",
                     "PRIVINCREG1 torch", "PRIVINCREG1 numpy"):
        (row,) = [line for line in section.splitlines() if line.startswith(f"| {workload}")]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "cpu" and float(cells[3]) > 0
        assert float(re.match(r"[\d,.]+", cells[4]).group().replace(",", "")) > 0
    assert "| cuda |" not in section and "No CUDA device here" in section


def test_quick_run_writes_no_docs_by_default(tmp_path):
    """``--quick`` is a smoke test: without ``--out`` it leaves docs/performance.md (here: the cwd's) alone."""
    (tmp_path / "docs").mkdir()
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_device.py"), "--quick", "--devices",
                             "cpu"], check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert not (tmp_path / "docs" / "benchmarks.md").exists() and "not written (--quick)" in result.stdout
