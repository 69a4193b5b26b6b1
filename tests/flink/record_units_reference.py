"""A per-record family with a privacy unit for the Flink parity test (importable in both venvs: no PyFlink).

``python -m tests.flink.record_units_reference OUT`` runs the case's Beam transform on a batch replay
(FnApiRunner, the noise key in ``BEAM_DP_NOISE_KEY``) and writes ``{"releases": [...], "dead": [...]}``
as JSON to OUT (rows as JSON objects, dead letters as ``to_json``); ``bounded`` runs the case with the
over-k unit's records cut to k by hand (what the unit stage must keep)."""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np

from beam_dp.core import StepClock
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.steps.params import NoiseKey

UNIT = RecordUnit("user", 2)
ANN = ("a", 11.0, [0.3, -0.2], 0.5, "ann")  # ann sends 5 identical records: any 2 kept are the same


def params():
    """Event-time incremental regression (sums per step: the order within a step does not matter) per unit."""
    from beam_dp.beam import IncrementalRegressionParams
    from beam_dp.beam.shell.unit_records import with_record_unit

    return with_record_unit(IncrementalRegressionParams(
        dim=2, epsilon=1.0, delta=1e-6, clock=StepClock(start=0.0, period=10.0, end=50.0), streams=("a", "b"),
        noise_key=NoiseKey(domain="unit-regression")), UNIT)


def elements(copies: int = 5) -> list:
    """Distinct users' records on two streams, ann's ``copies``, two bad ids (empty; none: the label last)."""
    rng = np.random.default_rng(4)
    others = [(str(s), float(t), rng.normal(0, 0.5, 2).tolist(), float(rng.normal()), f"u{i % 7}")
              for i, (s, t) in enumerate(zip(rng.choice(["a", "b"], 14), np.sort(rng.random(14) * 45.0)))]
    return others[:4] + [ANN] * copies + [("b", 3.0, [0.1, 0.1], 0.2, ""), ("a", 4.0, [0.1, 0.1], 0.2)] + others[4:]


def beam_outputs(copies: int) -> dict[str, list]:
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_dp.beam import IncrementalRegression

    with tempfile.TemporaryDirectory() as folder:
        with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as p:
            out = p | beam.Create(elements(copies), reshuffle=False) | "units" >> IncrementalRegression(params())
            _ = (out.releases | "rows" >> beam.Map(lambda r: json.dumps(r._asdict(), sort_keys=True))
                 | "write rows" >> beam.io.WriteToText(f"{folder}/releases"))
            _ = (out.dead_letter | "letters" >> beam.Map(lambda d: json.dumps(d.to_json("any")))
                 | "write letters" >> beam.io.WriteToText(f"{folder}/dead"))
        return {name: [json.loads(line) for m in FileSystems.match([f"{folder}/{name}*"])[0].metadata_list
                       for line in open(m.path) if line.strip()] for name in ("releases", "dead")}


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump({"unbounded": beam_outputs(5), "bounded": beam_outputs(UNIT.max_records)}, fh)
