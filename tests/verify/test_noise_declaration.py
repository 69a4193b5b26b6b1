"""Noise declarations: every counter and tree release declares the noise of its worst-hit element, and
the spend recomputed from that declaration alone equals the release's ``epsilon_spent`` (so a verifier
holding only the row can check it), for every counter the jobs use, pure and Gaussian."""

import json
import math

import numpy as np
import pytest

from beam_dp.core import noise_declaration
from beam_dp.core.guarantee import ElementLoss
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import (
    DeclaredLoss,
    account,
    combined_declaration,
    declaration_json,
    loss_of_declaration,
    recomputed_epsilon,
)
from beam_dp.mechanisms.sums.factory import make_counter
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.verify import verify_job

KEY = bytes(range(32))
STEPS = 40
# the stated spend comes from the mechanism's own arithmetic (budget·count/levels, cached bisections),
# the recomputed one from Δ/scale sums: they agree to float rounding (~1e-15) and the analytic-Gaussian
# bisection's relative tolerance (1e-12); 1e-9 is well above both and far below any miscalibration
REL = 1e-9


def _counters():
    common = dict(dim=2, clip_bound=1.5)
    yield "kary", make_counter("kary", horizon=64, epsilon=0.7, **common)
    yield "honaker-gauss", make_counter("honaker", horizon=64, epsilon=0.7, delta=1e-6, noise="gaussian", **common)
    yield "binary", make_counter("tree", horizon=64, epsilon=0.7, **common)
    yield "hybrid-gauss", make_counter("tree", epsilon=0.7, delta=1e-6, noise="gaussian", calibration="analytic",
                                       **common)
    yield "doubling", make_counter("tree", unbounded="doubling", epsilon=0.7, **common)
    yield "blt", make_counter("blt", horizon=64, epsilon=0.7, delta=1e-6, noise="gaussian", **common)
    yield "toeplitz", make_counter("toeplitz", horizon=64, epsilon=0.7, delta=1e-6, noise="gaussian", **common)
    yield "window", WindowTreeSum(window=8, epsilon=0.7, **common)


@pytest.mark.parametrize("name,mechanism", list(_counters()), ids=[n for n, _ in _counters()])
def test_every_counter_release_declares_the_noise_its_spend_is_recomputed_from(name, mechanism):
    noise = NoiseSource(KEY)
    state = mechanism.init_state("s")
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        state, (release,) = mechanism.step(state, rng.normal(size=(3, 2)), noise)
        assert release.noise, f"{name}: release at step {release.step} declares no noise"
        terms = json.loads(release.noise)["terms"]
        assert {law for law, *_ in terms} <= {"gamma", "gaussian"}
        recomputed = recomputed_epsilon(loss_of_declaration(release.noise), release.delta_spent)
        assert recomputed == pytest.approx(release.epsilon_spent, rel=REL), (name, release.step)


def test_group_steps_declare_the_same_noise_as_single_streams():
    mechanism = make_counter("kary", horizon=64, dim=1, epsilon=1.0, clip_bound=1.0)
    group = mechanism.stack([mechanism.init_state("a"), mechanism.init_state("b")])
    single = mechanism.init_state("a")
    noise = NoiseSource(KEY)
    for _ in range(5):
        group, batch = mechanism.step_group(group, np.zeros((2, 1)), np.zeros(2), noise)
        single, (release,) = mechanism.step(single, None, noise)
        assert batch.noise == release.noise and all(r.noise == release.noise for r in batch.rows())


def test_of_noise_matches_the_loss_arithmetic_and_adds_terms():
    gauss = ElementLoss.of_noise("gaussian", 2.0, 4.0, 3.0)
    assert gauss.gaussian_mu_sq == pytest.approx(3 * 0.25, rel=1e-15) and gauss.pure_epsilon == 0.0
    pure = ElementLoss.of_noise("gamma", 2.0, 8.0, 2.0)
    assert pure.pure_epsilon == pytest.approx(0.5, rel=1e-15)
    both = pure + pure + gauss + ElementLoss()
    assert loss_of_declaration(both.declaration()) == pytest.approx((1.0, 0.75, 0.0, 0.0), rel=1e-15)
    assert ElementLoss(0.3).declaration() == "" and ElementLoss.of_noise("gamma", 1.0, 1.0, 0) == ElementLoss()
    assert recomputed_epsilon(DeclaredLoss(0.0, 1.0), 0.0) == math.inf
    for bad in ('{"terms": [["cauchy", 1, 1, 1]]}', '{"terms": [["gamma", 1, 0, 1]]}', "nonsense", '{"x": 1}'):
        with pytest.raises(ValueError):
            loss_of_declaration(bad)


