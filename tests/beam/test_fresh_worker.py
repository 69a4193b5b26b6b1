"""The step rules on a fresh worker (a NEW process, no history): a new stream first seen after the
watermark passed its steps never releases behind the watermark, and every release carries its step's
public time. Keyed by stream and by groups of streams (the job's default, 256)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_dp.core import StepClock
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline
ROOT = Path(__file__).parents[2]
CLOCK = StepClock(start=0.0, period=10.0)


@pytest.mark.parametrize("groups", [0, 256], ids=["by-stream", "by-256-groups"])
def test_a_new_stream_on_a_fresh_worker_starts_at_its_open_step(groups):
    env = dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.beam.fresh_worker_job", str(groups)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    releases = sorted(seen["releases"])
    # the watermark had closed steps 1..6 (65.5 s >= end(6) = 60 s) before "c" was seen: c's first
    # release is step 7 (its event's step), never an earlier one; at the end the furthest rung is step 16
    assert [step for _, step, _ in releases] == list(range(7, 17))
    # each release at its step's public time, end(step) (grace 0), exact integers of µs
    assert [t for _, _, t in releases] == [CLOCK.step_end_micros(step) for _, step, _ in releases]
    assert seen["dead"] == ["late"]  # the 30 s event (step 4) arrived after c's steps began
