"""Progress of a long read: after a few seconds, files and releases read so far and the time taken.
On a terminal, one line on stderr redrawn in place and erased at the end; otherwise INFO lines of the
``beam_dp.report`` logger. Counts and times only, never data."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

__all__ = ["ReadProgress"]

log = logging.getLogger("beam_dp.report")


class ReadProgress:
    """``update(files_done, releases)`` after each batch; shown from ``after`` seconds on, every
    ``every`` seconds (default: 0.5 on a terminal, 10 in a log); ``close()`` erases the terminal line."""

    def __init__(self, files: int, stream: TextIO | None = None, after: float = 3.0, every: float | None = None,
                 terminal: bool | None = None) -> None:
        """Args:
            files: how many files the read covers.
            stream: where a terminal line goes (default: ``sys.stderr``).
            after: seconds before the first line.
            every: seconds between lines.
            terminal: draw on ``stream`` (True) or log (False); default: whether ``stream`` is a terminal.
        """
        self.files, self.stream, self.after = files, stream or sys.stderr, after
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.every = every if every is not None else (0.5 if self.terminal else 10.0)
        self._start = time.monotonic()
        self._next = self._start + after
        self._width = 0

    def text(self, files_done: int, releases: int, elapsed: float) -> str:
        return f"read {files_done}/{self.files} files, {releases:,} releases, {elapsed:.0f} s"

    def update(self, files_done: int, releases: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        text = self.text(files_done, releases, now - self._start)
        if self.terminal:
            text = f"beam_dp report: {text}"
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = len(text)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
