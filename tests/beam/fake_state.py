"""In-memory stand-ins for a Beam DoFn's state cell, bag and timer, to call a shell's ``process`` and
timer callbacks directly (no runner), and a metrics scope to read the counters it increments."""

from __future__ import annotations

import contextlib

from apache_beam.metrics.execution import MetricsContainer
from apache_beam.metrics.metricbase import MetricName
from apache_beam.runners.worker import statesampler


class Cell:
    def __init__(self):
        self.data = None

    def read(self):
        return self.data

    def write(self, data):
        self.data = data

    def clear(self):
        self.data = None


class Bag(list):
    """A bag; ``sums``: the cell of the key's pre-aggregated sums (``DriverDoFn.SUMS``) that goes with it."""

    def __init__(self):
        super().__init__()
        self.sums = Cell()

    def add(self, entry):
        self.append(entry)

    def read(self):
        return list(self)

    def clear(self):
        del self[:]


class Timer:
    def __init__(self):
        self.set_at: dict[str, int] = {}

    def set(self, ts, dynamic_timer_tag=""):
        self.set_at[dynamic_timer_tag] = ts.micros


@contextlib.contextmanager
def metrics():
    """Counters incremented inside the block: ``yield`` a function ``(namespace, name) -> value``."""
    container = MetricsContainer("test")
    sampler = statesampler.StateSampler("", statesampler.CounterFactory())
    statesampler.set_current_tracker(sampler)
    sampler.start()
    try:
        with sampler.scoped_state("test", "process", metrics_container=container):
            yield lambda namespace, name: container.get_counter(MetricName(namespace, name)).get_cumulative()
    finally:
        sampler.stop()
        statesampler.set_current_tracker(None)