def _rows(mechanism, steps=6):
    noise, state, rows = NoiseSource(KEY), mechanism.init_state("s"), []
    for _ in range(steps):
        state, (r,) = mechanism.step(state, None, noise)
        rows.append(dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta=dict(r.meta),
                         epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent,
                         epsilon_budget=mechanism.guarantee.epsilon, delta_budget=mechanism.guarantee.delta,
                         noise_domain="Sum", composition=mechanism.composition, purpose=r.purpose, noise=r.noise,
                         job_epsilon_budget=mechanism.guarantee.epsilon, job_delta_budget=mechanism.guarantee.delta))
    return rows


def test_the_verifier_fails_a_row_below_its_recomputed_spend_or_stripped_of_its_declaration():
    rows = _rows(make_counter("kary", horizon=64, dim=1, epsilon=1.0, clip_bound=1.0))
    assert verify_job(rows).ok
    halved = [dict(rows[0], epsilon_spent=rows[0]["epsilon_spent"] / 2)] + rows[1:]
    assert any("below the spend recomputed" in p for p in verify_job(halved).problems)
    stripped = [dict(r, noise="") for r in rows]
    assert any("lack the noise declaration" in p for p in verify_job(stripped).problems)
    # a declaration claiming a larger noise scale (less spend) than the mechanism's is not trusted
    # either: it is the mechanism's, checked by the test above; a release without one is a problem by
    # default, and only a note when lenient (outputs of versions before every family declared)
    other = [dict(r, mechanism="undeclaring_mechanism", noise="") for r in rows]
    verdict = verify_job(other, strict=False)
    assert verdict.ok and any("not recomputable" in n for n in verdict.notes)
    strict = verify_job(other)
    assert not strict.ok and any("not recomputable" in p for p in strict.problems)


def test_two_parameter_sets_in_one_domain_are_flagged_whatever_their_meta():
    """Issue 23 (a) on plain rows: a sum and a count (different meta, same mechanism) written under one
    domain collide on (domain, stream, step, purpose); a mechanism's several releases of one step with
    distinct purposes (ERM base and update, PMWG queries) do not."""
    sums = _rows(make_counter("kary", horizon=64, dim=1, epsilon=1.0, clip_bound=1.0))
    counts = [dict(r, meta={**r["meta"], "granularity": 1.0}) for r in _rows(
        make_counter("kary", horizon=64, dim=1, epsilon=1.0, clip_bound=0.5))]
    verdict = verify_job(sums + counts, epsilon=2.0, delta=0.0)
    assert sum("appears 2 times" in p for p in verdict.problems) == len(sums), verdict.problems
    parts = [dict(r, purpose=f"query:{i}") for i, r in enumerate(sums + sums)]
    problems = verify_job(parts).problems  # distinct keys; but a kary tree never writes purpose "query:*"
    assert problems and all("which that mechanism never writes" in p for p in problems), problems


def test_a_pure_domain_with_a_delta_is_flagged_from_the_rows():
    rows = _rows(make_counter("kary", horizon=64, dim=1, epsilon=1.0, clip_bound=1.0))
    doctored = [dict(r, delta_spent=0.5, delta_budget=0.5, job_delta_budget=0.5) for r in rows]
    verdict = verify_job(doctored)
    assert any("is 'pure' but reports delta 0.5" in p for p in verdict.problems), verdict.problems


def test_several_releases_of_one_step_carry_distinct_purposes():
    """PMWG answers two queries at one database size (one step): their purposes differ (the query's
    sequence number, which keys its noise), so the verifier does not mistake them for two transforms;
    the public synthetic histogram at that step has its own purpose."""
    from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
    from beam_dp.mechanisms.growing_db.pmwg import PMWG

    mech = PMWG(universe_size=4, n=5, epsilon=1.0, alpha=0.2)
    noise, state = NoiseSource(KEY), mech.init_state("s")
    state, _ = mech.step(state, GrowingBlock(np.array([0, 1, 2, 3, 0])), noise)
    queries = tuple(Query(5, f"q{i}", np.array([1.0, 0.0, 1.0, 0.0])) for i in range(2))
    state, releases = mech.step(state, GrowingBlock(np.zeros(0, np.int64), queries), noise)
    releases.append(mech.snapshot(state))
    assert [(r.step, r.purpose) for r in releases] == [(5, "query:0"), (5, "query:1"), (5, "synthetic")]


