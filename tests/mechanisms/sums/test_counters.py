"""Every counter: exactness without noise, state round trip, ledger totals, calibration (empirical
variance vs the analytic one, with a half-noise negative control), Honaker bookkeeping, targets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core import Guarantee, NoiseSource, PrivacyLedger
from beam_dp.mechanisms import BinaryTreeSum
from beam_dp.mechanisms.sums import HonakerTreeSum, make_counter, resolve_counter
from beam_dp.mechanisms.sums.blt_math import BLT
from beam_dp.mechanisms.sums.fitted_params import blt_for, kary_fit_for
from beam_dp.mechanisms.sums.kary_math import kary_digits, kary_max_variance, pure_estimate_vars
from beam_dp.testing.noise import ZeroNoise
from beam_dp.testing.stats import gaussian_variance_matches, mean_matches
from tests.mechanisms.sums.helpers import CASES, KEY, HalfNoise, build, run_errors

ids = [f"{c}-{n}" for c, n in CASES]


@pytest.mark.parametrize("counter,noise", CASES, ids=ids)
def test_exact_with_zero_noise_and_clipping(counter, noise):
    mech = build(counter, noise, horizon=40, dim=3, clip_bound=1.5)
    rng = np.random.default_rng(1)
    state, total = mech.init_state("s"), np.zeros(3)
    for t in range(1, 41):
        block = rng.normal(0, 1.5, size=(rng.integers(0, 4), 3)) if t % 5 else None  # some empty steps
        if block is not None:
            norms = np.linalg.norm(block, axis=1, keepdims=True)
            total += (block * np.minimum(1.0, 1.5 / np.maximum(norms, 1e-300))).sum(axis=0)
        state, (rel,) = mech.step(state, block, ZeroNoise())
        np.testing.assert_allclose(rel.value, total, atol=1e-9)
        assert rel.step == t and rel.mechanism == mech.name and 0 < rel.epsilon_spent <= mech.epsilon * (1 + 1e-9)


@pytest.mark.parametrize("counter,noise", CASES, ids=ids)
def test_state_round_trip_and_determinism(counter, noise):
    mech = build(counter, noise, horizon=64, dim=2)
    noise_src, rng = NoiseSource(KEY), np.random.default_rng(2)
    blocks = [rng.normal(size=(2, 2)) for _ in range(30)]
    state = mech.init_state("s")
    for block in blocks[:17]:
        state, _ = mech.step(state, block, noise_src)
    restored = mech.decode_state(mech.encode_state(state))
    assert mech.encode_state(restored) == mech.encode_state(state)
    outs = []
    for start in (state, restored):
        s, rels = start, []
        for block in blocks[17:]:
            s, rel = mech.step(s, block, noise_src)
            rels += rel
        outs.append(rels)
    assert outs[0] == outs[1]  # byte-identical releases from the restored state


@pytest.mark.parametrize("counter,noise", CASES, ids=ids)
def test_ledger_totals_within_budget_and_match_epsilon_spent(counter, noise):
    horizon = 64
    mech = build(counter, noise, horizon=horizon)
    ledger = PrivacyLedger(Guarantee(mech.epsilon, mech.delta))
    state = mech.init_state("s")
    for t in range(1, horizon + 1):
        ledger.record(mech.charges_at(t))
        state, (rel,) = mech.step(state, None, ZeroNoise())
        eps, delta = ledger.worst(t)
        assert math.isclose(eps, rel.epsilon_spent, rel_tol=1e-6, abs_tol=1e-12), t
        assert delta == rel.delta_spent
    ledger.check(horizon)
    # the budget is used in full at the horizon (exact calibration, no slack)
    assert math.isclose(ledger.worst(horizon)[0], mech.epsilon, rel_tol=1e-6)


# -- calibration: analytic vs empirical variance; the half-noise control must fail -----------------
RUNS, STEPS = 800, 24


@pytest.mark.slow
@pytest.mark.parametrize("counter,noise", CASES, ids=ids)
def test_empirical_variance_matches_analytic_and_half_noise_fails(counter, noise):
    mech = build(counter, noise, horizon=STEPS)
    analytic = np.array([mech.noise_var(t) for t in range(1, STEPS + 1)])
    ok = {}
    for label, source in (("real", NoiseSource(KEY)), ("half", HalfNoise(KEY))):
        errors = run_errors(mech, source, RUNS, STEPS)
        if noise == "gaussian":
            # per step: sum(e²)/var ~ chi²(RUNS) over independent runs; Bonferroni over the steps
            ok[label] = all(gaussian_variance_matches(errors[:, t], analytic[t], confidence=1 - 1e-3 / STEPS)
                            for t in range(STEPS))
        else:
            # K-norm sums are not Gaussian: the mean of e² within 4.5 standard errors (sample SE of e²;
            # ~1e-5 two-sided per step, Bonferroni over 24 steps)
            ok[label] = mean_matches(errors**2, analytic, n_se=4.5)
    assert ok["real"], "the analytic variance does not match the empirical one"
    assert not ok["half"], "a half-noise mechanism passed the calibration check"


# -- Honaker bookkeeping ------------------------------------------------------------------------
def test_binary_honaker_uses_the_tree_budget_and_beats_it():
    tree = BinaryTreeSum(dim=1, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian",
                         calibration="analytic", horizon=1024)
    hon = build("honaker", "gaussian", horizon=1024)
    assert hon.levels == tree.levels and math.isclose(hon.level_noise[3].scale, tree.node_noise.scale, rel_tol=1e-6)
    ts = np.arange(1, 1025)
    tree_var = np.array([tree.noise_var(int(t)) for t in ts])
    hon_var = np.array([hon.noise_var(int(t)) for t in ts])
    assert np.all(hon_var <= tree_var * (1 + 1e-12)) and math.isclose(hon_var[0], tree_var[0], rel_tol=1e-9)  # a leaf alone: no gain
    v = hon.estimate_vars / hon.level_noise[0].scale ** 2
    np.testing.assert_allclose(v, 2.0 ** np.arange(11) / (2.0 ** np.arange(1, 12) - 1))  # v_l = 2^l/(2^{l+1}-1) σ²


def test_kary_digits_and_exact_max():
    digits = kary_digits(np.arange(1, 200), 5, 3)
    np.testing.assert_array_equal(digits[0] + 5 * digits[1] + 25 * digits[2], np.arange(1, 200))
    rng = np.random.default_rng(3)
    for horizon, arity, levels in [(100, 3, 3), (1000, 7, 2), (4096, 4, 7), (999, 10, 3)]:
        v = rng.random(levels)
        brute = (kary_digits(np.arange(1, horizon + 1), arity, levels).T @ v).max()
        assert math.isclose(kary_max_variance(horizon, arity, levels, v), brute, rel_tol=1e-12)


def test_honaker_tree_released_nodes_and_invalid_parameters():
    mech = HonakerTreeSum(dim=1, epsilon=1.0, clip_bound=1.0, arity=3, levels=3, level_weights=[0.6, 0.0, 0.4])
    assert mech.nodes_noised_at(9) == [(0, 9), (2, 1)]  # level 1 carries no noise
    assert [c.first for c in mech.charges_at(9)] == [9, 1] and math.isclose(sum(c.loss.pure_epsilon for c in mech.charges_at(9)), 1.0)
    for bad in (dict(arity=1, levels=2), dict(arity=2, levels=0), dict(arity=2, levels=2, level_weights=[0.0, 1.0]),
                dict(arity=2, levels=2, level_weights=[1.0])):
        with pytest.raises(ValueError):
            HonakerTreeSum(dim=1, epsilon=1.0, clip_bound=1.0, **bad)
    with pytest.raises(ValueError):
        build("kary", "gaussian")
    with pytest.raises(ValueError):
        make_counter("fancy", dim=1, epsilon=1.0, clip_bound=1.0)


def test_auto_picks_blt_for_gaussian_and_kary_for_pure_and_purposes_differ():
    assert resolve_counter("auto", "gaussian") == "blt" and resolve_counter("auto", "gamma") == "kary"
    purposes = {build(c, n).purpose for c, n in CASES}
    assert len(purposes) == 4 and "tree" not in purposes  # never shares noise with a tree on the same key


# -- the targets, on the shipped fitted parameters (exact, analytic) ----------------------
@pytest.mark.parametrize("log2", [16, 20])
def test_targets_on_shipped_parameters(log2):
    horizon = 2**log2
    levels = log2 + 1
    binary_gauss = levels * log2  # max popcount · L_T nodes of variance L_T z²Δ₂²  (units z²Δ₂²)
    blt: BLT = blt_for(horizon)
    assert blt.buffers <= 4
    assert blt.max_variance_units(horizon) <= binary_gauss / 10
    binary_pure = levels**2 * log2  # units (d+1)(Δ₂/ε)²
    fit = kary_fit_for(horizon)
    kary = kary_max_variance(horizon, fit.arity, fit.levels, pure_estimate_vars(np.asarray(fit.weights), fit.arity))
    assert kary <= binary_pure / 3
