"""Shared machinery of the reliability tests: run a public transform on the FnApiRunner and collect
its releases, dead letters and log lines in this process (the FnApiRunner runs DoFns in-process)."""

from __future__ import annotations

import itertools
import logging
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import apache_beam as beam
import numpy as np

from tests.beam.helpers import batch_options

_SINKS: dict[str, list] = {}
_ids = itertools.count()

MARK = "SECRET"  # every generated bad text carries it
HUGE_MARK = 7.77e300  # a distinctive bad number: never legitimately in a release
MARK_NUMBER = 31337.625  # likewise (only inside bad elements)
RAW_MARKERS = (MARK, "7.77e+300", "31337.625", "31337")


def _append(sink: str, item: Any) -> None:
    _SINKS[sink].append(pickle.dumps(item))


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage() + (self.formatException(record.exc_info) if record.exc_info else ""))
        except Exception as exc:  # a log call with bad arguments: keep its raw pieces
            self.lines.append(f"{record.msg!r} {record.args!r} {exc!r}")


@dataclass
class RunOutput:
    releases: list
    dead: list
    logs: list[str]
    result: Any = None
    pipeline_proto: bytes = b""


def run_pipeline(build: Callable[[beam.Pipeline], dict], options=None) -> RunOutput:
    """``build(p) -> {"releases": pcoll, "dead": pcoll, ...}``; runs it and returns what came out."""
    run_id = f"run{next(_ids)}"
    capture = _LogCapture()
    root, ours = logging.getLogger(), logging.getLogger("beam_dp")
    old_level = ours.level
    root.addHandler(capture)  # WARNING and above from everything, DEBUG and above from beam_dp
    ours.setLevel(logging.DEBUG)
    collected = {}
    try:
        pipeline = beam.Pipeline(options=options or batch_options())
        outputs = build(pipeline)
        for name, pcoll in outputs.items():
            sink = f"{run_id}/{name}"
            _SINKS[sink] = []
            pcoll | f"Collect{name}" >> beam.Map(lambda x, s=sink: _append(s, x))
        proto = pipeline.to_runner_api().SerializeToString()
        result = pipeline.run()
        result.wait_until_finish()
        for name in outputs:
            collected[name] = [pickle.loads(b) for b in _SINKS.pop(f"{run_id}/{name}")]
    finally:
        root.removeHandler(capture)
        ours.setLevel(old_level)
    return RunOutput(collected.get("releases", []), collected.get("dead", []), capture.lines, result, proto)


def release_key(row) -> tuple:
    return (row.stream, row.step, row.mechanism, row.meta)


def sorted_releases(rows) -> list:
    return sorted(rows, key=release_key)


def contains_marker(text: str) -> bool:
    return any(m in text for m in RAW_MARKERS)


def release_values_finite(row) -> bool:
    return bool(np.all(np.isfinite(np.asarray(row.value, dtype=np.float64))))
