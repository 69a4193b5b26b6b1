"""ERM model release per privacy unit: at most k examples per unit, calibrated at the record budget."""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import ContinualModelParams, ContinualModelRelease, MultiResolutionParams, MultiResolutionRelease
from beam_dp.beam.shell.unit_records import with_record_unit
from beam_dp.core.group_privacy import RecordUnit, record_budget, unit_spend
from beam_dp.steps.events import Reason
from tests.reliability.harness import run_pipeline, sorted_releases

UNIT = RecordUnit("user", 4)


def examples(users: int = 5, per_user: int = 4, seed: int = 0, user_field: str | None = "user") -> list[dict]:
    """``users`` units of ``per_user`` examples each (2 features in the unit ball, a label in [0, 1])."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(users * per_user):
        x = rng.uniform(-0.7, 0.7, 2)
        row = {"stream_id": "s", "features": x.tolist(), "label": float(rng.uniform())}
        if user_field is not None:
            row[user_field] = f"u{i % users}"
        out.append(row)
    return out


def run(transform: beam.PTransform, records: list) -> tuple[list, list]:
    out = run_pipeline(lambda p: (lambda o: {"releases": o.releases, "dead": o.dead_letter})(
        p | beam.Create(records) | transform))
    return sorted_releases(out.releases), out.dead


def _scales(row) -> list[float]:
    return [e["noise_scale"] for e in json.loads(row.meta)["events"]]


def test_without_a_unit_params_and_releases_are_event_level():
    params = MultiResolutionParams(n_features=2, block=4, epsilon=1.0)
    assert params.privacy_unit is None
    plain, _ = run(MultiResolutionRelease(params), examples(user_field=None))
    none, _ = run(MultiResolutionRelease(params, privacy_unit=None), examples(user_field=None))
    assert [r._asdict() for r in plain] == [r._asdict() for r in none]
    assert all("privacy_unit" not in json.loads(r.meta) for r in plain)


@pytest.mark.parametrize("noise,delta", [("gamma", 0.0), ("gaussian", 1e-6)])
def test_unit_level_releases_differ_from_event_level_only_by_the_calibration(noise, delta):
    params = MultiResolutionParams(n_features=2, block=4, epsilon=1.0, noise=noise, delta=delta)
    rows, dead = run(MultiResolutionRelease(params, privacy_unit=UNIT), examples())  # 5 units x 4: none dropped
    assert dead == []
    eps, dlt = record_budget("pure" if noise == "gamma" else "approx", 1.0, delta, UNIT.max_records)
    at_record_budget, _ = run(MultiResolutionRelease(dataclasses.replace(params, epsilon=eps, delta=dlt)),
                              examples(user_field=None))
    event_level, _ = run(MultiResolutionRelease(params), examples(user_field=None))
    assert [(r.step, r.epsilon_spent) for r in rows] == [(r.step, r.epsilon_spent) for r in at_record_budget]
    for unit_row, record_row, event_row in zip(rows, at_record_budget, event_level):
        meta = json.loads(unit_row.meta)
        assert (meta["privacy_unit"], meta["max_records"]) == ("user", 4)
        assert _scales(unit_row) == pytest.approx(_scales(record_row), rel=1e-12)
        if noise == "gamma":  # K-norm noise: scale 1/epsilon, so k times the event level's
            assert _scales(unit_row) == pytest.approx([4 * s for s in _scales(event_row)], rel=1e-12)
        assert unit_row.epsilon_budget == pytest.approx(eps, rel=1e-12)
        assert unit_row.job_epsilon_budget == 1.0 and unit_row.job_epsilon_spent <= 1.0 * (1 + 1e-12)
        unit_eps, unit_delta = unit_spend("pure" if noise == "gamma" else "approx", unit_row.epsilon_spent,
                                          unit_row.delta_spent, 4)
        assert unit_row.job_epsilon_spent == pytest.approx(unit_eps, rel=1e-12)  # one transform: the unit's
        assert unit_delta <= unit_row.job_delta_spent <= delta


def test_a_unit_over_k_keeps_k_examples_and_bad_ids_are_dead_letters():
    records = examples(users=1, per_user=10)  # u0 has 10
    records += [dict(r, user=f"v{i}") for i, r in enumerate(examples(users=3, per_user=1, seed=1))]
    records += [dict(records[0], user=""), dict(records[0], user=7), {k: v for k, v in records[0].items()
                                                                       if k != "user"}]
    params = MultiResolutionParams(n_features=2, block=1, max_level=1, epsilon=1.0)
    rows, dead = run(MultiResolutionRelease(params, privacy_unit=UNIT), records)
    level_0 = [r for r in rows if [e["level"] for e in json.loads(r.meta)["events"]] == [0]]
    assert len(level_0) == 4 + 3  # block 1: one level-0 model per kept example
    assert sorted(d.reason for d in dead) == [Reason.BAD_UNIT_ID] * 3
    assert all("u0" not in repr(d) and d.element.get("user") is None for d in dead)


def test_continual_release_takes_the_unit_and_params_refuse_a_unit_without_its_share():
    params = ContinualModelParams(n_features=2, update=4, base=8, epsilon=2.0)
    rows, _ = run(ContinualModelRelease(params, privacy_unit=UNIT), examples())
    assert rows and all(json.loads(r.meta)["max_records"] == 4 for r in rows)
    assert max(r.job_epsilon_spent for r in rows) <= 2.0 * (1 + 1e-12)
    with pytest.raises(ValueError, match="budget share per unit"):
        dataclasses.replace(params, privacy_unit=UNIT)
    with pytest.raises(ValueError, match="protect a privacy unit already"):
        ContinualModelRelease(with_record_unit(params, UNIT), privacy_unit=UNIT)
