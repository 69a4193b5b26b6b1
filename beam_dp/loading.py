"""Ctrl-C while ``python -m <package>.<module>`` is still loading its modules (the first second or so,
before :func:`beam_dp.cli.guarded` takes over) is one line and exit code 130, like one during the run,
instead of an import traceback. Installed by the ``beam_dp`` and ``pipelines`` packages; importing
them any other way leaves SIGINT alone."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["install_while_loading"]


def install_while_loading(package: str) -> None:
    """While ``python -m`` locates a module of ``package`` (``sys.argv[0] == "-m"``) and SIGINT is
    Python's default (or an outer package's handler of this kind), make a Ctrl-C print ``python -m <module>: interrupted`` and exit 130. The
    handler is marked ``while_loading``: ``guarded`` gives the run its KeyboardInterrupt back."""
    current = signal.getsignal(signal.SIGINT)
    if sys.argv[:1] != ["-m"] or not (current is signal.default_int_handler or getattr(current, "while_loading", False)):
        return

    def interrupted_while_loading(signum, frame) -> None:
        argv = getattr(sys, "orig_argv", [])
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else package
        sys.stderr.write(f"python -m {module}: interrupted\n")
        sys.stderr.flush()
        os._exit(130)

    interrupted_while_loading.while_loading = True
    signal.signal(signal.SIGINT, interrupted_while_loading)
