"""The Flink job's ``beam_dp`` metrics as Flink's REST API serves them, read from a real standalone cluster
(JobManager and TaskManager JVMs from the PyFlink distribution, ``tests/flink/standalone.py``) under the
operations settings docs/engines.md gives: several jobs run one after another on one TaskManager, which
stays up; what the release function counts in ``on_timer`` (releases, timer firings, the steps it closes)
reaches the REST API, buffered items go down as steps close, dead letters are counted per reason, no
metric name collides, and no checkpoint failure ever fails a job. Needs .venv-flink and Java;
minutes on a shared 2-core machine, so it is marked long (``make flink-test-long``, out of CI's budget)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.cases import BAD, csv_lines, entry_args, good_events  # noqa: E402
from tests.flink.standalone import FLINK_HOME, StandaloneCluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(shutil.which("java") is None, reason="a standalone Flink cluster needs Java")]

ROOT = Path(__file__).resolve().parents[2]
#: the cluster settings of docs/engines.md ("Operating it: metrics and cluster settings") beyond standalone.py's
OPERATIONS = {
    "taskmanager.memory.jvm-metaspace.size": "512m",
    "execution.checkpointing.timeout": "10 min",
    "execution.checkpointing.tolerable-failed-checkpoints": 10,
    "metrics.fetcher.update-interval": 1000,  # the REST API's metrics at most 1 s old (default 10 s)
}
METRICS = ("releases", "timer_firings", "unreadable_states", "dead_letters", "buffered_items", "last_closed_step",
           "last_closed_step_lag_ms")
JOBS = 3  # one after another on one TaskManager
#: MiB of metaspace a job may leave behind once one has run (each job's own copy of PyFlink's runtime
#: classes, ~28 MiB never given back, is what the cluster's lib/ avoids)
METASPACE_PER_JOB = 8
#: checkpoints declined while a task starts (its Python worker not up yet) or closes (its mailbox closed, or
#: gone), or aborted as the finished job's coordinator stops: Flink does not count them against the
#: tolerable failures, and a job never fails on them
START_AND_END = ("tasks not ready", "task is closing", "unknown task", "Coordinator is suspending")


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.startswith(".")
            and f.name != "_beam_dp_manifest.json" for line in f.read_text().splitlines() if line]


def _release_vertex(cluster: StandaloneCluster, job: str) -> str:
    return next(v["id"] for v in cluster.rest(f"/jobs/{job}")["vertices"] if v["name"].startswith("continual-sums"))


def _sample(cluster: StandaloneCluster, job: str, vertex: str) -> dict[str, float]:
    """The release function's beam_dp metrics now (subtask 0), by name (``dead_letters_<reason>`` too)."""
    ids = [m["id"] for m in cluster.rest(f"/jobs/{job}/vertices/{vertex}/metrics") if ".beam_dp." in m["id"]]
    if not ids:
        return {}
    values = cluster.rest(f"/jobs/{job}/vertices/{vertex}/metrics?get=" + ",".join(ids))
    return {m["id"].split(".beam_dp.", 1)[1]: float(m["value"]) for m in values}


def _cluster_lib(folder: Path) -> Path:
    """The cluster's classpath folder (``FLINK_LIB_DIR``): the distribution's lib/ and its
    opt/flink-python jar, so that PyFlink's runtime is loaded once per TaskManager, not once per job."""
    folder.mkdir()
    for jar in [*(FLINK_HOME / "lib").glob("*.jar"), *(FLINK_HOME / "opt").glob("flink-python*.jar")]:
        os.symlink(jar, folder / jar.name)
    return folder


