"""A standalone Flink cluster of two TaskManagers with two slots each (``tests/flink/standalone.py``) runs the
submittable job at parallelism 4 in streaming mode: (a) one TaskManager is killed (``kill -9``) after two
checkpoints and a new one started: the releases are the pure replay's, nothing lost, nothing twice; (b) the
job is stopped with a savepoint, resumed at parallelism 2, stopped again and resumed at 3 (with another
checkpoint interval and split size, which touch no state): the same releases; (c) a resume from the savepoint
with a changed privacy parameter (epsilon, clip bound, counter, noise domain) is refused at start with one
line, no job submitted, the output untouched. One cluster runs every job. Needs .venv-flink and Java;
minutes on a shared 2-core machine, so it is marked long (``make flink-test-long``, out of CI's budget)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.cases import assert_rows_equal, csv_lines, entry_args, expected_rows, good_events  # noqa: E402
from tests.flink.standalone import StandaloneCluster  # noqa: E402
from tests.flink.test_cluster_metrics import OPERATIONS, _cluster_lib  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(shutil.which("java") is None, reason="a standalone Flink cluster needs Java")]

ROOT = Path(__file__).resolve().parents[2]
#: enough events that a job is still reading them after its checkpoints (the kill) and its stops
EVENTS = 80_000
#: a resume with each of these is refused: they change the calibration the savepoint's noise cells are bound to
CHANGED = {"epsilon": ("--epsilon", "2"), "clip bound": ("--clip-bound", "2"), "counter": ("--counter", "auto"),
           "noise domain": ("--noise-domain", "other")}


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.startswith(".")
            and f.name != "_beam_dp_manifest.json" for line in f.read_text().splitlines() if line]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_kill_a_rescale_and_a_changed_parameter_on_a_two_taskmanager_cluster(tmp_path):
    """Releases are compared with the pure replay's (``cases.expected_rows``, counter "tree") with rtol/atol
    1e-9 (float sums regrouped by a restore): a record counted twice or lost changes a sum by at least one
    clipped contribution, a release lost or written twice changes the (stream, step) list, compared exactly."""
    events = good_events(EVENTS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text(csv_lines(events))
    package = shutil.make_archive(str(tmp_path / "beam_dp"), "zip", ROOT, "beam_dp")  # what -pyfs ships
    env = {"BEAM_DP_NOISE_KEY": TEST_KEY.hex(), "PYTHONPATH": "", "FLINK_LIB_DIR": str(_cluster_lib(tmp_path / "lib"))}

    def job_args(name: str, parallelism: int, *extra: str) -> list[str]:
        return ["-pym", "beam_dp.flink.run", "-pyfs", package, *entry_args(
            tmp_path / "in", tmp_path / name, "--streaming", "--checkpoint-ms", "500", "--parallelism",
            str(parallelism), "--checkpoint-dir", str(tmp_path / f"{name}.checkpoints"), *extra)]

    with StandaloneCluster(tmp_path / "cluster", env=env, slots=2, settings=OPERATIONS) as cluster:
        def running_job() -> str | None:
            jobs = [j for j in cluster.rest("/jobs/overview")["jobs"] if j["state"] not in ("FINISHED", "FAILED",
                                                                                            "CANCELED")]
            return jobs[0]["jid"] if jobs and jobs[0]["state"] == "RUNNING" else None

        def checkpointed(job: str, completed: int) -> None:
            cluster.wait(lambda: cluster.rest(f"/jobs/{job}/checkpoints")["counts"]["completed"] >= completed, 600,
                         f"{completed} completed checkpoints")
            assert running_job() == job, "the job ended before it was interrupted: give it more events"

        def all_running(job: str) -> bool:
            """Every task of ``job`` running (or its source subtasks without a split finished)."""
            vertices = cluster.rest(f"/jobs/{job}")["vertices"]
            return all(v["status"] in ("RUNNING", "FINISHED") for v in vertices) and any(
                v["status"] == "RUNNING" for v in vertices)

        def stop(job: str, client) -> str:
            return cluster.stop_with_savepoint(job, client, tmp_path / "savepoints")

        first = cluster.start_taskmanager()
        cluster.start_taskmanager()

        # (a) a TaskManager killed after two checkpoints, a new one started
        client = cluster.submit(job_args("killed", 4))
        job = cluster.wait(running_job, 600, "the submitted job")
        checkpointed(job, 2)
        os.kill(first.pid, signal.SIGKILL)  # the TaskManager's JVM (start-foreground execs java)
        cluster.start_taskmanager()
        assert client.wait(900) == 0, cluster.log_tail()
        counts = cluster.rest(f"/jobs/{job}/checkpoints")["counts"]
        assert counts["restored"] >= 1, counts  # it recovered from a checkpoint, not from the start

        # (b) stopped with a savepoint at parallelism 4 ...
        client = cluster.submit(job_args("rescaled", 4))
        job = cluster.wait(running_job, 600, "the submitted job")
        checkpointed(job, 1)
        savepoint = stop(job, client)
        before, jobs = _files(tmp_path / "rescaled"), len(cluster.rest("/jobs/overview")["jobs"])

        # (c) ... a resume with a changed privacy parameter is refused before any job is submitted
        def refused(flags: tuple[str, ...]):
            return cluster.command("run", "-s", savepoint, "-pyclientexec", sys.executable, "-pyexec", sys.executable,
                                   *job_args("rescaled", 2, *flags))

        with ThreadPoolExecutor(len(CHANGED)) as pool:
            for what, result in zip(CHANGED, pool.map(refused, CHANGED.values())):
                errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
                assert result.returncode != 0 and len(errors) == 1, (what, result.stdout, result.stderr)
                assert "other privacy parameters" in errors[0], (what, errors)
        assert len(cluster.rest("/jobs/overview")["jobs"]) == jobs and _files(tmp_path / "rescaled") == before

        # ... resumed at parallelism 2, stopped again, resumed at 3 with changes that touch no state
        client = cluster.submit(["-s", savepoint, *job_args("rescaled", 2)])
        job = cluster.wait(running_job, 600, "the job resumed at parallelism 2")
        cluster.wait(lambda: all_running(job), 600, "the resumed job's tasks")
        assert cluster.rest(f"/jobs/{job}/checkpoints")["counts"]["restored"] == 1
        savepoint = stop(job, client)
        client = cluster.submit(["-s", savepoint, *job_args("rescaled", 3, "--checkpoint-ms", "700", "--split-mib",
                                                            "2")])
        job = cluster.wait(running_job, 600, "the job resumed at parallelism 3")
        assert client.wait(900) == 0, cluster.log_tail()
        assert cluster.rest(f"/jobs/{job}")["state"] == "FINISHED"
        assert {v["parallelism"] for v in cluster.rest(f"/jobs/{job}")["vertices"]
                if v["name"].startswith("continual-sums")} == {3}

    killed = sorted(_rows(tmp_path / "killed"), key=lambda r: (r["stream"], r["step"]))
    assert {r["step"] for r in killed} >= set(range(1, 8)) and {r["stream"] for r in killed} == {"a", "b", "silent"}
    want = [r for r in expected_rows(events, "continual-sums") if r["step"] <= max(r["step"] for r in killed)]
    assert_rows_equal(killed, want)
    assert_rows_equal(_rows(tmp_path / "rescaled"), want)
