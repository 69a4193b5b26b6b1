"""Exact likelihood-ratio audit of ERM output perturbation at its worst-case neighbours.

Algorithm 1 (``ContinualReleaseMechanism(variant="independent")``: each b0-block trained alone and
released with K-norm noise) on a Huber model whose worst-case neighbours attain the sensitivity: every
row has x = 1 (‖x̃‖ = R) and a residual far beyond the Huber threshold, so the data term of F is linear
and changing one label from +50 to −50 moves the exact minimiser by exactly L/(λ n). The calibrated
Δ = (1 + s)·L/(λ n) (certified slack s) is then attained to within the slack.

The statistic is the exact log-likelihood ratio of the K-norm law, ``‖o − c'‖ − ‖o − c‖`` (times 1/b),
with the centres c, c' held out: the mechanism's noise-free releases (``ZeroNoise``) on D and D'. Its
privacy loss is at most ``‖c − c'‖/b``; the audit (``beam_dp.testing.audit``, Clopper–Pearson at 95 %,
thresholds chosen on one half of the samples, evaluated on the other) gives a lower bound on ε.

* The honest mechanism's bound stays below its claimed ε, and above what the spec's calibration
  (Δ = 2L/(λn), twice the noise) allows at all: with that noise this pair's exact loss is ≤ ε/2, so a
  valid lower bound above ε/2 shows the mechanism adds no more than the noise its sensitivity needs.
* Its half-noise mutant (``ScaledNoise`` factor 0.5: true loss ≈ 2ε) is caught (bound > ε).

Noise: the draws are the mechanism's own K-norm cells, taken in one vectorised ``draw_cells`` call over
one stream per run (cell (stream, purpose, model 0)); a few runs check that the mechanism's releases are
exactly ``centre + that cell`` (honest and mutant), so the fast path is the mechanism's release.
"""

from __future__ import annotations

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.erm import ContinualReleaseMechanism, HuberRegression, LabelledRows
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import ScaledNoise, audit_with_mutant, release_matrix, run_stream
from tests.conftest import TEST_KEY

MODEL = HuberRegression(n_features=1, clip_bound=1.0, huber=1.0)  # d = 2, L = h·R = √2
B0, EPSILON = 4, 1.0
X = np.ones((B0, 1))
Y_D, Y_D2 = np.array([50.0, 50.0, 50.0, 50.0]), np.array([-50.0, 50.0, 50.0, 50.0])  # one label changed
RUNS = 20_000  # statistic samples per neighbour


def mechanism(calibration: str = "certified") -> ContinualReleaseMechanism:
    return ContinualReleaseMechanism(update=B0, base=B0, variant="independent", model=MODEL, lam=1.0,
                                     epsilon=EPSILON, calibration=calibration)


def release(mech, y, noise, stream: str = "audit"):
    (r,) = run_stream(mech, [LabelledRows(X, y)], noise, stream)
    return r


# release_matrix lays a model out as its sorted value parts (intercepts, weights): that order of w's coordinates
ORDER = np.concatenate([np.ravel(v) for _, v in sorted(MODEL.to_value(np.arange(MODEL.dim)).items())]).astype(int)


def cells(mech, noise: NoiseSource, tag: str, scale: float) -> np.ndarray:
    """The K-norm noise the mechanism adds to model 0 of streams ``tag/0 .. tag/RUNS-1`` (release order)."""
    streams = [f"{tag}/{i}" for i in range(RUNS)]
    return noise.draw_cells("k_norm", streams, mech._noise_purpose("gamma"), (0,), scale, MODEL.dim)[:, ORDER]


def audit(calibration: str):
    mech = mechanism(calibration)
    c, c2 = (release_matrix([release(mech, y, ZeroNoise())])[0] for y in (Y_D, Y_D2))  # held-out centres
    honest = release(mech, Y_D, NoiseSource(TEST_KEY))
    scale = honest.meta["noise_scale"]
    noise = NoiseSource(TEST_KEY)
    unit_d, unit_d2 = cells(mech, noise, "D", 1.0), cells(mech, noise, "D'", 1.0)
    # the fast path is the mechanism's release: centre + its cell, at the honest and at the mutant scale
    for i in range(3):
        for factor in (1.0, 0.5):
            source = NoiseSource(TEST_KEY) if factor == 1.0 else ScaledNoise(TEST_KEY, factor)
            got = release_matrix([release(mech, Y_D, source, f"D/{i}"), release(mech, Y_D2, source, f"D'/{i}")])
            np.testing.assert_allclose(got, np.stack([c, c2]) + factor * scale * np.stack([unit_d[i], unit_d2[i]]),
                                       rtol=1e-12, atol=1e-12)

    def llr(o: np.ndarray) -> np.ndarray:
        return (np.linalg.norm(o - c2, axis=1) - np.linalg.norm(o - c, axis=1)) / scale

    def sample(factor: float):  # K-norm at scale s·factor is factor times the scale-s draw of the same cell
        return llr(c + factor * scale * unit_d), llr(c2 + factor * scale * unit_d2)

    report = audit_with_mutant(f"ERM independent blocks ({calibration})", sample, honest.epsilon_spent)
    return mech, c, c2, honest, report


def test_certified_calibration_is_tight_and_its_half_noise_mutant_is_caught():
    mech, c, c2, honest, report = audit("certified")
    shift = np.linalg.norm(c - c2)
    # the pair attains the calibrated sensitivity to within the certified slack (the solver's stop)
    assert 0.99 * mech.sens(B0) <= shift <= mech.sens(B0)
    assert honest.epsilon_spent == EPSILON
    assert report.lower_bound <= EPSILON, report.row()            # honest: a valid bound stays under ε
    assert report.lower_bound > EPSILON / 2, report.row()         # more than twice the noise could show
    assert report.mutant_caught, report.row()                    # half the noise: bound > ε


def test_spec_calibration_carries_twice_the_noise_the_pair_needs():
    """The spec's 2L/(λn): the same pair's exact loss is ≤ ε/2 (the audit cannot exceed it), and its
    half-noise mutant (the certified noise, about) is not caught: the 2× the certified calibration drops."""
    mech, c, c2, honest, report = audit("spec")
    assert np.linalg.norm(c - c2) <= 0.5 * mech.sens(B0)
    assert report.lower_bound <= EPSILON / 2, report.row()
    assert not report.mutant_caught, report.row()
