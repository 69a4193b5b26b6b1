"""Pipeline tests on the FnApiRunner: OnlineLearner and IncrementalRegression equal the pure
mechanisms under the same key; bad records go to the dead-letter output."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam.online import (
    IncrementalRegression,
    IncrementalRegressionParams,
    OnlineLearner,
    OnlineLearnerParams,
)
from beam_dp.core import NoiseSource, StepClock
from beam_dp.io import release_to_row, row_to_release
from tests.beam.helpers import assert_that, batch_options, domain_noise, labelled, reasons_are, rows_match
from tests.conftest import TEST_KEY


def _expected(params, records_by_stream, domain):
    """The pure mechanism's rows under the test key in the noise domain ``domain`` (the transform's full label)."""
    mech = params.build_mechanism()
    noise = domain_noise(params, domain)
    rows = []
    for stream, recs in records_by_stream.items():
        for rel in mech.run(stream, recs, noise):
            clock = getattr(params, "clock", None)
            times = (clock.step_start_micros(rel.step), clock.step_end_micros(rel.step)) if clock else (None, None)
            rows.append(release_to_row(rel, mech.guarantee, *times))
    return labelled(rows, params, domain)


def test_online_learner_equals_the_pure_mechanism():
    rng = np.random.default_rng(0)
    params = OnlineLearnerParams(dim=3, constraint={"kind": "l1_ball", "radius": 1.0}, epsilon=1.0, window=8,
                                 algorithm="cocol", loss="logistic", mu=0.5, C0=10.0)
    data = {s: [(rng.normal(size=3), float(rng.choice([-1.0, 1.0]))) for _ in range(12)] for s in ("a", "b")}
    elements = [(s, a.tolist(), b) for s, recs in data.items() for a, b in recs]
    records = {s: [params.build_mechanism().record(a, b) for a, b in recs] for s, recs in data.items()}
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(elements) | OnlineLearner(params)
        assert_that(out.releases, rows_match(_expected(params, records, "OnlineLearner")), label="releases")
        assert_that(out.dead_letter, reasons_are({}), label="no dead letters")


def test_online_learner_dead_letters_bad_records():
    params = OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, window=4, loss="logistic",
                                 streams=("a",))
    good = [("a", [0.1, 0.2], 1.0), ("a", {"x": 1}, 1.0)]
    bad = [("a", [np.nan, 0.0], 1.0), ("a", [0.0, np.inf], -1.0), ("a", [1.0, 2.0, 3.0], 1.0),
           ("a", [1.0, 2.0], 0.5), ("a", [1.0, 2.0], float("nan")), ("a", "text", 1.0), ("b", [1.0, 0.0], 1.0),
           ("", [1.0, 0.0], 1.0), ("a", [1.0, 0.0]), 17]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(good[:1] + bad + good[1:]) | OnlineLearner(params)
        assert_that(out.releases | beam.Map(lambda r: (r.stream, r.step)), lambda rows: None
                    if sorted(rows) == [("a", 1)] else (_ for _ in ()).throw(AssertionError(rows)), label="one step")
        assert_that(out.dead_letter, reasons_are({"non_finite": 3, "wrong_shape": 1, "bad_value": 3,
                                                  "undeclared_stream": 1, "bad_stream_id": 1, "malformed": 2}),
                    label="reasons")


def test_incremental_regression_event_time_equals_the_pure_mechanism():
    rng = np.random.default_rng(1)
    clock = StepClock(0.0, 10.0, end=60.0)  # 6 public steps, empty ones included
    params = IncrementalRegressionParams(dim=3, epsilon=1.0, delta=1e-6, algorithm="privincreg1", clock=clock,
                                         constraint={"kind": "l2_ball", "radius": 1.0})
    events = []
    for s in ("u", "v"):
        for _ in range(15):
            ts = float(rng.uniform(0, 40))  # steps 5 and 6 stay empty
            events.append((s, ts, rng.normal(size=3).tolist(), float(rng.normal() * 2)))  # |y| > 1 is clipped
    mech = params.build_mechanism()
    blocks = {}
    for s in ("u", "v"):
        steps = [[] for _ in range(6)]
        for e in events:
            if e[0] == s:
                steps[int(e[1] // 10)].append(mech.record(e[2], e[3]))
        blocks[s] = [mech.merge_blocks(items) if items else None for items in steps]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(events + [("u", 99.0, [0.0, 0.0, 0.0], 0.0)]) | IncrementalRegression(params)
        assert_that(out.releases, rows_match(_expected(params, blocks, "IncrementalRegression"), rel_tol=1e-9),
                    label="releases")
        assert_that(out.dead_letter, reasons_are({"after_end": 1}), label="dead")


@pytest.mark.parametrize("algorithm,options", [("privincreg2", {"m": 2}), ("privincerm", {"tau": 2, "iterations": 20})])
def test_incremental_regression_count_steps_release_every_k(algorithm, options):
    rng = np.random.default_rng(2)
    params = IncrementalRegressionParams(dim=4, epsilon=1.0, delta=1e-6, algorithm=algorithm, block_size=1,
                                         horizon=10, release_every=3, options=options)
    recs = [(rng.normal(size=4), float(rng.uniform(-1, 1))) for _ in range(10)]
    mech = params.build_mechanism()
    expected = _expected(params, {"s": [mech.record(a, b) for a, b in recs]}, "IncrementalRegression")
    assert [r.step for r in expected] == [3, 6, 9]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([("s", a.tolist(), b) for a, b in recs]) | IncrementalRegression(params)
        assert_that(out.releases, rows_match(expected), label="releases")


def test_model_snapshots_round_trip_through_the_release_schema():
    params = IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6, block_size=1)
    mech = params.build_mechanism()
    rel = mech.run("s", [(np.array([0.5, 0.5]), 0.3)], NoiseSource(TEST_KEY))[0]
    row = release_to_row(rel, mech.guarantee)
    assert json.loads(row.parts) == [["theta", [2]]]
    back = row_to_release(row._asdict())
    np.testing.assert_array_equal(back.value["theta"], rel.value["theta"])


def test_invalid_params_raise():
    with pytest.raises(ValueError):
        OnlineLearnerParams(dim=2, constraint="sphere", epsilon=1.0, window=4)
    with pytest.raises(ValueError):
        OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, window=4, C0=3.0)  # COCOL-only constant
    with pytest.raises(ValueError):
        IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6)  # no step schedule
    with pytest.raises(ValueError):
        IncrementalRegressionParams(dim=2, epsilon=100.0, delta=1e-5, horizon=3, block_size=1,
                                    calibration="paper")  # the paper's sigma fails the exact check
    with pytest.raises(TypeError):
        OnlineLearner(IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6, block_size=1))
