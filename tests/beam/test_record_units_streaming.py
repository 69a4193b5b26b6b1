"""Per-record families' privacy units on a Beam streaming job (TestStream on the BundleBasedDirectRunner): the
unit stage keeps a unit's first k records by arrival, so the releases are the batch replay's of the same records
(a unit's extra copies dropped). Count steps depend on arrival order, and which k of a unit a batch replay keeps
on its engine's order: a unit over k sends k+ identical records, so every run keeps the same multiset, and the
ERM case fills one block (a block's model does not depend on the order of its rows)."""

from __future__ import annotations

import json
from typing import Any, Callable

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import (
    GrowingDatabaseParams,
    GrowingDatabaseQueries,
    IncrementalRegressionParams,
    MultiResolutionParams,
    MultiResolutionRelease,
)
from beam_dp.beam.lifelong import UNIT_TASKS_BATCH_ONLY, LifelongLearner, LifelongParams
from beam_dp.beam.online import IncrementalRegression
from beam_dp.core import StepClock
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.mechanisms.growing_db.universe import Categorical, Universe
from beam_dp.steps.events import Reason
from tests.beam.helpers import streaming_options
from tests.reliability.harness import run_pipeline, sorted_releases

pytestmark = pytest.mark.pipeline

UNIT = RecordUnit("user", 2)


def _stream(records: list, seconds: Callable[[Any], float]) -> TestStream:
    """One record per bundle in list order (times non-decreasing), the watermark moved just past each record's
    time after it (by 1 ms a record: within its step, so none is late); arrival order is list order."""
    stream = TestStream()
    for i, record in enumerate(records, 1):
        stream = stream.add_elements([TimestampedValue(record, seconds(record))]).advance_watermark_to(
            Timestamp(micros=round(seconds(record) * 1e3) * 1000 + 1000 * i))  # whole ms, as TestStream needs
    return stream.advance_watermark_to_infinity()


def _run(build: Callable[[beam.Pipeline], Any], streaming: bool) -> tuple[list, list]:
    def outputs(pipeline):
        out = build(pipeline)
        return {"releases": out.releases, "dead": out.dead_letter}

    out = run_pipeline(outputs, streaming_options() if streaming else None)
    return sorted_releases(out.releases), out.dead


def _values(value: Any) -> np.ndarray:
    if isinstance(value, dict):
        return np.concatenate([np.ravel(np.asarray(value[k], dtype=np.float64)) for k in sorted(value)])
    return np.ravel(np.asarray(value, dtype=np.float64))


def _assert_same(got: list, want: list) -> None:
    """The same rows, values within 1e-9 (float sums of a step in another order), all else exact."""
    assert [(r.stream, r.step) for r in got] == [(r.stream, r.step) for r in want] and want
    for a, b in zip(got, want):
        np.testing.assert_allclose(_values(a.value), _values(b.value), rtol=1e-9, atol=1e-9)
        assert a._replace(value=None) == b._replace(value=None)


def _reasons(dead: list) -> list:
    return sorted(d.reason for d in dead)


def test_erm_streaming_keeps_k_of_a_unit_and_equals_the_batch_replay():
    rng = np.random.default_rng(5)
    distinct = [{"stream_id": "s", "features": rng.uniform(-0.6, 0.6, 2).tolist(), "label": float(rng.uniform()),
                 "user": f"u{i}"} for i in range(4)]
    ann = {"stream_id": "s", "features": [0.3, -0.2], "label": 0.75, "user": "ann"}
    records = distinct[:2] + [ann] * 5 + distinct[2:] + [dict(ann, user="")]  # ann: 5 > k; one bad id
    params = MultiResolutionParams(n_features=2, block=6, max_level=1, epsilon=1.0)  # 4 + 2 kept: one block

    def release(items, streaming):
        source = _stream(items, lambda r: 0.0) if streaming else beam.Create(items)
        return _run(lambda p: p | source | MultiResolutionRelease(params, "Release", privacy_unit=UNIT), streaming)

    rows, dead = release(records, True)
    assert len(rows) == 1 and json.loads(rows[0].meta)["max_records"] == 2
    assert _reasons(dead) == [Reason.BAD_UNIT_ID]
    batch, _ = release(records, False)
    _assert_same(rows, batch)
    bounded, _ = release(distinct[:2] + [ann] * 2 + distinct[2:], False)  # ann's two kept: the same block
    _assert_same(rows, bounded)


