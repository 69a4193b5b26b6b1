"""The certified sensitivity Δ(n) = (1 + s)·L/(λn) of ERM output perturbation: the slack s the solver
certifies, every variant calibrated to it (continual cumulative / basic / independent / sampled,
multi-resolution and its sampling variant, sliding window and its sampling variant), the spec's
2L/(λn) kept where no certificate holds (uncertified SGD, the as-published mode, ``calibration="spec"``),
a point that fails its test refused, neighbouring certified solves inside Δ, and version-1 states going
on under the certified calibration with releases that verify."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.clipping import clip_l2
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.core.state import decode_state
from beam_dp.mechanisms.erm import (
    ContinualReleaseMechanism,
    HuberRegression,
    MultiResolutionMechanism,
    SlidingWindowMechanism,
    SoftmaxRegression,
    certified_solve,
)
from beam_dp.mechanisms.erm.base import call_sensitivity
from beam_dp.mechanisms.erm.solver import CertificateError, certified_slack
from tests.conftest import TEST_KEY
from tests.mechanisms.erm.fixtures.make_erm_v1_states import BLOCKS, CASES
from tests.mechanisms.erm.util import TINY, blocks, run

TOL = 1e-3  # the mechanisms' default solver tolerance
COMMON = dict(model=TINY, lam=0.5, epsilon=0.8)
VARIANTS = {
    "continual": (lambda **kw: ContinualReleaseMechanism(update=2, base=4, **kw), 2),
    "continual_basic": (lambda **kw: ContinualReleaseMechanism(update=2, base=4, variant="basic", **kw), 2),
    "independent": (lambda **kw: ContinualReleaseMechanism(update=2, base=4, variant="independent", **kw), 2),
    "continual_sampled": (lambda **kw: ContinualReleaseMechanism(update=2, base=4, sampling=True, **kw), 2),
    "multires": (lambda **kw: MultiResolutionMechanism(block=4, **kw), 4),
    "multires_sampled": (lambda **kw: MultiResolutionMechanism(block=4, sampling=True, **kw), 4),
    "sliding": (lambda **kw: SlidingWindowMechanism(block=2, levels=3, **kw), 2),
    "sliding_sampled": (lambda **kw: SlidingWindowMechanism(block=2, levels=3, sampling=True, **kw), 2),
    "continual_gaussian": (lambda **kw: ContinualReleaseMechanism(update=2, base=4, noise="gaussian", delta=1e-6,
                                                                  **kw), 2),
}


def test_certified_slack_is_the_target_plus_rounding_headroom():
    assert certified_slack(TOL, 1) == pytest.approx(2 * TOL, rel=1e-12)
    assert certified_slack(TOL, 10**6) == pytest.approx(2 * TOL, rel=1e-12)  # 4n²·2⁻⁵³ = 4.4e-4 < τ
    big = 10**7
    assert certified_slack(TOL, big) == pytest.approx(TOL + 4 * big**2 * 2.0**-53, rel=1e-12)
    with pytest.raises(ValueError):
        certified_slack(0.0, 10)
    # Δ = (1 + s)·L/(λn) (+ √d·g when snapped); tolerance None: the spec's 2L/(λn), bit for bit
    assert call_sensitivity(TINY, 0.5, 8, TOL) == pytest.approx((1 + 2 * TOL) * TINY.lipschitz / (0.5 * 8), rel=1e-12)
    assert call_sensitivity(TINY, 0.5, 8, None) == 2.0 * TINY.lipschitz / (0.5 * 8)
    assert call_sensitivity(TINY, 0.5, 8, TOL, 2.0**-20) == pytest.approx(
        call_sensitivity(TINY, 0.5, 8, TOL) + math.sqrt(TINY.dim) * 2.0**-20, rel=1e-12)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_calibrates_to_the_certified_sensitivity(name):
    """Each call's declared Δ is the certified one at its n_norm, its scale about half the spec's at the
    same cost, and every release's declaration recomputes its spend."""
    make, size = VARIANTS[name]
    certified, spec = make(**COMMON), make(**COMMON, calibration="spec")
    data = blocks(12, size)
    runs = (run(mechanism, data, NoiseSource(TEST_KEY)) for mechanism in (certified, spec))
    for releases_c, releases_s in zip(*runs):
        for rc, rs in zip(releases_c, releases_s):
            for ec, es in zip(rc.meta["events"], rs.meta["events"]):
                n = ec["n_norm"]
                assert ec["sensitivity"] == call_sensitivity(TINY, 0.5, n, TOL)
                assert ec["sensitivity_slack"] == certified_slack(TOL, n)
                assert es["sensitivity"] == call_sensitivity(TINY, 0.5, n, None) and es["sensitivity_slack"] == 1.0
                ratio = (1 + certified_slack(TOL, n)) / 2
                assert ec["noise_scale"] == pytest.approx(ratio * es["noise_scale"], rel=1e-12)
                assert (ec["epsilon"], ec["mu"]) == pytest.approx((es["epsilon"], es["mu"]), rel=1e-12)
            assert rc.epsilon_spent == pytest.approx(rs.epsilon_spent, rel=1e-12)
            assert rc.epsilon_spent <= 0.8 * (1 + 1e-12)
            for r in (rc, rs):  # both calibrations' declarations recompute their spends
                assert recomputed_epsilon(loss_of_declaration(r.noise), r.delta_spent) == pytest.approx(
                    r.epsilon_spent, rel=1e-9)
            assert rc.noise != rs.noise  # the declaration states the certified Δ, not the spec's


