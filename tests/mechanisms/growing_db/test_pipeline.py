"""GrowingDatabaseQueries on the FnApiRunner: interleaved queries, equality with the pure mechanism, dead letters."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam.growing_db import GrowingDatabaseParams, GrowingDatabaseQueries, replay_growing_database
from beam_dp.core import StepClock
from beam_dp.io import WriteReleasesToParquet, release_to_row
from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe
from tests.beam.collect import run
from tests.beam.helpers import domain_noise, labelled

UNIVERSE = Universe([Categorical("colour", ("red", "green", "blue", "grey")), Bucketed("size", (0, 1, 2, 5, 10))])
N = UNIVERSE.size
CLOCK = StepClock(start=0, period=10, end=100)  # 10 steps


def _data(seed=0):
    rng = np.random.default_rng(seed)
    colours = np.array(UNIVERSE.fields[0].categories)
    elements, queries = [], []
    for stream in ("a", "b"):
        ts = np.sort(rng.uniform(0, 100, 60))
        for i, tt in enumerate(ts):
            c = colours[min(3, int(rng.integers(0, 2)) + (i // 20))]  # drifting colours
            elements.append((stream, float(tt), {"colour": str(c), "size": float(rng.uniform(0, 10))}))
        for k, t in enumerate(range(20, 61, 4)):  # interleaved with arrivals, three forms of query
            if k % 3 == 0:
                queries.append((stream, f"w{k}", t, (rng.random(N) < 0.4).astype(float).tolist()))
            elif k % 3 == 1:
                queries.append({"stream_id": stream, "query_id": f"p{k}", "t": t,
                                "predicate": {"colour": ["red", "green"], "size": (0, 2)}})
            else:
                queries.append({"stream_id": stream, "query_id": f"i{k}", "t": t, "indices": [0, 5, 9]})
        queries.append((stream, "same-t", 40, np.full(N, 0.5).tolist()))  # two queries at one t
    return elements, queries


BAD_ELEMENTS = [
    ("a", 5.0, {"colour": "purple", "size": 1.0}),  # outside the universe
    ("a", 5.0, {"colour": "red", "size": 11.0}),  # outside a bucketed range
    ("a", 5.0, {"colour": "red", "size": float("nan")}),
    ("a", 500.0, {"colour": "red", "size": 1.0}),  # after the public end
    ("a", 5.0),  # malformed
    ("", 5.0, {"colour": "red", "size": 1.0}),
]
BAD_QUERIES = [
    ("a", "short", 30, [0.5] * (N - 1)),
    ("a", "big", 30, [1.5] * N),
    ("a", "nan", 30, [float("nan")] * N),
    ("a", "early", 5, [0.5] * N),  # before n
    ("a", "never", 1000, [0.5] * N),  # the database never gets this big
    {"stream_id": "a", "query_id": "two", "t": 30, "weights": [0.5] * N, "indices": [1]},
    {"stream_id": "a", "query_id": "pred", "t": 30, "predicate": {"colour": ["purple"]}},
]
REASONS = {"outside_universe": 3, "malformed": 3, "after_end": 2, "bad_stream_id": 1, "wrong_shape": 1,
           "out_of_range": 1, "non_finite": 1, "before_start": 1}


DOMAIN = "GrowingDatabaseQueries"  # the transform's noise domain: its default label


def _expected(params, elements, queries):
    rows, snaps = [], []
    mech = params.build_mechanism()
    noise = domain_noise(params, DOMAIN)
    for stream in ("a", "b"):
        els = [(ts, UNIVERSE.encode_one(rec)) for s, ts, rec in elements if s == stream]
        qs = []
        for q in queries:
            s, qid, t, w = (q if isinstance(q, tuple) else (q["stream_id"], q["query_id"], q["t"],
                            UNIVERSE.predicate(q["predicate"]) if "predicate" in q else UNIVERSE.counting_query(q["indices"])))
            if s == stream:
                qs.append((qid, t, np.asarray(w, float)))
        rel, snap = replay_growing_database(params, stream, els, qs, noise)
        rows += [release_to_row(r, mech.guarantee) for r in rel]
        snaps += [release_to_row(r, mech.guarantee) for r in snap]
    return labelled(rows, params, DOMAIN), labelled(snaps, params, DOMAIN)


def _key(row):
    meta = json.loads(row.meta)
    return (row.stream, row.step, row.mechanism, str(meta.get("query_id")))


@pytest.mark.parametrize("mechanism", ["pmwg", "bbscheduler", "bbimprover"])
def test_pipeline_matches_pure_mechanism(mechanism):
    extra = dict(delta=1e-6) if mechanism == "bbimprover" else {}
    if mechanism == "pmwg":
        extra = dict(alpha=0.3, xi_n=0.02, epsilon=20.0)  # small noise: some queries are hard
    params = GrowingDatabaseParams(universe=UNIVERSE, n=20, epsilon=extra.pop("epsilon", 1.0), clock=CLOCK,
                                   mechanism=mechanism, snapshots=True, gamma=0.5 if mechanism == "bbscheduler" else None,
                                   **extra)
    elements, queries = _data()

    def build(p, which):
        out = {"elements": p | "E" >> beam.Create(elements + BAD_ELEMENTS),
               "queries": p | "Q" >> beam.Create(queries + BAD_QUERIES)} | GrowingDatabaseQueries(params)
        return {"rows": out.releases, "snaps": out.snapshots, "dead": out.dead_letter}[which]

    rows = sorted(run(lambda p: build(p, "rows")), key=_key)
    expected_rows, expected_snaps = _expected(params, elements, queries)
    expected_rows = sorted(expected_rows, key=_key)
    assert [_key(r) for r in rows] == [_key(r) for r in expected_rows]
    for got, want in zip(rows, expected_rows):
        assert got == want  # bit-identical: same blocks, same keyed noise
    answers = [r for r in rows if "query_id" in json.loads(r.meta)]
    assert len(answers) == 2 * 12 and all(0 < r.epsilon_spent <= params.epsilon for r in answers)
    if mechanism == "pmwg":
        assert any(json.loads(r.meta)["hard"] for r in answers) and any(not json.loads(r.meta)["hard"] for r in answers)
    snaps = sorted(run(lambda p: build(p, "snaps")), key=_key)
    assert snaps == sorted(expected_snaps, key=_key) and len(snaps) == 2
    dead = run(lambda p: build(p, "dead"))
    counts = {}
    for letter in dead:
        counts[letter.reason] = counts.get(letter.reason, 0) + 1
        assert "purple" not in letter.detail and "11.0" not in letter.detail and "1.5" not in letter.detail
    assert counts == REASONS


def test_snapshot_to_parquet(tmp_path):
    import pyarrow.parquet as pq

    params = GrowingDatabaseParams(universe=UNIVERSE, n=20, epsilon=1.0, clock=CLOCK, snapshots=True, delta=1e-6)
    elements, queries = _data(1)
    with beam.Pipeline(options=__import__("tests.beam.helpers", fromlist=["x"]).batch_options()) as p:
        out = {"elements": p | "E" >> beam.Create(elements), "queries": p | "Q" >> beam.Create(queries)} \
            | GrowingDatabaseQueries(params)
        out.snapshots | WriteReleasesToParquet(str(tmp_path / "synthetic"))
    table = pq.read_table(list(tmp_path.glob("synthetic*.parquet")))
    assert table.num_rows == 2
    for value in table.column("value").to_pylist():
        assert len(value) == N and abs(sum(value) - 1) < 1e-9 and min(value) > 0


def test_invalid_params():
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=0, epsilon=1.0, clock=CLOCK)
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=-1.0, clock=CLOCK)
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=1.0, clock=CLOCK, alpha=2.0)
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=1.0, clock=CLOCK, mechanism="bbimprover")
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=1.0, clock=CLOCK, mechanism="bbscheduler", gamma=0.0)
    with pytest.raises(ValueError):
        GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=1.0, clock=CLOCK, mechanism="other")
