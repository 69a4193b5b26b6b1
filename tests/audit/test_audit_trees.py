"""Black-box privacy audits of the tree mechanisms (harness: ``beam_dp.testing.audit``).

Each audit runs the real mechanism (real keyed noise; the runs are the streams of one group step,
each stream its own noise cells) on two neighbouring
streams that differ in one contribution (worst case: R → −R at the audited step, so Δ₂ = 2R), reads
only the releases, recovers the noisy node values that contain the changed step from release
differences, and uses their exact Laplace log-likelihood ratio as the statistic. The Clopper–Pearson
lower bound on ε (95%, Bonferroni over the four one-sided tests) must stay below the claimed ε, and
a mutant with half the node noise must be flagged (bound above the claim).
"""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.mechanisms import BinaryTreeSum, HybridTreeSum
from beam_dp.mechanisms.base import NodeNoise
from beam_dp.testing.audit import epsilon_lower_bound

pytestmark = pytest.mark.slow

RUNS = 20_000
EPSILON = 1.0
R = 0.5


def _releases(mech, changed_step: int, neighbour: bool, steps: int) -> np.ndarray:
    """``(RUNS, steps)``: the releases of RUNS independent runs (dim 1)."""
    noise = NoiseSource(bytes([1 + neighbour]) * 32)
    group, columns = mech.init_group([f"run-{i}" for i in range(RUNS)]), []
    for t in range(1, steps + 1):
        value = R if (neighbour and t == changed_step) else -R
        group, batch = mech.step_group(group, np.full((RUNS, 1), value), np.ones(RUNS, dtype=np.int64), noise)
        columns.append(batch.values[:, 0])
    return np.stack(columns, axis=1)


def _laplace_llr(node_values: np.ndarray, means_d: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """log p_D'(x) − log p_D(x) per run (rows) for independent Laplace nodes; D' shifts each mean by Δ₂ = 2R."""
    x = node_values - means_d
    return np.sum((np.abs(x) - np.abs(x - 2 * R)) / scales, axis=-1)


def _audit(statistic) -> float:
    return epsilon_lower_bound(statistic(False), statistic(True)).epsilon


def _binary_tree(noise_factor: float) -> BinaryTreeSum:
    mech = BinaryTreeSum(dim=1, epsilon=EPSILON, clip_bound=R, horizon=8)
    mech.node_noise = NodeNoise("gamma", mech.node_noise.scale * noise_factor, "exact")
    return mech


def _binary_statistic(mech: BinaryTreeSum, scale: float):
    # Step 1 lies in N(0,1), N(1,1), N(2,1), N(3,1), released alone as s_1, s_2, s_4, s_8.
    means = -R * np.array([1.0, 2.0, 4.0, 8.0])

    def statistic(neighbour: bool) -> np.ndarray:
        s = _releases(mech, 1, neighbour, 8)
        return _laplace_llr(s[:, [0, 1, 3, 7]], means, np.full(4, scale))

    return statistic


def _hybrid_tree(noise_factor: float) -> HybridTreeSum:
    mech = HybridTreeSum(dim=1, epsilon=EPSILON, clip_bound=R)
    mech.log_noise = NodeNoise("gamma", mech.log_noise.scale * noise_factor, "exact")
    mech._block_noise = {1: NodeNoise("gamma", mech.block_noise(1).scale * noise_factor, "exact")}
    return mech


def _hybrid_statistic(mech: HybridTreeSum, log_scale: float, tree_scale: float):
    # Step 3 lies in the log increment (2, 4] (noise η_2: s_4 − s_2) and in B_1's leaf (s_3 − s_2).
    def statistic(neighbour: bool) -> np.ndarray:
        s = _releases(mech, 3, neighbour, 4)
        nodes = np.stack([s[:, 3] - s[:, 1], s[:, 2] - s[:, 1]], axis=1)
        return _laplace_llr(nodes, -R * np.array([2.0, 1.0]), np.array([log_scale, tree_scale]))

    return statistic


def test_binary_tree_audit_stays_below_claim_and_flags_half_noise():
    honest = _binary_tree(1.0)
    scale = honest.node_noise.scale
    assert _audit(_binary_statistic(honest, scale)) <= EPSILON
    assert _audit(_binary_statistic(_binary_tree(0.5), scale)) > EPSILON


def test_hybrid_tree_audit_stays_below_claim_and_flags_half_noise():
    honest = _hybrid_tree(1.0)
    scales = honest.log_noise.scale, honest.block_noise(1).scale
    assert _audit(_hybrid_statistic(honest, *scales)) <= EPSILON
    assert _audit(_hybrid_statistic(_hybrid_tree(0.5), *scales)) > EPSILON
