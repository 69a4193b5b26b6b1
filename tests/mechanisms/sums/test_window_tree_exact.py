"""The window tree's exact calibration: its joint sensitivity enumerated, its sigma the smallest
passing the analytic Gaussian test, its spend the whole epsilon, its declaration recomputed.

The joint sensitivity is brute-forced from the node structure alone (``node_steps`` coverage and
the nodes each release uses, ``nodes_used``), not from ``nodes_containing`` or ``joint_nodes``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core.calibration import analytic_gaussian_delta, analytic_gaussian_sigma, sigma_window_002
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

KEY = bytes(range(32))


def gaussian(window: int, **kw) -> WindowTreeSum:
    return WindowTreeSum(dim=2, epsilon=kw.pop("epsilon", 0.7), delta=1e-6, clip_bound=1.0, noise="gaussian",
                         window=window, **kw)


def touched_nodes(mech: WindowTreeSum, horizon: int) -> dict[int, set]:
    """For every step ``t <= horizon`` still protected at ``horizon`` (``horizon - t < B``): the noisy
    nodes that some release ``s <= horizon`` uses and whose value step ``t`` changes (``t`` in the
    node's span). Also checks that no release up to ``horizon`` holds such a step in its clean part."""
    used = {node for s in range(1, horizon + 1) for node in mech.nodes_used(s)}
    out = {}
    for t in range(max(1, horizon - mech.block + 1), horizon + 1):
        assert all(mech.clean_through(s) < t for s in range(1, horizon + 1))
        out[t] = {node for node in used if mech.node_steps(node)[0] <= t <= mech.node_steps(node)[1]}
    return out


@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 8, 13, 16])
def test_joint_sensitivity_is_the_most_nodes_one_protected_step_moves(window):
    mech = gaussian(window)
    worst = 0
    for horizon in range(1, 3 * mech.block + 2):
        for t, nodes in touched_nodes(mech, horizon).items():
            assert len(nodes) <= mech.joint_nodes, (t, horizon, nodes)
            assert len({node[1] for node in nodes}) == len(nodes)  # at most one node per level
            worst = max(worst, len(nodes))
    assert worst == mech.joint_nodes == mech.levels == (window - 1).bit_length() + 1
    # every step of a later block reaches all its levels before it expires
    k2 = range(mech.block + 1, 2 * mech.block + 1)
    assert all(max(len(touched_nodes(mech, h).get(t, ())) for h in range(t, t + mech.block)) == mech.levels for t in k2)


@pytest.mark.parametrize("window", [1, 4, 8, 24, 100])
def test_analytic_is_the_default_and_the_smallest_passing_sigma(window):
    mech = gaussian(window)
    assert mech.calibration == "analytic" and mech.node_noise.calibration == "analytic"
    sens = mech.sensitivity * math.sqrt(mech.joint_nodes)
    sigma = mech.node_noise.scale
    assert sigma == pytest.approx(analytic_gaussian_sigma(0.7, 1e-6, sens), rel=1e-12)
    assert analytic_gaussian_delta(0.7, sens / sigma) <= 1e-6
    assert analytic_gaussian_delta(0.7, sens / (sigma * (1 - 1e-6))) > 1e-6  # any smaller sigma fails
    epsilon, delta = mech.max_spend()
    assert epsilon == pytest.approx(0.7, rel=1e-6) and epsilon <= 0.7 * (1 + 1e-9) and delta == 1e-6


@pytest.mark.parametrize("window", [4, 8, 24])
def test_paper_calibration_stays_a_labelled_option_and_spends_less(window):
    paper = gaussian(window, calibration="paper")
    exact = gaussian(window)
    assert paper.node_noise.calibration == "paper"
    assert paper.node_noise.scale == pytest.approx(sigma_window_002(0.7, 1e-6, 2.0, paper.levels), rel=1e-12)
    assert paper.max_spend()[0] < 0.1 * 0.7  # the paper's sigma leaves > 90% of epsilon unspent here
    assert exact.node_noise.scale < paper.node_noise.scale / 10


@pytest.mark.parametrize("window", [1, 4, 8, 24])
def test_pure_calibration_is_exact_under_either_option(window):
    for calibration in ("paper", "analytic"):
        mech = WindowTreeSum(dim=3, epsilon=1.3, clip_bound=0.5, window=window, calibration=calibration)
        assert mech.node_noise.scale == pytest.approx(mech.sensitivity * mech.joint_nodes / 1.3, rel=1e-15)
        assert mech.max_spend() == (pytest.approx(1.3, rel=1e-12), 0.0)
        # a horizon shorter than the block: fewer completed nodes, less spent
        if mech.levels > 1:
            assert mech.max_spend(1)[0] == pytest.approx(1.3 / mech.levels, rel=1e-12)


def test_releases_declare_what_they_spend_and_the_last_spends_the_share():
    mech = gaussian(8)
    state = mech.init_state("s")
    source = NoiseSource(KEY)
    rng = np.random.default_rng(0)
    releases = []
    for _ in range(20):
        state, out = mech.step(state, rng.normal(size=2) * 0.3, source)
        releases += out
    assert len(releases) == 20
    for release in releases:
        recomputed = recomputed_epsilon(loss_of_declaration(release.noise), release.delta_spent)
        assert recomputed == pytest.approx(release.epsilon_spent, rel=1e-9)
        assert release.meta["calibration"] == "analytic"
    assert releases[-1].epsilon_spent == pytest.approx(0.7, rel=1e-6)  # the whole share, not a few percent
