"""How every beam_dp command ends (``python -m pipelines.<job>``, ``pipelines.run_yaml``,
``beam_dp.report``, ``beam_dp.verify``): a user error is one line ``<prog>: error: ...`` and exit
code 2, Ctrl-C one line and exit 130, SIGTERM and SIGHUP one line and exit 143 and 129 (the
process's own command line: what the run staged is removed first, as for Ctrl-C), any other failure
one line and exit 1; ``--verbose`` shows the traceback instead. Signal handlers and log filters are
set only while a command runs (:func:`guarded`), never when a module is imported. No Beam import here."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from typing import Callable, Iterator

__all__ = ["CommandError", "OneLineParser", "exit_now", "guarded", "one_line"]

#: signals a command ends on like a Ctrl-C (its staged output removed, one line), exit code 128 + number
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class CommandError(Exception):
    """A run that ended but must not look like a success: one line ``<prog>: error: ...``, exit ``code``."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


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
    """``body()``, with every failure as one line on stderr: ``user_errors`` exit 2, a
    :class:`CommandError` its code, Ctrl-C 130, any other exception 1 (re-raised with its traceback
    when ``verbose``). ``kept()``: a clause saying what a failed run left in place (``"; the previous
    output ... is kept"``), or empty; it ends every one of these lines.
    ``command``: this is the process's own command line: while ``body`` runs, SIGTERM and SIGHUP raise
    ``KeyboardInterrupt`` in the main thread (so every ``with`` block of the run cleans up, as for a
    Ctrl-C) and end the process with exit code 143 / 129; Ctrl-C ends it with exit code 130 at once
    (CPython exits by SIGINT instead when the interrupt landed in code run by ``exec``, e.g. while a
    dataclass was being built)."""
    _drop_third_party_import_noise()
    received: list[int] = []
    with _ending_signals_interrupt(received) if command else contextlib.nullcontext():
        try:
            return body()
        except user_errors as exc:
            print(f"{prog}: error: {one_line(exc)}{kept()}", file=sys.stderr)
            raise SystemExit(2) from None
        except CommandError as exc:
            print(f"{prog}: error: {one_line(exc)}{kept()}", file=sys.stderr)
            raise SystemExit(exc.code) from None
        except KeyboardInterrupt:
            return _interrupted(prog, kept(), command, received)
        except Exception as exc:
            if _is_interrupt(exc):  # a runner wraps a KeyboardInterrupt raised inside a DoFn
                return _interrupted(prog, kept(), command, received)
            if verbose:
                raise
            print(f"{prog}: failed: {type(exc).__name__}: {one_line(exc)}{kept()} (--verbose shows the traceback)",
                  file=sys.stderr)
            raise SystemExit(1) from None


@contextlib.contextmanager
def _ending_signals_interrupt(received: list[int]) -> Iterator[None]:
    """While open (main thread only): the first SIGTERM or SIGHUP is noted in ``received`` and raises
    ``KeyboardInterrupt``; a later one is only noted, so it cannot cut the cleanup short. A signal the
    process was started ignoring (``nohup``) or that the caller handles itself is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ending(signum: int, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, ending) for sig in ENDING_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _DropApitools(logging.Filter):
    """Beam's one root-logger warning when imported without its gcp extra ("apitools not found ..."):
    it concerns BigQuery, which beam_dp never uses."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("apitools not found")


def _drop_third_party_import_noise() -> None:
    """A command's run: drop :class:`_DropApitools`' warning from the root logger (once). Nothing else."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropApitools) for f in root.filters):
        root.addFilter(_DropApitools())


def _is_interrupt(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, KeyboardInterrupt) or f"{exc}".startswith("KeyboardInterrupt"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _interrupted(prog: str, kept: str, command: bool, received: list[int]) -> int:
    """One line; exit code 130 for Ctrl-C, 128 + the signal's number for SIGTERM / SIGHUP."""
    if received:
        name = signal.Signals(received[0]).name
        print(f"{prog}: terminated by {name}{kept}", file=sys.stderr)
        code = 128 + received[0]
    else:
        print(f"{prog}: interrupted{kept}", file=sys.stderr)
        code = 130
    if command:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def exit_now(code: int) -> None:
    """End a command's own process (``python -m ...``, never a library call) with ``code``
    (``SystemExit``), its objects frozen first (``gc.freeze``): the interpreter exits as usual (threads
    joined, exit handlers run, output flushed) but its final garbage collections skip the numpy, Arrow
    and Beam objects of the run (what that saves: docs/performance.md)."""
    gc.freeze()
    raise SystemExit(code)
