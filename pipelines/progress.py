"""A one-line progress display on stderr for a local run: time elapsed and an estimate of the time
left from the input's size, redrawn in place twice a second, erased when the run ends. Shown only
when stderr is a terminal (never in logs, pipes or tests) and never with data in it: sizes and
times only."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

__all__ = ["BYTES_PER_SECOND", "STARTUP_SECONDS", "Progress", "input_bytes"]

#: Input read per second of a local run of the main job, and its start-up time: a rough rate (a
#: 1.28 MB CSV, 200 streams x 200 steps: 6.2 s CPU, 22 s wall on a loaded shared 2-core x86_64
#: machine); the time also depends on streams and steps, so the display says "about".
BYTES_PER_SECOND = 0.5e6
STARTUP_SECONDS = 4.0


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


class Progress:
    """Context manager: while it is open, a daemon thread redraws ``running: 12 s, about 30 s left``."""

    def __init__(self, size: int | None, stream: TextIO | None = None, enabled: bool | None = None,
                 every: float = 0.5):
        self.size, self.stream, self.every = size, stream or sys.stderr, every
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def line(self, elapsed: float) -> str:
        """The progress text after ``elapsed`` seconds."""
        text = f"  running: {elapsed:.0f} s"
        if self.size:
            left = STARTUP_SECONDS + self.size / BYTES_PER_SECOND - elapsed
            text += (f", about {left:.0f} s left" if left >= 1 else ", finishing") + \
                f" (estimate for {self.size / 1e6:.3g} MB of input)"
        return text

    def _draw(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(self.every):
            text = self.line(time.monotonic() - start)
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = len(text)

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread = threading.Thread(target=self._draw, name="beam_dp-progress", daemon=True)
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
