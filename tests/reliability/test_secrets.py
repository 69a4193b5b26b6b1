"""Secrets (issue 8, item 5): the noise key never appears in the pickled pipeline graph, the pipeline
options, logs, metrics, releases or dead letters. Two pipelines (the generic DoFn and the growing-
database DoFn) run with a fresh key in the env var the workers read; everything they leave behind is
searched for the key's raw bytes, hex (both cases) and base64."""

from __future__ import annotations

import base64
import bz2
import pickle
import zlib

import apache_beam as beam

from beam_dp.beam import ContinualSum, ContinualSumParams, GrowingDatabaseParams, GrowingDatabaseQueries, NoiseKey
from tests.beam.helpers import batch_options
from tests.reliability.harness import run_pipeline
from tests.reliability.targets import CLOCK, UNIVERSE, _sum_events

KEY = bytes(range(200, 232))


def _forms(key: bytes) -> list[bytes]:
    return [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key), key[:16].hex().encode()]


def _graph_payloads(proto: bytes) -> bytes:
    """The graph proto plus every payload inside it decoded (Beam pickles DoFns as base64(bz2(dill)))."""
    from apache_beam.portability.api import beam_runner_api_pb2

    pipeline = beam_runner_api_pb2.Pipeline.FromString(proto)
    blobs = [proto]
    for transform in pipeline.components.transforms.values():
        payload = transform.spec.payload
        blobs.append(payload)
        if transform.spec.urn == "beam:transform:pardo:v1":
            blobs.append(beam_runner_api_pb2.ParDoPayload.FromString(payload).do_fn.payload)
    decoded = []
    for blob in blobs:
        for decode in (lambda b: bz2.decompress(base64.b64decode(b)), lambda b: zlib.decompress(base64.b64decode(b)),
                       bz2.decompress, zlib.decompress):
            try:
                decoded.append(decode(blob))
            except Exception:  # not that encoding
                pass
    return b"".join(blobs + decoded)


def _haystacks(out, options) -> dict[str, bytes]:
    metrics = out.result.metrics().query()
    return {
        "pipeline graph": _graph_payloads(out.pipeline_proto),
        "options": pickle.dumps(options.get_all_options()) + repr(options.get_all_options()).encode(),
        "logs": "\n".join(out.logs).encode(),
        "metrics": repr(metrics).encode(),
        "releases": pickle.dumps(out.releases) + repr(out.releases).encode(),
        "dead letters": pickle.dumps(out.dead) + repr(out.dead).encode(),
    }


def _assert_clean(out, options):
    for where, blob in _haystacks(out, options).items():
        for form in _forms(KEY):
            assert form not in blob, f"the noise key appears in the {where}"


def test_key_never_leaves_the_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", KEY.hex())
    options = batch_options()
    params = ContinualSumParams(clock=CLOCK, streams=("a", "b"), dim=2, epsilon=1.0, clip_bound=1.0)

    def build(p):
        out = p | beam.Create(_sum_events(0) + [("a", float("nan"), [1.0, 1.0])]) | ContinualSum(params)
        return {"releases": out.releases, "dead": out.dead_letter}

    out = run_pipeline(build, options)
    assert out.releases and out.dead
    _assert_clean(out, options)

    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)  # the key-file form: only the path travels
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    gdb = GrowingDatabaseParams(universe=UNIVERSE, n=2, epsilon=1.0, clock=CLOCK, noise_key=NoiseKey(None, str(key_file)))

    def build_gdb(p):
        out = {"elements": p | "E" >> beam.Create([("a", 1.5, {"colour": "red", "size": 0.5}),
                                                    ("a", 2.5, {"colour": "green", "size": 1.5})]),
               "queries": p | "Q" >> beam.Create([("a", "q", 2, [0.5] * UNIVERSE.size)])} | GrowingDatabaseQueries(gdb)
        return {"releases": out.releases, "dead": out.dead_letter}

    out = run_pipeline(build_gdb, options)
    assert out.releases
    assert str(key_file).encode() in _graph_payloads(out.pipeline_proto)  # sanity: the pickled DoFns were searched
    _assert_clean(out, options)
