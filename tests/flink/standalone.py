"""A standalone Flink cluster on localhost from the PyFlink distribution: one JobManager and TaskManagers
as separate JVM processes (``bin/jobmanager.sh`` / ``bin/taskmanager.sh start-foreground``), every file
they write (logs, working and temp folders) under one folder, on free ports.

    with StandaloneCluster(tmp_path, env={"BEAM_DP_NOISE_KEY": ...}) as cluster:
        tm = cluster.start_taskmanager()
        client = cluster.submit(["-pym", "beam_dp.flink.run", "-pyfs", "beam_dp.zip", "--input", ...])
        os.kill(tm.pid, signal.SIGKILL)   # the TaskManager's JVM itself (start-foreground execs java)

Each process is started in its own session and ended by its process group at exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyflink

FLINK_HOME = Path(pyflink.__file__).parent
_JAVA_OPTS = [line.split("all:", 1)[1].strip() for line in (FLINK_HOME / "conf" / "config.yaml").read_text().splitlines()
              if line.strip().startswith("all:")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    """JobManager and TaskManagers on localhost; ``env``: extra environment of every process (a Python
    worker inherits its TaskManager's); ``slots``: task slots per TaskManager; ``settings``: more Flink
    configuration (over the defaults below)."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None, slots: int = 1,
                 settings: dict | None = None) -> None:
        self.folder = folder
        self.rest_port = _free_port()
        conf, tmp = folder / "conf", folder / "tmp"
        for path in (conf, tmp, folder / "log"):
            path.mkdir(parents=True, exist_ok=True)
        for name in ("log4j-console.properties", "log4j-cli.properties", "logback-console.xml", "logback.xml"):
            (conf / name).write_text((FLINK_HOME / "conf" / name).read_text())
        settings = {
            "env.java.opts.all": " ".join(_JAVA_OPTS + [f"-Djava.io.tmpdir={tmp}"]),
            "jobmanager.rpc.address": "localhost", "jobmanager.bind-host": "localhost",
            "jobmanager.rpc.port": _free_port(), "jobmanager.memory.process.size": "1024m",
            "taskmanager.host": "localhost", "taskmanager.bind-host": "localhost",
            "taskmanager.numberOfTaskSlots": slots, "taskmanager.memory.process.size": "1536m",
            "rest.address": "localhost", "rest.bind-address": "localhost", "rest.port": self.rest_port,
            "io.tmp.dirs": str(tmp), "process.working-dir": str(tmp),
            # a lost TaskManager is noticed in 10 s, not after the default 50 s heartbeat timeout
            "heartbeat.interval": 1000, "heartbeat.timeout": 10000,
            # a job waits for slots while no TaskManager is up: 20 tries a second apart ran out here while
            # a replacement TaskManager started on a loaded machine (NoResourceAvailableException)
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 1000,
            "restart-strategy.fixed-delay.delay": "2 s",
            **(settings or {}),
        }
        (conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
        self.env = {**os.environ, **(env or {}), "FLINK_HOME": str(FLINK_HOME), "FLINK_CONF_DIR": str(conf),
                    "FLINK_LOG_DIR": str(folder / "log"), "FLINK_PID_DIR": str(folder),
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        self._processes: list[subprocess.Popen] = []

    def _start(self, script: str, name: str, *args: str) -> subprocess.Popen:
        log = open(self.folder / "log" / f"{name}-{len(self._processes)}.out", "wb")
        process = subprocess.Popen([str(FLINK_HOME / "bin" / script), *args], env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, cwd=self.folder)
        log.close()
        self._processes.append(process)
        return process

    def rest(self, path: str, body: dict | None = None) -> dict:
        """GET ``path`` of the REST API, or POST ``body`` (JSON) to it."""
        request = urllib.request.Request(f"http://localhost:{self.rest_port}{path}", method="GET" if body is None
                                         else "POST", data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def __enter__(self) -> "StandaloneCluster":
        self._start("jobmanager.sh", "jobmanager", "start-foreground")
        self.wait(lambda: self.rest("/overview"), 300, "the JobManager's REST endpoint")
        return self

    def start_taskmanager(self) -> subprocess.Popen:
        """A new TaskManager; returns once the JobManager counts it (its ``pid`` is the JVM's)."""
        def ids() -> set[str]:
            return {tm["id"] for tm in self.rest("/taskmanagers")["taskmanagers"]}

        before = ids()
        process = self._start("taskmanager.sh", "taskmanager", "start-foreground")
        self.wait(lambda: ids() - before, 300, "the new TaskManager")
        return process

    def submit(self, args: list[str]) -> subprocess.Popen:
        """``flink run -m localhost:<rest port> ARGS`` (attached: it exits when the job ends)."""
        return self._start("flink", "client", "run", "-m", f"localhost:{self.rest_port}", "-pyclientexec",
                           sys.executable, "-pyexec", sys.executable, *args)

    def command(self, action: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """``flink ACTION -m localhost:<rest port> ARGS`` run to its end (e.g. ``stop --savepointPath DIR JOB``),
        its output captured as text."""
        return subprocess.run([str(FLINK_HOME / "bin" / "flink"), action, "-m", f"localhost:{self.rest_port}", *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.folder)

    def stop_with_savepoint(self, job: str, client: subprocess.Popen, folder: Path) -> str:
        """Stop ``job`` with a savepoint under ``folder`` (not drained: no end-of-input watermark) at once, wait
        for its ``client`` to exit 0; the savepoint's path."""
        trigger = self.rest(f"/jobs/{job}/stop", {"targetDirectory": str(folder), "drain": False})["request-id"]
        done = self.wait(lambda: (lambda s: s if s["status"]["id"] == "COMPLETED" else None)(
            self.rest(f"/jobs/{job}/savepoints/{trigger}")), 600, "the savepoint")
        assert "location" in done["operation"], (done, "the job ended before its stop: give it more events")
        assert client.wait(600) == 0, self.log_tail()
        return done["operation"]["location"]

    def log_tail(self, chars: int = 4000) -> str:
        """The end of every log of the cluster's processes (for a failing test's message)."""
        return "\n".join(f"== {f.name}\n{f.read_text(errors='replace')[-chars:]}"
                         for f in sorted((self.folder / "log").iterdir()))

    def wait(self, ready, seconds: float, what: str):
        """Poll ``ready()`` until it returns a true value (errors count as not yet); a timeout's message ends
        with the cluster's logs."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                value = ready()
            except OSError:
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"waited {seconds} s for {what}\n{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        # each process was started in its own session, so its group holds it and its children (a killed
        # TaskManager's Python worker included): end the groups, SIGTERM first
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for process in reversed(self._processes):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
            for process in self._processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    pass
