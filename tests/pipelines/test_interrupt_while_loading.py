"""Ctrl-C while ``python -m pipelines.<job>`` is still loading its modules (found by the fuzz
campaign: an interrupt in the first ~0.3 s printed an import traceback) is one line and exit 130;
importing ``pipelines`` any other way leaves SIGINT alone, and ``guarded`` gives the run its
KeyboardInterrupt back. The same holds for ``python -m beam_dp.verify`` / ``beam_dp.report`` (the
``beam_dp`` package installs the handler of :mod:`beam_dp.loading`). Mutant checked: without the
handler in pipelines/__init__.py the first test gets a traceback and exit -2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what runpy does for ``-m`` (argv[0] is "-m" while the package is located), then a Ctrl-C mid-import
LOADING = ("import os, signal, sys, time; sys.argv[0] = '-m'; import {package}; "
           "os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not interrupted')")


@pytest.mark.parametrize("package", ["pipelines", "beam_dp"])
def test_a_ctrl_c_while_a_command_loads_is_one_line_and_exit_130(package):
    done = subprocess.run([sys.executable, "-c", LOADING.format(package=package)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and done.stderr == f"python -m {package}: interrupted\n", done.stderr[-2000:]
    assert done.stdout == ""


def test_importing_pipelines_otherwise_leaves_sigint_alone():
    import beam_dp  # noqa: F401
    import pipelines  # noqa: F401  (already imported by the tests: argv[0] is pytest's)

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_guarded_gives_the_run_its_keyboard_interrupt_back(monkeypatch):
    from beam_dp.cli import guarded
    from beam_dp.loading import install_while_loading

    monkeypatch.setattr(sys, "argv", ["-m"])
    install_while_loading("pipelines")
    try:
        assert getattr(signal.getsignal(signal.SIGINT), "while_loading", False)
        for command in (True, False):  # the jobs' guard and the verifier's/report's
            assert guarded("prog", False, lambda: int(signal.getsignal(signal.SIGINT) is signal.default_int_handler),
                           (ValueError,), command=command) == 1
            install_while_loading("pipelines")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
