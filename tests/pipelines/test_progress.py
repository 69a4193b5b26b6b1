"""The progress line of a local run: elapsed time and an estimate from the input size, drawn only on
a terminal, erased at the end, never holding data."""

from __future__ import annotations

import io
import time

from pipelines.progress import BYTES_PER_SECOND, STARTUP_SECONDS, Progress, input_bytes


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_estimates_from_the_input_size():
    size = 10_000_000
    line = Progress(size, enabled=False).line(elapsed=2.0)
    left = STARTUP_SECONDS + size / BYTES_PER_SECOND - 2
    assert line == f"  running: 2 s, about {left:.0f} s left (estimate for 10 MB of input)"
    assert Progress(size, enabled=False).line(elapsed=1e4).endswith("finishing (estimate for 10 MB of input)")
    assert Progress(None, enabled=False).line(elapsed=3.4) == "  running: 3 s"


def test_drawn_on_a_terminal_and_erased_off_when_not_a_terminal():
    screen = _Terminal()
    with Progress(1000, stream=screen, every=0.01):
        time.sleep(0.1)
    text = screen.getvalue()
    assert "running:" in text and text.endswith("\r") and text.count("\r") >= 3  # redrawn, then erased
    piped = io.StringIO()
    with Progress(1000, stream=piped, every=0.01):
        time.sleep(0.05)
    assert piped.getvalue() == ""


def test_input_bytes_sums_the_matched_files(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"x" * 10)
    (tmp_path / "b.csv").write_bytes(b"x" * 5)
    assert input_bytes([str(tmp_path / "*.csv"), None]) == 15
    assert input_bytes([str(tmp_path / "none*")]) is None
