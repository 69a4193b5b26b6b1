"""Privacy units for the lifelong learners: at most k training rows per unit, group privacy of the learner's
(ε, δ) guarantee (approx composition), every calibration at the record-level budget."""

from __future__ import annotations

import json
import pickle
from typing import Any

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter

from beam_dp.beam.lifelong import END_OF_TASK, LifelongLearner, LifelongParams
from beam_dp.core.budget import JobBudget
from beam_dp.core.group_privacy import RecordUnit, record_budget, unit_spend
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.mechanisms.lifelong import BoundedAGEMConfig, L2DPConfig, NaiveGaussianConfig
from beam_dp.steps.events import Reason
from tests.beam.helpers import batch_options

torch = pytest.importorskip("torch")

COMMON: dict[str, Any] = dict(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=8, steps_per_task=2, task_ids=("0", "1"),
              device="cpu")
UNIT = RecordUnit("user", 3)


def _learner(config):
    from beam_dp.mechanisms.lifelong.factory import build_learner

    return build_learner(config)


def test_l2dp_laplace_scales_grow_k_fold():
    # L2DP-ML's claim is pure (delta 0): approx group privacy is k·epsilon, so the record budget is epsilon/k and
    # every Laplace scale (proportional to 1/epsilon) grows k-fold
    params = LifelongParams(L2DPConfig(**COMMON, epsilon=1.0), allow_cuda=False)
    unit = params.with_privacy_unit(RecordUnit("user", 4))
    assert unit.learner.epsilon == pytest.approx(0.25) and unit.budget.max_records == 4
    event, grouped = _learner(params.learner).noise_scales, _learner(unit.learner).noise_scales
    assert {k: grouped[k] / event[k] for k in event} == pytest.approx({k: 4.0 for k in event}, rel=1e-12)


@pytest.mark.parametrize("config", [
    BoundedAGEMConfig(**COMMON, task_size=64, epsilon=1.0, delta=1e-5, memory_uses=3),
    NaiveGaussianConfig(**COMMON, task_size=64, epsilon=1.0, delta=1e-5, num_tasks=2)], ids=["bounded", "naive"])
def test_dpsgd_learners_are_calibrated_at_the_approx_record_budget(config):
    unit = LifelongParams(config, allow_cuda=False).with_privacy_unit(UNIT)
    expected = record_budget("approx", 1.0, 1e-5, 3)
    assert (unit.learner.epsilon, unit.learner.delta) == pytest.approx(expected)
    spent = unit_spend("approx", *expected, 3)
    assert spent[0] <= 1.0 * (1 + 1e-12) and spent[1] <= 1e-5 * (1 + 1e-12)
    grouped, event = _learner(unit.learner), _learner(config)
    if isinstance(config, NaiveGaussianConfig):  # the per-stream budget epsilon/(2m), at the record level
        assert event.stream_epsilon / grouped.stream_epsilon == pytest.approx(3.0, rel=1e-12)
        assert grouped.noise_multiplier(0.125, 8) > event.noise_multiplier(0.125, 8)
    else:  # the memory uses' multiplier is the one an event-level learner at the record budget draws
        at_record_budget = _learner(type(config)(**{**_fields(config), "epsilon": expected[0], "delta": expected[1]}))
        assert grouped.memory_noise_multiplier == pytest.approx(at_record_budget.memory_noise_multiplier, rel=1e-12)
        assert grouped.memory_noise_multiplier > event.memory_noise_multiplier


def _fields(config) -> dict:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def test_a_job_budget_share_becomes_the_units_and_l2dp_takes_none():
    share = JobBudget(2.0, 1e-5).split({"lifelong": "approx", "other": "approx"})["lifelong"]
    config = BoundedAGEMConfig(**COMMON, task_size=64, epsilon=share.epsilon, delta=share.delta, memory_uses=3)
    unit = LifelongParams(config, budget=share, allow_cuda=False).with_privacy_unit(UNIT)
    assert unit.budget.max_records == 3 and unit.budget.epsilon == share.epsilon
    assert (unit.learner.epsilon, unit.learner.delta) == pytest.approx(
        record_budget("approx", share.epsilon, share.delta, 3))
    with pytest.raises(ValueError, match="unaudited"):
        LifelongParams(L2DPConfig(**COMMON, epsilon=share.epsilon), budget=share)
    with pytest.raises(ValueError, match="budget share per unit"):
        LifelongParams(config, privacy_unit=UNIT)
    with pytest.raises(ValueError, match="noise_multiplier"):
        LifelongParams(NaiveGaussianConfig(**COMMON, task_size=64, num_tasks=2, noise_multiplier=1.0)
                       ).with_privacy_unit(UNIT)