@pytest.mark.parametrize("calibration", ["paper", "analytic"])
def test_regression_releases_declare_both_trees_noise_and_fail_below_it(calibration):
    """PRIVINCREG1's model composes its two Gaussian trees (each at (ε/2, δ/2)); a release declares both
    trees' terms, so the spend recomputed from it (the two Gaussians composed exactly at the release's δ,
    no larger than the stated sum of the trees' spends) bounds the stated one from below, and a stated
    spend doctored to 0 fails the verifier. Tolerance REL: see the module constant."""
    from beam_dp.mechanisms.online.regression import PrivIncReg1

    mechanism = PrivIncReg1(dim=2, epsilon=0.8, delta=1e-6, horizon=8, calibration=calibration)
    state, noise, rng, rows = mechanism.init_state("s"), NoiseSource(KEY), np.random.default_rng(3), []
    for _t in range(6):
        block = [(rng.uniform(-0.5, 0.5, 2), float(rng.uniform(-1, 1))) for _ in range(3)]  # (x, y) records
        state, releases = mechanism.step(state, block, noise)
        rows += releases
    assert len(rows) == 6
    for r in rows:
        terms = json.loads(r.noise)["terms"]
        # both trees' nodes (equal (law, Δ, σ) terms merge: weights add, at least one node per tree)
        assert {t[0] for t in terms} == {"gaussian"} and sum(t[3] for t in terms) >= 2, r.noise
        recomputed = recomputed_epsilon(loss_of_declaration(r.noise), r.delta_spent)
        assert 0.5 * r.epsilon_spent < recomputed <= r.epsilon_spent * (1 + REL), (recomputed, r.epsilon_spent)
    labelled = [dict(noise_domain="reg", composition="approx",
                     stream=r.stream, step=r.step, mechanism=r.mechanism, meta="", epsilon_spent=r.epsilon_spent,
                     delta_spent=r.delta_spent, epsilon_budget=0.8, delta_budget=1e-6, job_epsilon_budget=0.8,
                     job_delta_budget=1e-6, purpose="", noise=r.noise) for r in rows]
    assert verify_job(labelled, strict=True).ok
    doctored = verify_job([dict(row, epsilon_spent=0.0) for row in labelled])
    assert any("below the spend recomputed" in p for p in doctored.problems), doctored.problems


def _fixed_account(epsilon: float, delta: float) -> tuple[float, float]:
    """A test account kind: declares its own (epsilon, delta)."""
    if epsilon < 0:
        raise ValueError("epsilon < 0")
    return epsilon, delta


def test_accounts_compose_basically_with_terms_and_leave_the_gaussian_part_the_rest_of_delta(monkeypatch):
    monkeypatch.setitem(noise_declaration.ACCOUNT_KINDS, "fixed", _fixed_account)
    gauss = ElementLoss.of_noise("gaussian", 1.0, 2.0)
    text = declaration_json(gauss.noise, (account("fixed", epsilon=0.5, delta=1e-6),))
    assert json.loads(text)["accounts"] == [{"kind": "fixed", "epsilon": 0.5, "delta": 1e-6}]
    loss = loss_of_declaration(text)
    assert loss == pytest.approx((0.0, 0.25, 0.5, 1e-6), rel=1e-15)
    # the Gaussian part takes what the account leaves of the release's delta
    assert recomputed_epsilon(loss, 3e-6) == pytest.approx(0.5 + gauss.epsilon_at(2e-6), rel=1e-12)
    # an account needing more delta than the release states cannot be honoured
    assert recomputed_epsilon(loss, 5e-7) == math.inf
    # merging two declarations keeps both accounts (basic composition)
    both = loss_of_declaration(combined_declaration(text, text))
    assert both == pytest.approx((0.0, 0.5, 1.0, 2e-6), rel=1e-15)
    for bad in ('{"terms": [], "accounts": [{"kind": "nope"}]}',
                '{"terms": [], "accounts": [{"kind": "fixed", "epsilon": -1, "delta": 0}]}',
                '{"terms": [], "accounts": [{"kind": "fixed", "epsilon": 1}]}',
                '{"terms": [], "accounts": [{"kind": "fixed", "epsilon": 1, "delta": 2}]}'):
        with pytest.raises(ValueError):
            loss_of_declaration(bad)
    with pytest.raises(ValueError, match="unknown account kind"):
        account("nope", x=1)
