"""benchmarks/reproduce_online_regression.py at large-d settings made small (issue 27.5): ``--dim`` runs the
regime part with PRIVINCREG1/2 on the torch backend (CPU here; ``--device cuda`` on a GPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "reproduce_online_regression.py"


def test_dim_flag_runs_the_regime_on_torch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[1])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dim", "12", "--regime-T", "24", "--regime-m", "4",
                           "--backend", "torch", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "regime.json").read_text())["regime"]
    assert [(r["algo"], r["d"], r["T"]) for r in rows] == [("privincreg1", 12, 24), ("privincreg2", 12, 24),
                                                          ("privincerm", 12, 24)]
    assert [(r["backend"], r["device"]) for r in rows][:2] == [("torch", "cpu")] * 2
    assert rows[2]["device"] == "cpu"  # PRIVINCERM has numpy only
    assert all(r["excess_per_sample"] > -1e-6 for r in rows)  # against a 3,000-step FISTA optimum
