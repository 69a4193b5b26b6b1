"""Unit-level audits of the per-record families: one unit's whole contribution (k records) changed.

A per-record family bounded to ``k`` records per unit is calibrated at the record budget
``record_budget(ε, k)`` (``with_record_unit``): one unit is then ε-DP by group privacy. Each audit runs
the mechanism its unit-level params build on a pair of neighbours that differ in **every** record of one
unit (k records at worst-case values), and a mutant calibrated at the record level (the record budget not
divided by k: the event-level params' mechanism) that still claims ε for the unit.

* ERM output perturbation (Algorithm 1, ``ContinualModelParams(variant="independent")``): a Huber model
  whose worst-case neighbours attain the sensitivity (as ``test_erm_exact_audit.py``): every row has
  x = 1 and a residual far beyond the Huber threshold, so changing k labels from +50 to −50 moves the exact
  minimiser by k·L/(λn): the group's sensitivity is exactly k times a record's, and group privacy is tight.
  The statistic is the K-norm law's exact log-likelihood ratio (centres from noise-free runs).
* PMWG (``GrowingDatabaseParams(mechanism="pmwg")``): the transcript event of
  ``tests/mechanisms/growing_db/test_pmwg_stats.py`` (a first query easy, then a second hard with sign +1)
  at t = n, the unit's k = 6 elements moved from cell 0 to cell 1; ``xi_n`` set so that one segment costs just
  under the unit's whole budget (a record's ε/k each).

Both bounds are Clopper–Pearson at 95 % (``beam_dp.testing.audit.epsilon_lower_bound``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from beam_dp.beam import ContinualModelParams, GrowingDatabaseParams
from beam_dp.beam.shell.unit_records import with_record_unit
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.mechanisms.erm import LabelledRows
from beam_dp.mechanisms.growing_db.base import Query
from beam_dp.mechanisms.growing_db.universe import IntRange, Universe
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import epsilon_lower_bound, release_matrix, run_stream, seeded_key
from tests.conftest import TEST_KEY

EPSILON, K = 1.0, 4
UNIT = RecordUnit("user", K)

# -- ERM --------------------------------------------------------------------------------------------
B0 = 8  # one block of 8 rows, the unit's K of them changed
X = np.ones((B0, 1))
Y_D = np.full(B0, 50.0)
Y_D2 = np.where(np.arange(B0) < K, -50.0, 50.0)
ERM_RUNS = 20_000  # statistic samples per neighbour


def erm_params() -> ContinualModelParams:
    return ContinualModelParams(n_features=1, update=B0, base=B0, variant="independent", lam=1.0, epsilon=EPSILON)


def _erm_audit(mech) -> tuple[float, float, float]:
    """``(lower bound, exact loss of the pair ‖c − c'‖/b, claimed record-level ε)`` of ``mech`` on the pair."""
    def release(y, noise, stream="audit"):
        (r,) = run_stream(mech, [LabelledRows(X, y)], noise, stream)
        return r

    c, c2 = (release_matrix([release(y, ZeroNoise())])[0] for y in (Y_D, Y_D2))
    honest = release(Y_D, NoiseSource(TEST_KEY))
    scale = honest.meta["noise_scale"]
    order = np.concatenate([np.ravel(v) for _, v in sorted(mech.model.to_value(np.arange(mech.model.dim)).items())])
    noise = NoiseSource(TEST_KEY)

    def cells(tag: str) -> np.ndarray:  # the mechanism's own unit-scale K-norm cells of model 0, a stream per run
        streams = [f"{tag}/{i}" for i in range(ERM_RUNS)]
        return noise.draw_cells("k_norm", streams, mech._noise_purpose("gamma"), (0,), 1.0,
                                mech.model.dim)[:, order.astype(int)]

    unit_d, unit_d2 = cells("D"), cells("D'")
    got = release_matrix([release(Y_D, NoiseSource(TEST_KEY), "D/0")])[0]  # the fast path is the release
    np.testing.assert_allclose(got, c + scale * unit_d[0], rtol=1e-12, atol=1e-12)

    def llr(o: np.ndarray) -> np.ndarray:
        return (np.linalg.norm(o - c2, axis=1) - np.linalg.norm(o - c, axis=1)) / scale

    bound = epsilon_lower_bound(llr(c + scale * unit_d), llr(c2 + scale * unit_d2)).epsilon
    return bound, float(np.linalg.norm(c - c2) / scale), honest.epsilon_spent


def test_erm_unit_level_calibration_holds_and_a_record_level_mutant_is_caught():
    honest, honest_loss, record_eps = _erm_audit(with_record_unit(erm_params(), UNIT).build_mechanism())
    mutant, mutant_loss, mutant_eps = _erm_audit(erm_params().build_mechanism())  # ε not divided by k
    assert record_eps == pytest.approx(EPSILON / K) and mutant_eps == EPSILON
    # the pair's exact loss: the unit's ε (within the certified slack) at unit-level noise, k·ε at record level
    assert 0.99 * EPSILON <= honest_loss <= EPSILON * (1 + 1e-9)
    assert mutant_loss == pytest.approx(K * honest_loss, rel=1e-9)
    assert honest <= EPSILON, honest
    assert honest > EPSILON / 2, honest  # tight: more noise than the unit needs would show
    assert mutant > EPSILON, mutant
    print(f"ERM unit-level audit (k={K}, eps={EPSILON}): honest {honest:.3f}, record-level mutant {mutant:.3f}")


# -- PMWG -------------------------------------------------------------------------------------------
PMWG_K = 6  # the event below is a weak attack (honest ~0.3 of ε): a mutant k times off shows at k = 6
COUNTS_D, COUNTS_D2 = (12, 10, 8), (12 - PMWG_K, 10 + PMWG_K, 8)  # the unit's k elements moved, t* = n
N = sum(COUNTS_D)
PMWG_RUNS = 4000


def pmwg_params(xi_n: float) -> GrowingDatabaseParams:
    return GrowingDatabaseParams(universe=Universe([IntRange("cell", 3)]), n=N, epsilon=EPSILON, alpha=0.15,
                                 xi_n=xi_n, clock=StepClock(start=0.0, period=1.0, end=10.0))


def _event_rate(mech, counts) -> np.ndarray:
    """Per run: 1 when the transcript event happens (``test_pmwg_stats._audit_event_rate``), else 0."""
    base, _ = mech.absorb(mech.init_state("audit"), np.repeat(np.arange(3), counts), NoiseSource(TEST_KEY))
    hits = np.zeros(PMWG_RUNS)
    for r in range(PMWG_RUNS):
        state = dataclasses.replace(base, stream=f"audit{r}")
        noise = NoiseSource(seeded_key(r, bytes(counts)))
        state, (first,) = mech.answer(state, Query(N, "a", np.array([0.0, 1.0, 0.0])), noise)
        if first.meta["hard"]:
            continue
        state, (second,) = mech.answer(state, Query(N, "b", np.array([1.0, 0.0, 0.0])), noise)
        hits[r] = second.meta["hard"] and second.meta["sign"] == 1
    return hits


@pytest.mark.slow
def test_pmwg_unit_level_calibration_holds_and_a_record_level_mutant_is_caught():
    xi_record = 2.25 / N * 1.000001  # one segment costs just under ε per element
    honest_params = with_record_unit(pmwg_params(PMWG_K * xi_record), RecordUnit("user", PMWG_K))
    assert honest_params.epsilon == pytest.approx(EPSILON / PMWG_K)  # its accountant charges at ε/k
    mutant_params = pmwg_params(xi_record)  # the record budget not divided: k times less noise
    bounds = []
    for params in (honest_params, mutant_params):
        mech = params.build_mechanism()
        bounds.append(epsilon_lower_bound(_event_rate(mech, COUNTS_D), _event_rate(mech, COUNTS_D2)).epsilon)
    honest, mutant = bounds
    assert honest <= EPSILON, honest
    assert mutant > EPSILON, mutant
    print(f"PMWG unit-level audit (k={PMWG_K}, eps={EPSILON}): honest {honest:.3f}, record-level mutant {mutant:.3f}")
