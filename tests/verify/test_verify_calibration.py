"""Each sum family's releases verify, and fail once their declaration differs from what the mechanism
rebuilt from the rows' public parameters declares (``beam_dp.verify_calibration``); exact copies of
a release are one release; problem lines are capped per kind."""

from __future__ import annotations

import json

import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.sums.factory import make_counter
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.verify import PROBLEM_LINES, verify_job
from tests.conftest import TEST_KEY

SUMS = {
    "kary": lambda: make_counter("kary", horizon=40, dim=2, epsilon=1.0, clip_bound=1.0),
    "kary-unbounded": lambda: make_counter("kary", horizon=None, dim=2, epsilon=1.0, clip_bound=1.0),
    "honaker-gaussian": lambda: make_counter("honaker", horizon=40, noise="gaussian", dim=2, epsilon=1.0,
                                             delta=1e-6, clip_bound=1.0),
    "binary-gamma": lambda: make_counter("tree", horizon=40, noise="gamma", dim=2, epsilon=1.0, clip_bound=1.0),
    "binary-paper-gaussian": lambda: make_counter("tree", horizon=40, noise="gaussian", calibration="paper", dim=2,
                                                  epsilon=1.0, delta=1e-6, clip_bound=1.0),
    "binary-discrete-laplace": lambda: make_counter("tree", horizon=40, noise="discrete_laplace", dim=1,
                                                    epsilon=1.0, clip_bound=1.0),
    "hybrid": lambda: make_counter("tree", horizon=None, noise="gamma", dim=2, epsilon=1.0, clip_bound=1.0),
    "doubling-gaussian": lambda: make_counter("tree", horizon=None, unbounded="doubling", noise="gaussian", dim=2,
                                              epsilon=1.0, delta=1e-6, clip_bound=1.0),
    "window-gamma": lambda: WindowTreeSum(dim=2, epsilon=1.0, clip_bound=0.5, window=12),
    "window-gaussian": lambda: WindowTreeSum(dim=2, epsilon=1.0, delta=1e-5, noise="gaussian", clip_bound=0.5,
                                             window=12, calibration="paper"),
    "blt": lambda: make_counter("blt", horizon=40, noise="gaussian", dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0),
    "blt-unbounded": lambda: make_counter("blt", horizon=None, noise="gaussian", dim=2, epsilon=1.0, delta=1e-6,
                                          clip_bound=1.0),
    "toeplitz": lambda: make_counter("toeplitz", horizon=40, noise="gaussian", dim=2, epsilon=1.0, delta=1e-6,
                                     clip_bound=1.0),
}


def _rows(mechanism, steps=40, stream="s"):
    noise, state, rows = NoiseSource(TEST_KEY), mechanism.init_state(stream), []
    g = mechanism.guarantee
    for _ in range(steps):
        state, (r,) = mechanism.step(state, None, noise)
        rows.append(dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta=dict(r.meta), value=r.value,
                         epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent, epsilon_budget=g.epsilon,
                         delta_budget=g.delta, noise_domain="Sum", composition=mechanism.composition,
                         purpose=r.purpose, noise=r.noise, job_epsilon_budget=g.epsilon, job_delta_budget=g.delta))
    return rows


def _reweighted(row, factor):
    declared = json.loads(row["noise"])
    declared["terms"] = [[law, s, c, w * factor] for law, s, c, w in declared["terms"]]
    return dict(row, noise=json.dumps(declared), epsilon_spent=row["epsilon_spent"] * factor)


@pytest.mark.parametrize("family", sorted(SUMS))
def test_a_sums_releases_verify_and_a_reweighted_declaration_fails(family):
    rows = _rows(SUMS[family]())
    verdict = verify_job(rows)
    assert verdict.ok, verdict.problems
    # one release's weights lowered 10%, its stated spend lowered to match: consistent with itself
    # (the recomputed spend equals the stated one), but not the mechanism's declaration at that step
    doctored = verify_job(rows[:-1] + [_reweighted(rows[-1], 0.9)])
    assert any("do not declare the noise their mechanism's public calibration gives" in p
               for p in doctored.problems), doctored.problems
    # a lower budget on every row: the mechanism of that budget declares larger scales
    lowered = [dict(r, epsilon_budget=0.5, job_epsilon_budget=0.5, epsilon_spent=min(r["epsilon_spent"], 0.5))
               for r in rows]
    assert any("public calibration" in p for p in verify_job(lowered).problems)


def test_meta_that_does_not_rebuild_the_mechanism_fails():
    rows = _rows(SUMS["blt"]())
    broken = [dict(r, meta={k: v for k, v in r["meta"].items() if k != "horizon"}) for r in rows]
    assert any("do not rebuild a blt" in p for p in verify_job(broken).problems)
    other_fit = [dict(r, meta=dict(r["meta"], fit_horizon=7)) for r in rows]
    assert any("its meta says fit_horizon 7" in p for p in verify_job(other_fit).problems)


def test_exact_copies_are_one_release_and_different_copies_clash_with_capped_lines():
    rows = _rows(SUMS["kary"]())
    verdict = verify_job(rows + rows[:5] + rows[:5])
    assert verdict.ok and verdict.domains[0].releases == len(rows), verdict.problems
    assert any("10 release(s) of 'Sum' are exact copies of another" in n for n in verdict.notes), verdict.notes
    other = [dict(r, value=r["value"] + 1.0) for r in rows]  # a second draw at every step
    problems = verify_job(rows + other).problems
    assert sum("appears 2 times: two transforms share the noise domain" in p for p in problems) == PROBLEM_LINES
    assert f"... and {len(rows) - PROBLEM_LINES} more problem(s) of this kind: duplicate" in problems
    assert len(problems) == PROBLEM_LINES + 1


def test_an_unknown_mechanism_or_a_foreign_purpose_fails():
    rows = _rows(SUMS["kary"]())
    assert any("which beam_dp does not have" in p for p in verify_job([dict(r, mechanism="mine") for r in rows]
                                                                       ).problems)
    assert any("carry purpose 'model:1'" in p for p in verify_job([dict(r, purpose="model:1") for r in rows]).problems)
