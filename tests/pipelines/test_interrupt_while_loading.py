"""Ctrl-C while ``python -m pipelines.<job>`` is still loading its modules (found by the fuzz
campaign: an interrupt in the first ~0.3 s printed an import traceback) is one line and exit 130;
importing ``pipelines`` any other way leaves SIGINT alone, and ``guarded`` gives the run its
KeyboardInterrupt back. Mutant checked: without the handler in pipelines/__init__.py the first test
gets a traceback and exit -2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: what runpy does for ``-m`` (argv[0] is "-m" while the package is located), then a Ctrl-C mid-import
LOADING = ("import os, signal, sys, time; sys.argv[0] = '-m'; import pipelines; "
           "os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not interrupted')")


def test_a_ctrl_c_while_a_job_loads_is_one_line_and_exit_130():
    done = subprocess.run([sys.executable, "-c", LOADING], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and done.stderr == "python -m pipelines: interrupted\n", done.stderr[-2000:]
    assert done.stdout == ""


def test_importing_pipelines_otherwise_leaves_sigint_alone():
    import pipelines  # noqa: F401  (already imported by the tests: argv[0] is pytest's)

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_guarded_gives_the_run_its_keyboard_interrupt_back(monkeypatch):
    from beam_dp.cli import guarded
    from pipelines import _interrupted_while_loading

    previous = signal.signal(signal.SIGINT, _interrupted_while_loading)
    try:
        assert guarded("prog", False, lambda: int(signal.getsignal(signal.SIGINT) is signal.default_int_handler),
                       (ValueError,), command=True) == 1
    finally:
        signal.signal(signal.SIGINT, previous)
