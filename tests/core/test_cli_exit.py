"""``beam_dp.cli.exit_now``: a command's process ends with its code through the interpreter's own exit
(exit handlers run, output flushed, a running thread waited for); the job commands end through it."""

from __future__ import annotations

import inspect
import subprocess
import sys

_PROBE = """
import atexit, sys, threading, time
from beam_dp.cli import exit_now
atexit.register(lambda: open(sys.argv[1], "w").write("handlers ran"))
if sys.argv[2] == "thread":
    threading.Thread(target=time.sleep, args=(0.5,)).start()
print("printed before", end="")  # no newline: still buffered when the process ends
exit_now(3)
print(" and after", end="")
"""


def _probe(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, str]:
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(marker), mode], capture_output=True, text=True,
                          timeout=60)
    return done, marker.read_text() if marker.exists() else ""


def test_the_process_ends_with_its_code_its_exit_handlers_run_and_its_output_flushed(tmp_path):
    done, marker = _probe(tmp_path, "alone")
    assert (done.returncode, done.stdout, marker) == (3, "printed before", "handlers ran")


def test_a_running_thread_is_waited_for(tmp_path):
    done, marker = _probe(tmp_path, "thread")  # the usual exit: the thread ends first, nothing after exit_now
    assert (done.returncode, done.stdout, marker) == (3, "printed before", "handlers ran")


def test_the_job_commands_end_through_it():
    from pipelines import runner

    source = inspect.getsource(runner.run_cli)
    assert "if command:" in source and "exit_now(code)" in source
