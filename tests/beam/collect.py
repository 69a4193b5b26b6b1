"""Collect a PCollection's elements from a batch pipeline run (via a temporary JSON-free pickle file)."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import apache_beam as beam

from tests.beam.helpers import batch_options


def run(build) -> list:
    """``build(pipeline) -> PCollection``; returns its elements sorted by (stream, step) when they have them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        with beam.Pipeline(options=batch_options()) as p:
            (build(p) | beam.Map(lambda x: pickle.dumps(x).hex()) | beam.io.WriteToText(str(out)))
        items = [pickle.loads(bytes.fromhex(line)) for f in sorted(Path(tmp).glob("out*"))
                 for line in f.read_text().splitlines() if line]
    return sorted(items, key=lambda r: (r.stream, r.step)) if items and hasattr(items[0], "step") else items
