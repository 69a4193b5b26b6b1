"""The Beam transforms' outputs on :mod:`tests.flink.family_cases` (run by the main venv, Beam 2.77).

``python -m tests.flink.family_reference OUT`` runs each case's Beam transform (one batch pipeline on the
FnApiRunner, the noise key in ``BEAM_DP_NOISE_KEY``) and writes ``{case: {"releases": [...],
"snapshots": [...], "dead": [...]}}`` as JSON to OUT: rows as JSON objects, dead letters as ``to_json``.
"""

from __future__ import annotations

import json
import sys
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from tests.flink.family_cases import cases

TRANSFORMS = {"OnlineLearnerParams": "OnlineLearner", "IncrementalRegressionParams": "IncrementalRegression",
              "ContinualModelParams": "ContinualModelRelease", "MultiResolutionParams": "MultiResolutionRelease",
              "SlidingWindowModelParams": "SlidingWindowModelRelease", "GrowingDatabaseParams": "GrowingDatabaseQueries",
              "LifelongParams": "LifelongLearner"}


def _apply(p, case):
    import beam_dp.beam as transforms

    inputs = {kind: p | f"{case.name} {kind}" >> beam.Create(elements, reshuffle=False)
              for kind, elements in case.inputs.items()}
    transform = getattr(transforms, TRANSFORMS[type(case.params).__name__])(case.params)
    if "queries" in inputs:
        out = (inputs["elements"], inputs["queries"]) | case.name >> transform
        return {"releases": out.releases, "snapshots": out.snapshots, "dead": out.dead_letter}
    out = inputs["elements"] | case.name >> transform
    return {"releases": out.releases, "dead": out.dead_letter}


def beam_outputs() -> dict[str, dict[str, list]]:
    names = {}
    with tempfile.TemporaryDirectory() as folder:
        with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as p:
            for case in cases():
                for name, pcoll in _apply(p, case).items():
                    as_json = (lambda r: json.dumps(r.to_json("any"))) if name == "dead" else (
                        lambda r: json.dumps(r._asdict(), sort_keys=True))
                    prefix = f"{folder}/{case.name}-{name}"
                    names[(case.name, name)] = prefix
                    _ = (pcoll | f"{case.name} {name} json" >> beam.Map(as_json)
                         | f"{case.name} write {name}" >> beam.io.WriteToText(prefix))
        result: dict[str, dict[str, list]] = {}
        for (case, name), prefix in names.items():
            paths = [m.path for m in FileSystems.match([f"{prefix}*"])[0].metadata_list]
            result.setdefault(case, {})[name] = [json.loads(line) for path in paths for line in open(path)
                                                 if line.strip()]
    return result


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump(beam_outputs(), fh)
