"""The time-left estimate of pipelines.progress on a synthetic clock: start-up kept apart from per-byte time,
within 2x of the truth once 10% of the work is done; off a terminal, records go to the log."""

from __future__ import annotations

import io
import logging
import time

import pytest

from pipelines.progress import Estimate, Progress


def _run(startup: float, per_byte: float, size: int, fraction: float) -> tuple[float, float]:
    """(estimate, truth) of the seconds left of a synthetic run after ``fraction`` of its bytes, the
    estimator polled every second as the display polls it."""
    estimate = Estimate(size)
    total = startup + size * per_byte
    t = 0.0
    while True:
        done = 0 if t < startup else min(size, int((t - startup) / per_byte))
        left = estimate.left(t, done)
        if done >= fraction * size:
            return left, total - t
        t += 1.0


@pytest.mark.parametrize("startup, per_byte", [(5.0, 2e-6), (30.0, 2e-6), (60.0, 1e-7), (2.0, 1e-5)])
def test_within_2x_after_ten_percent_with_any_startup(startup, per_byte):
    # a start-up of up to 60 s before a run of 10-100 s: the estimate must not charge it to the bytes left
    for fraction in (0.1, 0.3, 0.7):
        left, truth = _run(startup, per_byte, 10_000_000, fraction)
        assert truth / 2 <= left <= truth * 2, (fraction, left, truth)


def test_start_up_is_not_per_byte_time():
    # 40 s of start-up, then 1 s per 100 kB: at 10% (1 MB after 50 s) 90 s are left; elapsed/done would say 450 s
    estimate = Estimate(10_000_000, rate=1e5, startup=4.0)
    assert estimate.left(39.0, 0) == pytest.approx(4.0 + 100.0 - 39.0)  # the prior until work is seen
    estimate.left(40.0, 1)
    assert estimate.left(50.0, 1_000_001) == pytest.approx(90.0, rel=1e-3)


def test_prior_without_observed_work():
    assert Estimate(10_000_000, rate=1e6, startup=4.0).left(2.0) == pytest.approx(12.0)
    assert Estimate(10_000_000, rate=1e6, startup=4.0).left(100.0) == 0.0


def test_off_a_terminal_progress_goes_to_the_log(caplog):
    piped = io.StringIO()
    with caplog.at_level(logging.INFO, logger="pipelines.progress"):
        with Progress(2_000_000, stream=piped, log_every=0.02):
            time.sleep(0.2)
    assert piped.getvalue() == ""  # nothing drawn into a pipe or a log file
    records = [r for r in caplog.records if r.name == "pipelines.progress"]
    assert records and all(r.levelno == logging.INFO for r in records)
    assert records[0].getMessage().startswith("running: 0 s, about ") and "2 MB of input" in records[0].getMessage()
