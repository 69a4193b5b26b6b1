"""The rates reproduction (benchmarks/reproduce_online_rates.py): its ``--smoke`` path runs every part
end to end, and its slope fit recovers a known power law."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "reproduce_online_rates.py"


def _module():
    spec = importlib.util.spec_from_file_location("reproduce_online_rates", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slope_ci_recovers_a_power_law():
    fit = _module().slope_ci([2, 4, 8, 16], [[3 * x**0.5 for x in (2, 4, 8, 16)], [5 * x**0.5 for x in (2, 4, 8, 16)]])
    assert math.isclose(fit["slope"], 0.5, rel_tol=1e-9)
    assert fit["ci95"] < 1e-9 and fit["seeds_left_out"] == 0


def test_slope_ci_leaves_out_non_positive_seeds():
    fit = _module().slope_ci([1, 2, 4], [[1.0, 2.0, 4.0], [1.0, -1.0, 4.0], [2.0, 4.0, 8.0]])
    assert fit["seeds_left_out"] == 1 and len(fit["seed_slopes"]) == 2
    assert math.isclose(fit["ci95"], 0.0, abs_tol=1e-9)


def test_smoke_run_writes_every_part(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": str(SCRIPT.parents[1])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "rates.json").read_text())
    assert {"cocol", "reg_d", "reg2_rate", "regime"} <= set(res)
    assert [sw["theory"] for sw in res["cocol"]] == [1.0, 0.5, -1.0, -1.0]
    for sw in res["cocol"]:
        for row in sw["rows"]:
            assert all(math.isfinite(v) for v in row["regret"] + row["non_private"])
    for sw in res["reg_d"]:
        for row in sw["rows"]:
            # excess against a 3,000-step FISTA optimum: never meaningfully below zero
            assert min(row["excess"]) > -1e-6 and min(row["theta0"]) > -1e-6
    r2 = res["reg2_rate"]["rows"]
    assert all(r["m"] < res["reg2_rate"]["d"] for r in r2)  # PRIVINCREG2 really projects
    assert np.all(np.diff([r["x"] for r in r2]) > 0)
    row = res["regime"]["rows"][0]
    assert {"REG1", "REG2 m=4"} <= set(row)
    assert (tmp_path / "online_rates_cocol.png").stat().st_size > 0
    assert (tmp_path / "online_rates_regression.png").stat().st_size > 0
    assert "slope vs T^1/3 W^2/3" in (tmp_path / "rates.md").read_text()
