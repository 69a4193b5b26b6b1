"""SIGTERM and SIGHUP (what schedulers, containers, ``timeout`` and a closed terminal send) end a job
like a Ctrl-C: one line on stderr, exit code 128 + the signal's number, the previous output byte for
byte, and no staging folder, lock or Beam temporary folder left (``beam_dp.cli.guarded``,
``pipelines.outputs.RunOutputs``, ``pipelines.runner.owned_pipeline``). A later run removes the
staging folders of a run that was killed outright (SIGKILL) and says so in one line.

Mutant checked: without the SIGTERM/SIGHUP handler of ``guarded`` the job dies with exit -15 / -1,
no line, and its staging folders, locks and ``beam-pipeline-temp*`` stay behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import continual_stats
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import tree

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m pipelines.continual_stats"
SCHEDULE = ["--start=0", "--period=1000", "--end=200000"]


def _events(path: Path, n: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    ts = np.sort(rng.uniform(0, 200_000, n))
    path.write_text("stream_id,timestamp,value\n" + "".join(
        f"s{s},{t:.3f},{v:.3f}\n" for s, t, v in zip(rng.integers(0, 200, n), ts, rng.normal(size=n))))
    return path


def _start(folder: Path, temp: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex(), TMPDIR=str(temp))
    # keyed by stream (--stream-groups=0): seconds of work inside the pipeline
    return subprocess.Popen([sys.executable, "-m", "pipelines.continual_stats", f"--input={folder / 'big.csv'}",
                             f"--output={folder / 'out'}", *SCHEDULE, "--stream-groups=0"], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """A folder with a finished run's output (small input) and a big input for the runs to stop."""
    folder = tmp_path_factory.mktemp("signals")
    _events(folder / "small.csv", 50)
    assert continual_stats.main([f"--input={folder / 'small.csv'}", f"--output={folder / 'out'}", *SCHEDULE]) == 0
    _events(folder / "big.csv", 200_000)
    return folder


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminated_job_says_so_keeps_the_previous_output_and_leaves_nothing(previous, tmp_path, sig):
    before = {name: tree(previous / name) for name in ("out", "out.private")}
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = _start(previous, temp)
    deadline = time.monotonic() + 120
    while not (list(temp.glob("beam-pipeline-temp*")) and list(previous.glob("out.staging-*"))):  # in the pipeline
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its pipeline"
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (proc.returncode, stderr[-3000:])
    assert stderr.splitlines() == [f"{PROG}: terminated by {name}; the previous output under "
                                   f"{previous / 'out'} is kept unchanged"], stderr[-3000:]
    assert stdout == ""
    assert {name: tree(previous / name) for name in ("out", "out.private")} == before
    assert sorted(p.name for p in previous.iterdir() if p.name.startswith("out")) == ["out", "out.private"]
    assert list(temp.iterdir()) == []  # no beam-pipeline-temp*, no spill file


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_later_run_removes_the_staging_folders_of_a_killed_run_and_says_so(tmp_path, capsys):
    """What a SIGKILL leaves (a lock of a process gone, two staging folders with partial output) is
    cleared by the next run into the folder, in one warning line; a user's folder of a similar name
    is left alone."""
    events = _events(tmp_path / "e.csv", 40)
    run = "20260101T000000-0123abcd"
    for name in ("out", "out.private"):
        (tmp_path / f"{name}.lock").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(),
                                                            "run": run}))
        staging = tmp_path / f"{name}.staging-{run}"
        staging.mkdir()
        (staging / "dead_letter-00000-of-00001.jsonl").write_bytes(b"x" * 300_000)
    (tmp_path / "out.staging-mine").mkdir()  # not a run id: not beam_dp's
    assert continual_stats.main([f"--input={events}", f"--output={tmp_path / 'out'}", *SCHEDULE]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "staging folder" in line]
    assert len(said) == 1 and "removed 2 staging folders left by runs that were killed" in said[0], err
    assert "0.6 MB" in said[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == [
        "out", "out.private", "out.staging-mine"]


def test_a_failed_run_in_place_names_only_files_that_exist_and_leaves_no_empty_folder(tmp_path):
    """A streaming (or remote) run writes in place: its error line says "files written so far" only when
    there are some, and a folder it made and left empty is removed."""
    from pipelines.outputs import RunOutputs

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with RunOutputs(str(out), str(tmp_path / "out.private"), staged=False) as outputs:
            raise RuntimeError("the pipeline failed")
    assert outputs.kept() == f"nothing was written under {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        with RunOutputs(str(out), str(tmp_path / "out.private"), staged=False) as outputs:
            (out / "sum-0123.jsonl").write_text("{}\n")
            raise RuntimeError("the pipeline failed")
    assert outputs.kept() == f"files written so far are under {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the raw-data folder held only its README
