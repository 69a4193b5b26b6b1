"""Privacy units for the online learners and incremental regression: at most k records per unit, group privacy."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import IncrementalRegressionParams, OnlineLearnerParams
from beam_dp.beam.online import IncrementalRegression, OnlineLearner
from beam_dp.core.budget import JobBudget
from beam_dp.core.group_privacy import RecordUnit, record_budget, unit_spend
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.steps.events import Reason
from tests.beam.collect import run

ONLINE = OnlineLearnerParams(dim=3, constraint="simplex", epsilon=1.0, window=8)
REGRESSION = IncrementalRegressionParams(dim=3, epsilon=1.0, delta=1e-6, block_size=4)
UNIT = RecordUnit("user", 3)


def _records(users: list) -> list:
    """One record per user id, features of norm < 1 and labels ±1, in a fixed order."""
    rng = np.random.default_rng(7)
    return [("s", (rng.uniform(-1, 1, 3) / 2).tolist(), float(1 - 2 * (i % 2)), user) for i, user in enumerate(users)]


def _outputs(transform, records: list) -> tuple[list, list]:
    def build(pipeline):
        out = pipeline | beam.Create(records) | transform
        return (out.releases | "R" >> beam.Map(lambda r: ("row", r)),
                out.dead_letter | "D" >> beam.Map(lambda d: ("dead", d))) | beam.Flatten()

    items = run(build)
    return [r for kind, r in items if kind == "row"], [d for kind, d in items if kind == "dead"]


def test_pure_online_learner_noise_grows_k_fold_at_the_unit_level():
    # pure window tree (gamma noise): record_budget is epsilon/k and the node scale is proportional to 1/epsilon
    unit = OnlineLearner(ONLINE, privacy_unit=RecordUnit("user", 4)).params
    assert unit.epsilon == pytest.approx(record_budget("pure", 1.0, 0.0, 4)[0]) == pytest.approx(0.25)
    ratio = unit.build_mechanism().tree.node_noise.scale / ONLINE.build_mechanism().tree.node_noise.scale
    assert ratio == pytest.approx(4.0, rel=1e-12)
    assert unit.budget.unit_spend(unit.epsilon, unit.delta) == pytest.approx((1.0, 0.0))


@pytest.mark.parametrize("params", [REGRESSION, OnlineLearnerParams(dim=3, constraint="simplex", epsilon=1.0, window=8,
                                                                    noise="gaussian", delta=1e-6)],
                         ids=["privincreg1", "cocop-gaussian"])
def test_gaussian_learners_calibrate_at_the_approx_record_budget(params):
    # both report "approx" composition: the unit's (epsilon, delta) is the approx chain of the record-level one
    unit = (IncrementalRegression if isinstance(params, IncrementalRegressionParams) else OnlineLearner)(
        params, privacy_unit=UNIT).params
    expected = record_budget("approx", 1.0, 1e-6, 3)
    assert (unit.epsilon, unit.delta) == pytest.approx(expected)
    assert unit_spend("approx", unit.epsilon, unit.delta, 3)[0] <= 1.0 * (1 + 1e-12)
    assert unit_spend("approx", unit.epsilon, unit.delta, 3)[1] <= 1e-6 * (1 + 1e-12)
    event_at_record_budget = type(params)(**{**{f: getattr(params, f) for f in params.__dataclass_fields__},
                                            "epsilon": expected[0], "delta": expected[1]})
    assert _noise_scales(unit) == pytest.approx(_noise_scales(event_at_record_budget), rel=1e-12)
    assert min(np.asarray(_noise_scales(unit)) / np.asarray(_noise_scales(params))) > 3.0  # more than k-fold


def _noise_scales(params) -> list[float]:
    mechanism = params.build_mechanism()
    if hasattr(mechanism, "tree_Q"):
        return [mechanism.tree_Q.log_noise.scale, mechanism.tree_q.log_noise.scale]
    return [mechanism.tree.node_noise.scale]


def test_a_unit_over_k_records_keeps_k_and_rows_declare_the_unit():
    # one release per kept record (count steps of one record): ann 5 -> 3, bob 2, cat 1
    records = _records(["ann"] * 5 + ["bob"] * 2 + ["cat"])
    rows, dead = _outputs(OnlineLearner(ONLINE, privacy_unit=UNIT), records)
    assert dead == []
    assert [r.step for r in rows] == list(range(1, 7))
    for row in rows:
        meta = json.loads(row.meta)
        assert (meta["privacy_unit"], meta["max_records"]) == ("user", 3)
        assert row.epsilon_spent <= 1.0 / 3 * (1 + 1e-12)  # the record-level spend
        assert (row.job_epsilon_spent, row.job_delta_spent) == pytest.approx(
            unit_spend("pure", row.epsilon_spent, 0.0, 3))
        assert row.job_epsilon_budget == 1.0


def test_bad_unit_ids_are_dead_letters_without_the_id():
    records = _records(["ann", "", None, "ann", "bob", "bob"]) + [("s", [0.1, 0.1, 0.1], 1.0, 5)]
    rows, dead = _outputs(IncrementalRegression(REGRESSION, privacy_unit=UNIT), records)
    assert sorted(d.reason for d in dead) == [Reason.BAD_UNIT_ID] * 3
    assert all("ann" not in repr(d) for d in dead)
    assert [r.step for r in rows] == [1]  # ann's and bob's four records: one step of block_size 4


def test_a_job_budget_share_becomes_the_units():
    share = JobBudget(2.0, 1e-6).split({"regression": "approx", "other": "approx"})["regression"]
    params = IncrementalRegressionParams(dim=3, block_size=4, **share.params())
    unit = IncrementalRegression(params, privacy_unit=UNIT).params
    assert unit.budget.max_records == 3 and unit.budget.epsilon == share.epsilon
    assert (unit.epsilon, unit.delta) == pytest.approx(record_budget("approx", share.epsilon, share.delta, 3))


def test_params_with_a_unit_need_the_units_share():
    with pytest.raises(ValueError, match="budget share per unit"):
        OnlineLearnerParams(dim=3, constraint="simplex", epsilon=1.0, window=8, privacy_unit=UNIT)
    with pytest.raises(ValueError, match="already"):
        OnlineLearner(OnlineLearner(ONLINE, privacy_unit=UNIT).params, privacy_unit=UNIT)


def test_without_a_unit_the_releases_are_those_of_an_event_level_run():
    records = [r[:3] for r in _records(["-"] * 6)]
    default, _ = _outputs(OnlineLearner(ONLINE), records)
    explicit, _ = _outputs(OnlineLearner(ONLINE, privacy_unit=None), records)
    assert [r.value for r in default] == [r.value for r in explicit] and len(default) == 6
    assert all("privacy_unit" not in json.loads(r.meta) for r in default)


def test_the_event_level_noise_binding_is_the_one_before_privacy_units():
    # the bindings these params had before the privacy_unit field existed (their noise and saved states)
    assert calibration_binding(ONLINE) == "b1:a6bdab071d5e76b2c0b94f3a1e833c52"
    assert calibration_binding(REGRESSION) == "b1:3b1cb58059d789ad3665796cfd10b217"


def test_event_time_regression_keeps_k_records_of_a_unit():
    # ann's 8 identical records (one step) release as 2 of them do; a third record (bob's) would show
    from beam_dp.core import StepClock

    params = IncrementalRegressionParams(dim=3, epsilon=50.0, delta=1e-6, clock=StepClock(0.0, 10.0, end=40.0))
    record = ("s", 11.0, [0.5, -0.25, 0.25], 0.75)

    def theta(users: list) -> np.ndarray:
        rows, dead = _outputs(IncrementalRegression(params, privacy_unit=RecordUnit("user", 2)),
                              [(*record, user) for user in users])
        assert dead == [] and [r.step for r in rows] == [1, 2, 3, 4]  # every event-time step releases
        assert all(json.loads(r.meta)["max_records"] == 2 for r in rows)
        return np.concatenate([r.value for r in rows])

    bounded, two = theta(["ann"] * 8), theta(["ann"] * 2)
    np.testing.assert_allclose(bounded, two, rtol=1e-12, atol=1e-12)
    assert not np.allclose(two, theta(["ann"] * 2 + ["bob"]), rtol=1e-6, atol=1e-9)
