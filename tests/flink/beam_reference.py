"""The Beam path's releases of the Flink parity test (run by the main venv, which has Beam 2.77).

``python -m tests.flink.beam_reference OUT`` runs ``ContinualSum`` on the FnApiRunner over the events
of :mod:`tests.flink.cases` (good rows and bad rows) with the noise key in ``BEAM_DP_NOISE_KEY`` and
the Flink function's noise domain (its uid), and writes ``{"releases": [...], "dead": [...], "binding": ...}``
as JSON to OUT (``binding``: the Beam params' noise binding; the engines' params differ, so their noise does).
"""

from __future__ import annotations

import json
import sys
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.steps.params import NoiseKey
from tests.flink.cases import BAD, CLOCK, DOMAIN, STREAMS, good_events

#: the Beam params of the mechanism the Flink tests build (cases.BUILD: the hybrid tree, gamma noise)
PARAMS = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, noise="gamma", counter="tree", calibration="paper",
                            clock=CLOCK, streams=STREAMS, noise_key=NoiseKey(domain=DOMAIN))


def events() -> list[tuple]:
    """The parity test's input: the good events and the bad rows, in time order."""
    return sorted(good_events() + [e for e, _ in BAD], key=lambda e: e[1])


def beam_outputs() -> dict[str, list[dict]]:
    with tempfile.TemporaryDirectory() as folder:
        with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as p:
            out = p | beam.Create(events()) | ContinualSum(PARAMS)
            for name, rows in (("releases", out.releases), ("dead", out.dead_letter)):
                _ = (rows | f"{name} json" >> beam.Map(lambda r: json.dumps(r._asdict(), default=str))
                     | f"write {name}" >> beam.io.WriteToText(f"{folder}/{name}"))
        result = {"binding": calibration_binding(PARAMS)}
        for name in ("releases", "dead"):
            paths = [m.path for m in FileSystems.match([f"{folder}/{name}*"])[0].metadata_list]
            result[name] = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    return result


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump(beam_outputs(), fh)
