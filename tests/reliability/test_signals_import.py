"""Importing beam_dp changes nothing in the host process: no signal handler, no log filter or handler,
no method of Beam's runner (``pipelines.local_runner`` replaces some only while a job command runs), also
while ``python -m`` is locating a module (``sys.argv[0] == "-m"``). A user's package whose ``__init__``
imports beam_dp, run as ``python -m userpkg.mod``, gets its Ctrl-C as a plain
``KeyboardInterrupt`` (its ``except`` and ``finally`` run). The commands' own Ctrl-C, SIGTERM and
SIGHUP handling lives in ``beam_dp.cli.guarded`` (tests/reliability/test_signals_jobs.py).

Mutant checked: an import-time SIGINT handler that calls ``os._exit(130)`` while ``argv[0] == "-m"``
(what beam_dp installed before) fails the first test: exit 130, neither ``except`` nor ``finally`` ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = """
import sys, time
import beam_dp, beam_dp.cli, pipelines, pipelines.runner  # noqa: F401
print("ready", flush=True)
try:
    time.sleep(60)
    print("not interrupted")
except KeyboardInterrupt:
    print("caught KeyboardInterrupt", flush=True)
finally:
    print("finally ran", flush=True)
"""


def test_a_user_package_run_with_dash_m_gets_its_keyboard_interrupt(tmp_path):
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("import beam_dp  # noqa: F401\n")
    (package / "mod.py").write_text(USER_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "userpkg.mod"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.communicate()
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert stdout.splitlines() == ["caught KeyboardInterrupt", "finally ran"], (stdout, stderr)
    assert proc.returncode == 0, stderr


PROBE = """
import logging, signal, sys
sys.argv[0] = "-m"  # what runpy sets while it locates the module of `python -m`


def state():
    root = logging.getLogger()
    flags = logging.getLogger("apache_beam.options.pipeline_options")
    return ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}, root.filters[:],
            root.handlers[:], root.level, flags.filters[:])


before = state()
import beam_dp, beam_dp.cli, beam_dp.verify, pipelines, pipelines.runner, pipelines.outputs  # noqa: F401
import pipelines.continual_stats, pipelines.run_yaml  # noqa: F401  (no Beam import yet)
assert "apache_beam" not in sys.modules
assert state() == before, (before, state())
import apache_beam  # noqa: F401  (Beam's own import adds a root handler: not beam_dp's doing)
from apache_beam.runners.portability.fn_api_runner import execution
before, runner = state(), dict(vars(execution.GroupingBuffer))
import pipelines.common, pipelines.local_runner, beam_dp.beam, beam_dp.io.keys  # noqa: F401
assert state() == before, (before, state())
assert dict(vars(execution.GroupingBuffer)) == runner  # Beam's runner as Beam made it
named = [n for n, lg in logging.root.manager.loggerDict.items()
         if isinstance(lg, logging.Logger) and (lg.filters or lg.handlers) and n.startswith(("beam_dp", "pipelines"))]
assert not named, named
print("unchanged")
"""


def test_importing_beam_dp_and_the_jobs_changes_no_signal_and_no_logging():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "unchanged\n", done.stderr[-3000:]