def test_uncertified_and_as_published_keep_the_spec_bound():
    replication = MultiResolutionMechanism(block=4, uncertified=True, **COMMON)
    assert replication.sens(4) == call_sensitivity(TINY, 0.5, 4, None)
    with pytest.warns(UserWarning):
        published = MultiResolutionMechanism(block=4, as_published_not_private=True,
                                             model=SoftmaxRegression(n_features=1, n_classes=2), lam=0.5, epsilon=0.8)
    assert published.sens(4) == 2.0 * published.model.lipschitz / (0.5 * 4)
    with pytest.raises(ValueError, match="calibration"):
        MultiResolutionMechanism(block=4, calibration="half", **COMMON)


@pytest.mark.parametrize("model", [SoftmaxRegression(n_features=3, clip_bound=2.0, n_classes=3),
                                   HuberRegression(n_features=3, clip_bound=2.0, huber=0.5)], ids=lambda m: m.kind)
def test_neighbouring_certified_solves_lie_within_the_certified_sensitivity(model):
    """Random neighbouring member sets (one row replaced, by an extreme one half the time), biased
    regularisation (w_ref ≠ 0), λ small and large: ‖ŵ − ŵ'‖ ≤ (1 + s)·L/(λn) at tolerance 10⁻³."""
    rng = np.random.default_rng(7)
    for lam in (0.01, 1.0):
        for trial in range(12):
            n = int(rng.integers(3, 40))
            X = clip_l2(model.augment(rng.normal(size=(n, 3)) * 3), model.radius)[0]
            y = rng.integers(0, 3, n) if model.kind == "softmax" else rng.normal(size=n) * 4
            w_ref = rng.normal(size=model.dim) * 0.5
            X2, y2 = X.copy(), y.copy()
            X2[0] = model.augment(rng.normal(size=(1, 3)) * (100 if trial % 2 else 1))[0]
            y2[0] = (y[0] + 1) % 3 if model.kind == "softmax" else -y[0] * 50
            a = certified_solve(model, X, y, n, lam, w_ref, tolerance=TOL)
            b = certified_solve(model, X2, y2, n, lam, w_ref, tolerance=TOL)
            assert a.grad_norm <= a.target and b.grad_norm <= b.target
            assert np.linalg.norm(a.w - b.w) <= call_sensitivity(model, lam, n, TOL)


def test_a_point_that_fails_its_test_is_refused(monkeypatch):
    """The sensitivity assumes the returned point passed ‖∇F‖ ≤ τL/n: one that did not (here an
    iteration cap forced to 1) is refused, never released at the certified noise."""
    import beam_dp.mechanisms.erm.solver as solver

    mech = MultiResolutionMechanism(block=20, model=TINY, lam=1e-3, epsilon=1.0)
    monkeypatch.setattr(solver, "iteration_cap", lambda *a, **k: 1)
    with pytest.raises(CertificateError, match="refused"):
        run(mech, blocks(1, 20), NoiseSource(TEST_KEY))
    monkeypatch.undo()
    assert len(run(mech, blocks(1, 20), NoiseSource(TEST_KEY))[0]) == 1


def test_certified_and_spec_noise_are_independent_draws():
    """The two calibrations draw under different purposes: under one key the certified release's noise
    is not a public multiple of the spec release's (which would give the model away)."""
    data = blocks(1, 4)
    noise = [np.concatenate([np.ravel(v) for v in run(MultiResolutionMechanism(block=4, **COMMON, calibration=c),
                                                         data, NoiseSource(TEST_KEY))[0][0].arrays().values()])
             - np.concatenate([np.ravel(v) for v in run(MultiResolutionMechanism(block=4, **COMMON, calibration=c),
                                                           data)[0][0].arrays().values()])
             for c in ("certified", "spec")]
    ratio = noise[0] / noise[1]
    assert not np.allclose(ratio, ratio[0], rtol=1e-6)


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_version_1_state_goes_on_under_the_certified_calibration(name):
    """A state written by the version-1 code at the spec's calibration goes on with certified calls: the
    per-block costs are unchanged (each call still costs its share), so the spends equal those of a
    stream that never stopped, and every release declares noise that recomputes its spend (the old
    calls as restated keys, the new ones at the certified Δ)."""
    mechanism, size = CASES[name]
    data = blocks(2 * BLOCKS, size)
    state, uninterrupted = mechanism.init_state("s"), []
    for i, block in enumerate(data):
        state, releases = mechanism.step(state, block, NoiseSource(TEST_KEY))
        uninterrupted += releases if i >= BLOCKS else []
    restored, after = decode_state(type(state), (FIXTURES / f"erm_v1_{name}.state").read_bytes()), []
    for block in data[BLOCKS:]:
        restored, releases = mechanism.step(restored, block, NoiseSource(TEST_KEY))
        after += releases
    assert len(after) == len(uninterrupted) > 0
    for old, new in zip(after, uninterrupted):
        assert old.epsilon_spent == pytest.approx(new.epsilon_spent, rel=1e-9)
        assert recomputed_epsilon(loss_of_declaration(old.noise), old.delta_spent) == pytest.approx(
            old.epsilon_spent, rel=1e-9)
        assert old.meta["sensitivity"] == call_sensitivity(mechanism.model, mechanism.lam, old.meta["n_norm"], TOL)
