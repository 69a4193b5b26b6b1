"""How every beam_dp command ends (``python -m pipelines.<job>``, ``pipelines.run_yaml``,
``beam_dp.report``, ``beam_dp.verify``): a user error is one line ``<prog>: error: ...`` and exit
code 2, Ctrl-C one line and exit 130, any other failure one line and exit 1; ``--verbose`` shows the
traceback instead. No Beam import here."""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from typing import Callable

__all__ = ["OneLineParser", "exit_now", "guarded", "one_line"]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when empty), cut to 400 characters."""
    text = f"{exc}".strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:400]


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line ``<prog>: error: ...`` and exit 2 (no usage block)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def guarded(prog: str, verbose: bool, body: Callable[[], int], user_errors: tuple[type[BaseException], ...],
            kept: Callable[[], str] = lambda: "", command: bool = False) -> int:
    """``body()``, with every failure as one line on stderr: ``user_errors`` exit 2, Ctrl-C 130, any
    other exception 1 (re-raised with its traceback when ``verbose``). ``kept()``: a clause saying
    what a failed run left in place (``"; the previous output ... is kept"``), or empty; it ends
    every one of these lines.
    ``command``: this is the process's own command line: Ctrl-C ends it with exit code 130 at once
    (CPython exits by SIGINT instead when the interrupt landed in code run by ``exec``, e.g. while a
    dataclass was being built)."""
    if getattr(signal.getsignal(signal.SIGINT), "while_loading", False):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # see beam_dp/loading.py
    try:
        return body()
    except user_errors as exc:
        print(f"{prog}: error: {one_line(exc)}{kept()}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        return _interrupted(prog, kept(), command)
    except Exception as exc:
        if _is_interrupt(exc):  # a runner wraps a KeyboardInterrupt raised inside a DoFn
            return _interrupted(prog, kept(), command)
        if verbose:
            raise
        print(f"{prog}: failed: {type(exc).__name__}: {one_line(exc)}{kept()} (--verbose shows the traceback)",
              file=sys.stderr)
        raise SystemExit(1) from None


def _is_interrupt(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, KeyboardInterrupt) or f"{exc}".startswith("KeyboardInterrupt"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _interrupted(prog: str, kept: str, command: bool) -> int:
    print(f"{prog}: interrupted{kept}", file=sys.stderr)
    if command:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise SystemExit(130)


def exit_now(code: int) -> None:
    """End this command's process with ``code`` now, when no other thread is left: the exit handlers run
    (``atexit``: logging's flush, a runner's cleanup) and standard output and error are flushed, but the
    interpreter's teardown (freeing every module and object of numpy, Arrow, Beam, ~0.3 s of CPU after a
    job) is skipped, as mypy's ``--fast-exit`` does. Returns, and the process ends as usual, where a
    thread is still running (it would be cut off)."""
    if threading.active_count() > 1:
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
