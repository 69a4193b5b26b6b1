"""Black-box audit of the window tree at its default, exact (analytic) Gaussian calibration.

The claim is window (ε, δ)-DP with σ the smallest passing the analytic test on the joint
sensitivity Δ₂√L_W, so it has no slack left: the audit's 95% Clopper–Pearson lower bound on ε (at
the claimed δ) must stay below the claim, and the half-noise mutant (``ScaledNoise(key, 0.5)``,
σ/2) must be flagged. Neighbours: one contribution −R → +R
(``tests.audit.helpers``); the attacked releases are those while the changed step is protected
(it and the next B − 1). Two positions, so both halves of the node structure are exercised:

* step 1 of W = 8: its 4 nodes are left children and the root, used by block 1's prefixes;
* step 4 = B of W = 4: its level-0 and level-1 nodes are right children, used only by block 2's
  suffixes (releases 4..7), next to its block's root.

Coordinate trick (200,000 independent 1-D experiments as the coordinates of one run), valid
because σ does not depend on the dimension (``same_calibration``).
"""

from __future__ import annotations

import pytest

from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.testing.audit import audit_with_mutant
from tests.audit.helpers import R, coordinate_samples, same_calibration

EPSILON = 1.0

# name -> (window, steps, changed step, attacked releases, delta). At δ = 1e-5 the bound rests on a
# tail of ~2 of the 200,000 samples, so one case claims δ = 1e-3 (≈200 samples in the tail) and
# separates honest from mutant more steadily.
CASES = {
    "window tree exact (W=8, step 1)": (8, 8, 1, slice(0, 8), 1e-5),
    "window tree exact (W=4, step 4)": (4, 7, 4, slice(3, 7), 1e-3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_exact_window_calibration_audits_below_its_claim_and_catches_half_noise(name):
    window, steps, changed, releases, delta = CASES[name]

    def make(n: int) -> WindowTreeSum:
        return WindowTreeSum(window=window, dim=n, epsilon=EPSILON, delta=delta, noise="gaussian", clip_bound=R)

    assert make(1).node_noise.calibration == "analytic"  # the default is the exact calibration
    assert same_calibration(make, 7)
    report = audit_with_mutant(name, coordinate_samples(make, steps, changed, 200_000, releases), EPSILON, delta)
    print("\n" + report.row())
    assert report.honest_ok, report
    assert report.mutant_caught, report