def test_growing_database_streaming_keeps_k_elements_and_equals_the_batch_replay():
    params = GrowingDatabaseParams(universe=Universe([Categorical("colour", ("a", "b", "c", "d"))]), n=4,
                                   epsilon=1.0, clock=StepClock(start=0.0, period=10.0, end=100.0), mechanism="pmwg")
    unit = RecordUnit("user", 4)
    items = [("s", 1.0, "a", "big")] * 10 + [("s", 20.0 + i, "b", f"v{i}") for i in range(3)] + [("s", 30.0, "a", "")]
    queries = [("s", "q5", 5, [1.0, 0, 0, 0]), ("s", "q7", 7, [1.0, 0, 0, 0]), ("s", "q8", 8, [1.0, 0, 0, 0])]

    def answers(elements, streaming):
        def build(p):
            source = _stream(elements, lambda e: e[1]) if streaming else beam.Create(elements)
            return {"elements": p | "Elements" >> source, "queries": p | "Queries" >> beam.Create(queries)} | (
                GrowingDatabaseQueries(params, "Answers", privacy_unit=unit))
        return _run(build, streaming)

    rows, dead = answers(items, True)
    assert sorted(json.loads(r.meta)["query_id"] for r in rows) == ["q5", "q7"]  # 4 + 3 elements: q8 never
    assert _reasons(dead) == sorted([Reason.BAD_UNIT_ID, Reason.AFTER_END])
    assert all("big" not in repr(d) for d in dead)
    batch, batch_dead = answers(items, False)
    _assert_same(rows, batch)
    assert _reasons(batch_dead) == _reasons(dead)


def test_event_time_regression_streaming_keeps_k_records_and_equals_the_batch_replay():
    params = IncrementalRegressionParams(dim=3, epsilon=50.0, delta=1e-6, clock=StepClock(0.0, 10.0, end=40.0))
    rng = np.random.default_rng(9)
    others = [("s", 12.0 + 7 * i, (rng.uniform(-1, 1, 3) / 2).tolist(), float(rng.uniform(-1, 1)), f"u{i}")
              for i in range(3)]
    ann = ("s", 11.0, [0.5, -0.25, 0.25], 0.75, "ann")

    def thetas(records, streaming):
        source = _stream(records, lambda r: r[1]) if streaming else beam.Create(records)
        return _run(lambda p: p | source | IncrementalRegression(params, "Learn", privacy_unit=UNIT), streaming)

    rows, dead = thetas([ann] * 6 + others, True)
    assert dead == [] and [r.step for r in rows] == [1, 2, 3, 4]  # every event-time step releases
    batch, _ = thetas([ann] * 6 + others, False)
    _assert_same(rows, batch)
    bounded, _ = thetas([ann] * 2 + others, False)
    _assert_same(rows, bounded)
    three, _ = thetas([ann] * 2 + [ann[:4] + ("bob",)] + others, False)  # a third copy (bob's) would show
    assert not np.allclose(*(np.concatenate([_values(r.value) for r in run]) for run in (rows, three)),
                           rtol=1e-6, atol=1e-9)


def test_a_unit_level_lifelong_learner_refuses_a_streaming_input_in_one_line():
    from beam_dp.mechanisms.lifelong.config import L2DPConfig

    config = L2DPConfig(input_dim=2, n_classes=2, hidden=4, g_layers=(4,), batch_size=8, steps_per_task=1,
                        task_ids=("0",), device="cpu", epsilon=1.0)
    with pytest.raises(ValueError, match="its tasks close at the end of the input"):
        with beam.Pipeline(options=streaming_options()) as pipeline:
            _ = pipeline | TestStream().add_elements([("s", "0", np.zeros(2), 1, "ann")]) | LifelongLearner(
                LifelongParams(config, allow_cuda=False), privacy_unit=UNIT)
    assert "\n" not in UNIT_TASKS_BATCH_ONLY