def test_metrics_reach_the_rest_api_and_one_taskmanager_runs_job_after_job(tmp_path):
    events = sorted(good_events(20_000) + [e for e, _ in BAD], key=lambda e: e[1])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text(csv_lines(events))
    package = shutil.make_archive(str(tmp_path / "beam_dp"), "zip", ROOT, "beam_dp")
    cluster = StandaloneCluster(tmp_path / "cluster", env={"BEAM_DP_NOISE_KEY": TEST_KEY.hex(), "PYTHONPATH": "",
                                                           "FLINK_LIB_DIR": str(_cluster_lib(tmp_path / "lib"))})
    with open(cluster.folder / "conf" / "config.yaml", "a") as fh:
        fh.write("".join(f"{k}: {v}\n" for k, v in OPERATIONS.items()))
    metaspace = []
    with cluster:
        cluster.start_taskmanager()
        (taskmanager,) = [tm["id"] for tm in cluster.rest("/taskmanagers")["taskmanagers"]]
        for run in range(JOBS):
            out = tmp_path / f"out{run}"
            client = cluster.submit(["-pym", "beam_dp.flink.run", "-pyfs", package, *entry_args(
                tmp_path / "in", out, "--streaming", "--checkpoint-ms", "500")])
            job = cluster.wait(lambda: next((j["jid"] for j in cluster.rest("/jobs/overview")["jobs"]
                                             if j["state"] == "RUNNING"), None), 600, f"job {run}")
            vertex = _release_vertex(cluster, job)
            samples = []
            while client.poll() is None:
                try:
                    samples.append(_sample(cluster, job, vertex))
                except OSError:  # the job ended between two requests
                    pass
                time.sleep(0.5)
            assert client.returncode == 0, cluster.log_tail()
            samples = [s for s in samples if s]
            checkpoints = cluster.rest(f"/jobs/{job}/checkpoints")
            assert cluster.rest(f"/jobs/{job}")["state"] == "FINISHED"
            assert cluster.rest(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"] == []  # never restarted
            assert checkpoints["counts"]["completed"] >= 1 and checkpoints["counts"]["restored"] == 0
            failures = [c.get("failure_message") or "" for c in checkpoints["history"] if c["status"] == "FAILED"]
            assert all(any(why in f for why in START_AND_END) for f in failures), failures
            time.sleep(2)  # the TaskManager's metrics as of the job's end
            (used,) = cluster.rest(f"/taskmanagers/{taskmanager}/metrics?get=Status.JVM.Memory.Metaspace.Used")
            metaspace.append(int(float(used["value"])) >> 20)
            print(f"job {run}: {len(samples)} samples, checkpoints {checkpoints['counts']}, metaspace {metaspace[-1]} MiB")

            releases, dead = _rows(out), _rows(Path(f"{out}.private"))
            assert samples and set(METRICS) <= set(samples[-1]), samples[-1:]
            series = {name: [s[name] for s in samples if name in s] for name in samples[-1]}
            assert 0 < max(series["releases"]) <= len(releases)  # counted in on_timer: it reaches Flink now
            assert max(series["timer_firings"]) > 0 and max(series["unreadable_states"]) == 0
            steps = series["last_closed_step"]
            assert steps == sorted(steps) and steps[-1] >= 3  # the steps firings close, in order
            assert samples[-1]["last_closed_step_lag_ms"] > 0  # the events' clock (1970) trails the wall clock
            held = series["buffered_items"]
            assert max(held) <= 3 * 3  # at most 3 streams x the few steps open at once
            assert any(b < a for a, b in zip(held, held[1:])), held  # items leave the buffer as steps close
            # the bad rows come first (event time): their letters are counted long before the last sample
            assert {d["reason"] for d in dead} == {why for _, why in BAD} and samples[-1]["dead_letters"] == len(dead)
            assert all(samples[-1][f"dead_letters_{why}"] == 1 for _, why in BAD)  # per reason, beside the total
        assert [tm["id"] for tm in cluster.rest("/taskmanagers")["taskmanagers"]] == [taskmanager]
        logs = "\n".join(f.read_text(errors="replace") for f in (cluster.folder / "log").iterdir())
    assert "OutOfMemoryError" not in logs
    assert metaspace[-1] - metaspace[1] <= METASPACE_PER_JOB * (JOBS - 2), metaspace  # bounded: job after job
    # no beam_dp metric collides (Flink's own file sink committer registers 'pendingCommittables' twice)
    collided = set(re.findall(r"Name collision: .*? name '([^']+)'", logs))
    assert collided <= {"pendingCommittables"}, collided
