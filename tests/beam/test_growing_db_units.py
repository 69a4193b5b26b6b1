"""Growing databases per privacy unit: at most k elements per unit, every calibration at the record budget."""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import GrowingDatabaseParams, GrowingDatabaseQueries
from beam_dp.beam.shell.unit_records import with_record_unit
from beam_dp.core import StepClock
from beam_dp.core.group_privacy import RecordUnit, record_budget, unit_spend
from beam_dp.mechanisms.growing_db.universe import Categorical, Universe
from beam_dp.steps.events import Reason
from tests.reliability.harness import run_pipeline, sorted_releases

UNIVERSE = Universe([Categorical("colour", ("a", "b", "c", "d"))])
CLOCK = StepClock(start=0.0, period=10.0, end=100.0)
UNIT = RecordUnit("user", 8)
MECHANISMS = {"pmwg": 0.0, "bbscheduler": 0.0, "bbimprover": 1e-6}


def params_of(mechanism: str, **kw) -> GrowingDatabaseParams:
    return GrowingDatabaseParams(universe=UNIVERSE, n=4, epsilon=1.0, clock=CLOCK, mechanism=mechanism,
                                 delta=MECHANISMS[mechanism], **kw)


def elements(count: int = 40, users: int = 5, seed: int = 0, unit: bool = True) -> list[tuple]:
    """``count`` elements spread over the clock, unit ``u{i % users}`` as a 4th item (``unit``)."""
    rng = np.random.default_rng(seed)
    out = [("s", 2.5 * i + 0.5, "abcd"[int(rng.integers(0, 4))], f"u{i % users}") for i in range(count)]
    return out if unit else [e[:3] for e in out]


QUERIES = [("s", f"q{t:02d}", t, [1.0, 0.0, 0.0, 0.0]) for t in range(4, 40, 4)]


def run(transform: beam.PTransform, items: list, queries: list = QUERIES) -> tuple[list, list]:
    def build(p):
        out = {"elements": p | "Elements" >> beam.Create(items), "queries": p | "Queries" >> beam.Create(queries)} | (
            transform)
        return {"releases": out.releases, "dead": out.dead_letter}

    out = run_pipeline(build)
    return sorted_releases(out.releases), out.dead


def test_without_a_unit_the_answers_are_event_level():
    params = params_of("bbscheduler")
    assert params.privacy_unit is None
    plain, _ = run(GrowingDatabaseQueries(params), elements(unit=False))
    none, _ = run(GrowingDatabaseQueries(params, privacy_unit=None), elements(unit=False))
    assert plain and [r._asdict() for r in plain] == [r._asdict() for r in none]
    assert all("privacy_unit" not in json.loads(r.meta) for r in plain)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_every_calibration_is_the_record_budgets(mechanism):
    """PMWG's planned xi_n, BBScheduler's epochs and BBImprover's zCDP budget all come from epsilon/delta."""
    unit_level = with_record_unit(params_of(mechanism), UNIT)
    composition = "pure" if mechanism != "bbimprover" else "approx"
    eps, delta = record_budget(composition, 1.0, MECHANISMS[mechanism], UNIT.max_records)
    assert (unit_level.epsilon, unit_level.delta) == pytest.approx((eps, delta), rel=1e-12)
    ours, theirs = unit_level.build_mechanism(), params_of(mechanism, **{}).build_mechanism()
    record = dataclasses.replace(params_of(mechanism), epsilon=eps, delta=delta).build_mechanism()
    if mechanism == "pmwg":
        assert ours.xi_n == pytest.approx(record.xi_n, rel=1e-12) and ours.xi_n > theirs.xi_n
    elif mechanism == "bbscheduler":
        assert [ours.plan.epsilon_i(i) for i in range(5)] == pytest.approx([record.plan.epsilon_i(i) for i in range(5)])
    else:
        assert ours.s_tot == pytest.approx(record.s_tot, rel=1e-12) and ours.s_tot < theirs.s_tot


@pytest.mark.parametrize("mechanism", ["bbscheduler", "bbimprover"])
def test_unit_level_answers_differ_from_event_level_only_by_the_calibration(mechanism):
    rows, dead = run(GrowingDatabaseQueries(params_of(mechanism), privacy_unit=UNIT), elements())  # 8 per unit
    assert dead == []
    unit_level = with_record_unit(params_of(mechanism), UNIT)
    record, _ = run(GrowingDatabaseQueries(dataclasses.replace(params_of(mechanism), epsilon=unit_level.epsilon,
                                                               delta=unit_level.delta)), elements(unit=False))
    assert [(r.step, r.purpose, r.epsilon_spent, r.delta_spent) for r in rows] == [
        (r.step, r.purpose, r.epsilon_spent, r.delta_spent) for r in record]
    for row, other in zip(rows, record):
        meta, other_meta = json.loads(row.meta), json.loads(other.meta)
        assert (meta.pop("privacy_unit"), meta.pop("max_records")) == ("user", 8)
        assert meta.get("epsilon_run") == other_meta.get("epsilon_run")
        composition = "pure" if mechanism == "bbscheduler" else "approx"
        assert row.job_epsilon_spent == pytest.approx(unit_spend(composition, row.epsilon_spent, row.delta_spent, 8)[0],
                                                      rel=1e-12)
        assert row.job_epsilon_spent <= 1.0 * (1 + 1e-12)


def test_a_unit_over_k_keeps_k_elements_bad_ids_are_dead_letters_and_queries_carry_no_unit():
    items = [("s", 1.0 + i, "a", "big") for i in range(10)] + [("s", 20.0 + i, "b", f"v{i}") for i in range(3)]
    items += [("s", 30.0, "a", ""), ("s", 30.0, "a", None), {"stream_id": "s", "timestamp": 31.0, "value": "a"}]
    queries = [("s", "q5", 5, [1.0, 0, 0, 0]), ("s", "q7", 7, [1.0, 0, 0, 0]), ("s", "q8", 8, [1.0, 0, 0, 0])]
    rows, dead = run(GrowingDatabaseQueries(params_of("pmwg"), privacy_unit=RecordUnit("user", 4)), items, queries)
    assert sorted(json.loads(r.meta)["query_id"] for r in rows) == ["q5", "q7"]  # 4 + 3 elements kept
    reasons = sorted(d.reason for d in dead)
    assert reasons == sorted([Reason.BAD_UNIT_ID] * 3 + [Reason.AFTER_END])
    assert all("big" not in repr(d) for d in dead)
