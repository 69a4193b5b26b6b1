"""A real standalone Flink cluster (JobManager and TaskManager JVMs on localhost, from the PyFlink
distribution) runs the submittable job with ``flink run`` as docs/engines.md shows; its TaskManager is
killed (``kill -9``) mid-run once a checkpoint exists, a new one is started, and Flink recovers from the
checkpoint on local disk. Needs .venv-flink and Java; several minutes on a shared
2-core machine, so it is marked long (``make flink-test-long``, out of CI's budget)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.cases import assert_rows_equal, csv_lines, entry_args, expected_rows, good_events  # noqa: E402
from tests.flink.standalone import StandaloneCluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(shutil.which("java") is None, reason="a standalone Flink cluster needs Java")]

ROOT = Path(__file__).resolve().parents[2]
# enough events that the job is still reading them when its first checkpoints complete (~1 ms each; at
# 20,000 a quiet machine once finished the job before its second checkpoint)
EVENTS = 50_000


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.startswith(".")
            and f.name != "_beam_dp_manifest.json" for line in f.read_text().splitlines() if line]


def test_a_killed_taskmanager_recovers_from_its_checkpoint_with_nothing_lost_and_nothing_twice(tmp_path):
    """Streaming mode (steps close and release while events are read; the file sink commits on
    checkpoints), the same input twice on one cluster: a clean run, then a run whose TaskManager is
    killed. After the kill, the source re-reads from the checkpointed offsets and the keyed state
    (per-step sums, the counter's state) is the checkpoint's: a record counted twice or lost would change
    a sum by at least one clipped contribution, a release lost or written twice changes the (stream,
    step) list, which is compared exactly. Values are compared with rtol/atol 1e-9: the same float sums,
    in the same order unless a restore regroups them (error ~1e-13 here)."""
    events = good_events(EVENTS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text(csv_lines(events))
    package = shutil.make_archive(str(tmp_path / "beam_dp"), "zip", ROOT, "beam_dp")  # what -pyfs ships
    env = {"BEAM_DP_NOISE_KEY": TEST_KEY.hex(), "PYTHONPATH": ""}  # beam_dp comes from the zip alone

    def submit(cluster: StandaloneCluster, name: str):
        return cluster.submit(["-pym", "beam_dp.flink.run", "-pyfs", package,
                               *entry_args(tmp_path / "in", tmp_path / name, "--streaming", "--checkpoint-ms", "500",
                                           "--checkpoint-dir", str(tmp_path / f"{name}.checkpoints"))])

    with StandaloneCluster(tmp_path / "cluster", env=env) as cluster:
        first = cluster.start_taskmanager()
        assert submit(cluster, "clean").wait(900) == 0, cluster.log_tail()
        client = submit(cluster, "killed")

        def running_job() -> str | None:
            jobs = [j for j in cluster.rest("/jobs/overview")["jobs"] if j["state"] not in ("FINISHED", "FAILED")]
            return jobs[0]["jid"] if jobs and jobs[0]["state"] == "RUNNING" else None

        job = cluster.wait(running_job, 600, "the submitted job")
        cluster.wait(lambda: cluster.rest(f"/jobs/{job}/checkpoints")["counts"]["completed"] >= 2, 600,
                     "two completed checkpoints")
        assert running_job() == job, "the job ended before the kill: give it more events"
        os.kill(first.pid, signal.SIGKILL)  # the TaskManager's JVM (start-foreground execs java)
        cluster.start_taskmanager()
        assert client.wait(900) == 0, cluster.log_tail()
        counts = cluster.rest(f"/jobs/{job}/checkpoints")["counts"]
        assert counts["restored"] >= 1, counts  # it recovered from a checkpoint, not from the start
        assert cluster.rest(f"/jobs/{job}")["state"] == "FINISHED"
    clean = sorted(_rows(tmp_path / "clean"), key=lambda r: (r["stream"], r["step"]))
    assert {r["step"] for r in clean} >= set(range(1, 8)) and {r["stream"] for r in clean} == {"a", "b", "silent"}
    assert_rows_equal(_rows(tmp_path / "killed"), clean)
    assert_rows_equal(clean, [r for r in expected_rows(events, "continual-sums") if r["step"] <= max(
        r["step"] for r in clean)])  # the clean run: the pure replay's releases (counter "tree": cases.BUILD)
    assert sorted(_rows(tmp_path / "killed.private"), key=str) == sorted(_rows(tmp_path / "clean.private"), key=str)
