"""Progress of a local run: time elapsed and an estimate of the time left from the input's size. On a
terminal, one line on stderr redrawn in place twice a second and erased when the run ends; otherwise
(logs, pipes, a scheduler) an INFO record of this module's logger every ~10 s. Never with data in it:
sizes and times only.

The estimate (:class:`Estimate`) keeps the start-up time apart from the per-byte time: before any work
is observed it is the prior ``STARTUP_SECONDS + size / BYTES_PER_SECOND``; once a caller reports the
bytes done, the rate is measured from the time since the first work was seen, so the start-up is not
spread over the bytes left."""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

__all__ = ["BYTES_PER_SECOND", "LOG_EVERY", "STARTUP_SECONDS", "Estimate", "Progress", "input_bytes"]

log = logging.getLogger(__name__)

#: Input read per second of a local run of the main job and its start-up time, fitted to the time
#: inside ``pipeline.run`` of ``continual_stats --count --window 24`` on a loaded shared 2-core x86_64
#: machine: 5.4 MB CSV, 10 streams x 336 steps: 6.4 s; 23.1 MB, 40 streams x 336 steps: 19.1 s.
#: The time also grows with streams x steps (1.2 MB, 200 streams x 200 steps: 34 s), which the input
#: size does not tell: the display says "about".
BYTES_PER_SECOND = 1.4e6
STARTUP_SECONDS = 2.5
#: seconds between two progress records when stderr is not a terminal
LOG_EVERY = 10.0


def input_bytes(patterns: list[str | None]) -> int | None:
    """Total size of the files matching ``patterns`` (None when there are none or they cannot be listed)."""
    from pipelines.paths import FileSystems

    total = 0
    try:
        for pattern in filter(None, patterns):
            total += sum(m.size_in_bytes for m in FileSystems().match([pattern])[0].metadata_list)
    except Exception:  # a listing error is reported by the job itself
        return None
    return total or None


@dataclass
class Estimate:
    """Seconds left of a run over ``size`` bytes.

    Args:
        size: bytes of input in all.
        rate: prior bytes per second, used until work is observed.
        startup: prior start-up seconds before the first byte is processed.
    """

    size: int
    rate: float = BYTES_PER_SECOND
    startup: float = STARTUP_SECONDS
    _first: tuple[float, int] | None = field(default=None, init=False, repr=False)

    def left(self, elapsed: float, done: int | None = None) -> float:
        """Seconds left after ``elapsed`` seconds with ``done`` bytes processed (None: not observed)."""
        if done is not None and done > 0 and self._first is None:
            self._first = (elapsed, done)  # start-up ends here: it is not per-byte time
        if self._first is not None and done is not None and done > self._first[1]:
            t0, d0 = self._first
            per_byte = (elapsed - t0) / (done - d0)
            return max(0.0, (self.size - done) * per_byte)
        return max(0.0, self.startup + self.size / self.rate - elapsed)


class Progress:
    """Context manager: while it is open, a daemon thread shows ``running: 12 s, about 30 s left``.

    Args:
        size: bytes of input (None: elapsed time only).
        stream: the terminal to draw on (default stderr); when it is not a terminal, records go to the log.
        enabled: False shows nothing; None (default) shows it.
        every: seconds between two redraws on a terminal.
        done: a callable giving the bytes processed so far, when the caller can observe them.
        log_every: seconds between two log records off a terminal.
    """

    def __init__(self, size: int | None, stream: TextIO | None = None, enabled: bool | None = None,
                 every: float = 0.5, done: Callable[[], int] | None = None, log_every: float = LOG_EVERY):
        self.size, self.stream, self.every, self.done = size, stream or sys.stderr, every, done
        self.enabled = enabled is not False
        self.terminal = self.stream.isatty()
        self.log_every = log_every
        self.estimate = Estimate(size) if size else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def line(self, elapsed: float, done: int | None = None) -> str:
        """The progress text after ``elapsed`` seconds (``done``: bytes processed, when observed)."""
        text = f"  running: {elapsed:.0f} s"
        if self.estimate is not None:
            left = self.estimate.left(elapsed, done)
            text += (f", about {left:.0f} s left" if left >= 1 else ", finishing") + \
                f" (estimate for {self.estimate.size / 1e6:.3g} MB of input)"
        return text

    def _show(self) -> None:
        start = time.monotonic()
        every = self.every if self.terminal else self.log_every
        while not self._stop.wait(every):
            text = self.line(time.monotonic() - start, self.done() if self.done else None)
            if self.terminal:
                self.stream.write("\r" + text.ljust(self._width))
                self.stream.flush()
                self._width = len(text)
            else:
                log.info("%s", text.strip())

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread = threading.Thread(target=self._show, name="beam_dp-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
