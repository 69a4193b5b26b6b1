"""A real local Flink job (PyFlink MiniCluster) on a small stream: its releases equal the pure
mechanism's under the same key, and bad rows come out as dead letters. Needs .venv-flink
(``make flink-test``); skipped in the main venv. One job only: each costs 6-8 s of start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream, to_event  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from tests.flink.cases import BAD, BUILD, CLOCK, STREAMS, assert_rows_equal, expected_rows, good_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_local_flink_job_matches_the_pure_mechanism(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    events = good_events()
    stream = sorted(events + [e for e, _ in BAD], key=lambda e: e[1])  # time order: no late data
    params = FlinkReleaseParams(BUILD, clock=CLOCK, streams=STREAMS)
    env = local_environment()
    source = env.from_collection([to_event(*e) for e in stream], type_info=EVENT_TYPE)
    with release_stream(env, source, params).execute_and_collect() as results:
        outputs = list(results)
    rows = [json.loads(j) for kind, j in outputs if kind == "release"]
    dead = [json.loads(j) for kind, j in outputs if kind == "dead_letter"]
    assert_rows_equal(rows, expected_rows(events, params.domain))
    assert {r["stream"] for r in rows} == set(STREAMS) and max(r["step"] for r in rows) == CLOCK.last_step
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in BAD)