def _row(task: str, label: int, user, seed: int) -> tuple:
    return ("s", task, np.random.default_rng(seed).uniform(-1, 1, 4), label, user)


def _run(elements: list, transform, tmp_path) -> tuple[list, list, dict]:
    """Releases, dead letters and the counters ``elements`` (accepted rows) and ``dropped_over_records``."""
    pipeline = beam.Pipeline(options=batch_options())
    out = pipeline | beam.Create(elements, reshuffle=False) | transform
    for name, items in (("rows", out.releases), ("dead", out.dead_letter)):
        _ = (items | f"Pickle{name}" >> beam.Map(lambda x: pickle.dumps(x).hex())
             | f"Write{name}" >> beam.io.WriteToText(str(tmp_path / name)))
    result = pipeline.run()
    result.wait_until_finish()
    counters = {name: sum(c.committed for c in result.metrics().query(
        MetricsFilter().with_namespace(namespace).with_name(name))["counters"])
        for namespace, name in (("beam_dp/lifelong", "elements"), ("beam_dp/units", "dropped_over_records"))}
    rows, dead = ([pickle.loads(bytes.fromhex(line)) for f in sorted(tmp_path.glob(f"{name}*"))
                   for line in f.read_text().splitlines() if line] for name in ("rows", "dead"))
    return rows, dead, counters


def test_a_unit_over_k_rows_keeps_k_and_bad_ids_blocks_and_markers_are_dead_letters(tmp_path):
    elements = [_row("0", i % 2, "ann", i) for i in range(5)] + [_row("0", 1, "bob", 10 + i) for i in range(2)]
    elements += [_row("1", 0, "cat", 20)]
    elements += [_row("1", 0, "", 30), ("s", "1", np.zeros(4), 1),  # bad ids: empty, and a label where the id is
                 ("s", "1", np.zeros((2, 4)), np.array([0, 1]), "dan-id"), ("s", "0", END_OF_TASK, "eve-id")]
    params = LifelongParams(L2DPConfig(**COMMON, epsilon=1.0), allow_cuda=False, torch_threads=1)
    rows, dead, counters = _run(elements, LifelongLearner(params, privacy_unit=UNIT), tmp_path)
    assert counters == {"elements": 3 + 2 + 1, "dropped_over_records": 2}
    assert sorted(d.reason for d in dead) == sorted([Reason.BAD_UNIT_ID, Reason.BAD_UNIT_ID, Reason.WRONG_SHAPE,
                                                    Reason.MALFORMED])
    assert not any(name in repr(d) for d in dead for name in ("ann", "dan-id", "eve-id"))
    assert sorted(r.step for r in rows) == [1, 2]
    for row in rows:
        meta = json.loads(row.meta)
        assert (meta["privacy_unit"], meta["max_records"]) == ("user", 3)
        assert meta["guarantee_basis"].startswith("paper_claim")
        assert row.epsilon_spent == pytest.approx(1.0 / 3)
        assert row.job_epsilon_spent == pytest.approx(unit_spend("approx", row.epsilon_spent, 0.0, 3)[0])
        assert row.job_epsilon_spent <= 1.0 * (1 + 1e-12)


def test_without_a_unit_releases_are_those_of_an_event_level_run(tmp_path):
    elements = [_row("0", i % 2, "-", i)[:4] for i in range(6)]
    params = LifelongParams(L2DPConfig(**COMMON, epsilon=1.0), allow_cuda=False, torch_threads=1)
    default, _, _ = _run(elements, LifelongLearner(params), tmp_path / "default")
    explicit, _, _ = _run(elements, LifelongLearner(params, privacy_unit=None), tmp_path / "explicit")
    assert len(default) == 2 and [r.value for r in sorted(default)] == [r.value for r in sorted(explicit)]
    assert all("privacy_unit" not in json.loads(r.meta) for r in default)


def test_the_event_level_noise_binding_is_the_one_before_privacy_units():
    params = LifelongParams(L2DPConfig(**COMMON, epsilon=1.0), allow_cuda=False)
    assert calibration_binding(params) == "b1:0dfd67e24cf04c72c5fccf6d98116045"
