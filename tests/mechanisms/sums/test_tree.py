"""Tests of the binary tree, hybrid and doubling mechanisms (Chan, Shi & Song, "Private and Continual Release of Statistics").

Numbers in comments like "§8.7" refer to the spec's list of checks. Statistical tests use fixed keys,
so they are deterministic; their tolerances come from the sampling distribution of the statistic
(standard errors of the mean, chi-square or KS quantiles), and each calibration check is paired with a
negative control (a mis-calibrated mechanism or a wrong expected value) that must FAIL it.

Many independent runs are simulated at once: a mechanism of dimension ``runs·d`` fed a
``BatchedNoise`` source behaves as ``runs`` independent ``d``-dimensional mechanisms (each node key's
K-norm draw is ``runs`` independent ``d``-dimensional K-norm vectors from that node's own generator;
Gaussian noise is i.i.d. per coordinate already), because the trees apply the same node structure to
every coordinate and their noise scales do not depend on ``d``.
"""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from scipy import stats

from beam_dp.core.calibration import analytic_gaussian_delta, certify_gaussian
from beam_dp.core.guarantee import ElementLoss, Guarantee, PrivacyLedger
from beam_dp.core.noise import NoiseSource, k_norm
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism, NodeNoise
from beam_dp.mechanisms.sums.tree import (
    BinaryTreeState,
    BinaryTreeSum,
    DoublingTreeState,
    DoublingTreeSum,
    HybridTreeState,
    HybridTreeSum,
    make_tree_sum,
)
from beam_dp.testing import ZeroNoise
from beam_dp.testing.stats import covariance_matches, gaussian_variance_matches, mean_matches

KEY = b"k" * 32
KINDS = ["plain", "hybrid", "doubling"]
LAWS = ["gamma", "gaussian"]
DELTA = 1e-5


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def make(kind: str, law: str = "gamma", **kw) -> ContinualSumMechanism:
    args: dict = dict(dim=3, epsilon=1.0, clip_bound=1.0)
    if law == "gaussian":
        args.update(noise="gaussian", delta=DELTA)
    args.update(kw)
    if "sensitivity" in kw:
        del args["clip_bound"]
    if kind == "plain":
        args.setdefault("horizon", 1024)
        return BinaryTreeSum(**args)
    args.pop("horizon", None)
    return HybridTreeSum(**args) if kind == "hybrid" else DoublingTreeSum(**args)


def run(mech, blocks, noise, stream="s", state=None):
    state = mech.init_state(stream) if state is None else state
    releases = []
    for block in blocks:
        state, out = mech.step(state, block, noise)
        assert len(out) == 1
        releases.extend(out)
    return state, releases


def popcount(n: int) -> int:
    return bin(n).count("1")


def flog(n: int) -> int:
    return n.bit_length() - 1


def state_vectors(state) -> int:
    """Number of d-vectors held by a state (all array fields)."""
    total = 0
    for value in vars(state).values():
        if isinstance(value, np.ndarray):
            total += value.size
    return total


class BatchedNoise(NoiseSource):
    """TEST ONLY: makes a mechanism of dim ``runs·d`` behave as ``runs`` independent d-dim runs."""

    def __init__(self, key: bytes, d: int):
        super().__init__(key)
        self.d = d

    def k_norm(self, stream, purpose, index, scale, dim):
        assert dim % self.d == 0
        return k_norm(self.generator(stream, purpose, *index), scale, self.d, n=dim // self.d).ravel()


class RecordingNoise(NoiseSource):
    """TEST ONLY: the real noise, plus a log of every node draw."""

    def __init__(self, key: bytes):
        super().__init__(key)
        self.calls: list[tuple] = []

    def k_norm(self, stream, purpose, index, scale, dim):
        self.calls.append((stream, purpose, tuple(index), "gamma", scale))
        return super().k_norm(stream, purpose, index, scale, dim)

    def gaussian(self, stream, purpose, index, sigma, size):
        self.calls.append((stream, purpose, tuple(index), "gaussian", sigma))
        return super().gaussian(stream, purpose, index, sigma, size)


def batched_errors(mech, d: int, runs: int, steps: int, key: bytes = KEY, seed: int = 0) -> np.ndarray:
    """Errors ``s_t − S_t`` of ``runs`` independent d-dim runs: array ``(steps, runs, d)``."""
    assert mech.dim == d * runs
    noise = BatchedNoise(key, d) if mech.noise_law == "gamma" else NoiseSource(key)
    rng = np.random.default_rng(seed)
    state = mech.init_state("stat")
    exact = np.zeros(mech.dim)
    errors = np.empty((steps, runs, d))
    for t in range(steps):
        v = rng.normal(size=mech.dim)  # arbitrary data: the error must not depend on it
        exact = exact + v
        count = int(np.ceil(np.linalg.norm(v) / mech.clip_bound))  # a sum of `count` clipped contributions
        state, (release,) = mech.step(state, ClippedSum(v, count, 0), noise)
        errors[t] = (release.value - exact).reshape(runs, d)
    return errors


def second_moment_ok(errors: np.ndarray, expected: np.ndarray) -> bool:
    """Mean of ``‖e_t‖²`` over runs within ±4 SE (SE = sample std / √runs) of ``expected[t]``, all t."""
    sq = (errors**2).sum(axis=2)  # (steps, runs)
    return mean_matches(sq.T, expected, n_se=4.0)


# ---------------------------------------------------------------------------------------------
# §8.1, §8.2: node bookkeeping of the plain tree
# ---------------------------------------------------------------------------------------------
def test_plain_node_membership_T8():
    mech = make("plain", horizon=8)
    assert mech.levels == 4 and mech.height == 3
    expected = {
        1: [(0, 1), (1, 1), (2, 1), (3, 1)],
        2: [(0, 2), (1, 1), (2, 1), (3, 1)],
        3: [(0, 3), (1, 2), (2, 1), (3, 1)],
        4: [(0, 4), (1, 2), (2, 1), (3, 1)],
        5: [(0, 5), (1, 3), (2, 2), (3, 1)],
        6: [(0, 6), (1, 3), (2, 2), (3, 1)],
        7: [(0, 7), (1, 4), (2, 2), (3, 1)],
        8: [(0, 8), (1, 4), (2, 2), (3, 1)],
    }
    for t, nodes in expected.items():
        assert mech.nodes_containing(t) == nodes
    # §2.2 example: t = 7 = 4 + 2 + 1
    assert mech.nodes_used(7) == [(2, 1), (1, 3), (0, 7)]
    assert [mech.node_steps(n) for n in mech.nodes_used(7)] == [(1, 4), (5, 6), (7, 7)]
    # §2.5 shared-node matrix (the covariance oracle) from nodes_used
    oracle = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [0, 1, 1, 0, 0, 0, 0, 0],
            [0, 1, 2, 0, 0, 0, 0, 0],
            [0, 0, 0, 1, 1, 1, 1, 0],
            [0, 0, 0, 1, 2, 1, 1, 0],
            [0, 0, 0, 1, 1, 2, 2, 0],
            [0, 0, 0, 1, 1, 2, 3, 0],
            [0, 0, 0, 0, 0, 0, 0, 1],
        ]
    )
    shared = np.array([[len(set(mech.nodes_used(t)) & set(mech.nodes_used(u))) for u in range(1, 9)] for t in range(1, 9)])
    np.testing.assert_array_equal(shared, oracle)


@pytest.mark.parametrize("horizon", [1, 2, 3, 5, 7, 8, 100, 129])
def test_plain_nodes_containing_matches_brute_force(horizon):
    mech = make("plain", horizon=horizon)
    assert mech.levels == math.floor(math.log2(horizon)) + 1
    every_node = [
        (level, k) for level in range(mech.levels) for k in range(1, horizon // 2**level + 1)
    ]
    for t in range(1, horizon + 1):
        brute = sorted(n for n in every_node if mech.node_steps(n)[0] <= t <= mech.node_steps(n)[1])
        assert sorted(mech.nodes_containing(t)) == brute
        assert len(brute) <= mech.levels


def test_plain_every_step_in_L_nodes_for_power_of_two_horizon():
    mech = make("plain", horizon=4096)
    assert mech.levels == 13
    for t in range(1, 4097):
        nodes = mech.nodes_containing(t)
        assert len(nodes) == 13
        assert all(mech.node_steps(n)[0] <= t <= mech.node_steps(n)[1] for n in nodes)


def _check_decomposition(mech, t):
    """nodes_used(t) is a disjoint cover of [1..t] by nodes each noised at its last step <= t."""
    nodes = mech.nodes_used(t)
    spans = sorted(mech.node_steps(n) for n in nodes)
    assert spans[0][0] == 1 and spans[-1][1] == t
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    for n in nodes:
        last = mech.node_steps(n)[1]
        assert mech.nodes_noised_at(last) == [n]
    return nodes


def test_plain_prefix_decomposition():  # §8.2
    mech = make("plain", horizon=4096)
    counts = []
    for t in range(1, 4097):
        nodes = _check_decomposition(mech, t)
        assert len(nodes) == popcount(t)
        counts.append(len(nodes))
        # a used node N(ℓ, k) has an odd index: exactly the nodes TREEMECH noises
        assert all(k % 2 == 1 for _, k in nodes)
    assert max(counts) == 12 <= mech.levels  # 4095 = 2^12 − 1


def test_hybrid_and_doubling_decomposition():  # §3.1, §3.2 structure
    hybrid, doubling = make("hybrid"), make("doubling")
    for t in range(1, 4097):
        k = flog(t)
        nodes = _check_decomposition(hybrid, t)
        logs = [n for n in nodes if n[0] == "L"]
        assert logs == [("L", j) for j in range(k + 1)]
        assert len(nodes) - len(logs) == (0 if t == 2**k else popcount(t - 2**k))
        assert all(n[1] == k for n in nodes if n[0] == "B")
        nodes = _check_decomposition(doubling, t)
        u = t - 2**k + 1
        assert nodes[:k] == [(j, j, 1) for j in range(k)]  # the carried roots
        assert len(nodes) == k + popcount(u)


# ---------------------------------------------------------------------------------------------
# §8.3 exactness without noise; error = sum of the keyed node noises
# ---------------------------------------------------------------------------------------------
def _random_blocks(rng, steps, d):
    blocks = []
    for t in range(steps):
        kind = t % 4
        if kind == 0:
            blocks.append(None)  # empty step
        elif kind == 1:
            blocks.append(rng.normal(size=(rng.integers(0, 4), d)))  # raw contributions, maybe none
        elif kind == 2:
            blocks.append(rng.normal(size=d))
        else:
            blocks.append(ClippedSum(rng.normal(size=d) * 5, 100, 0))  # a pre-aggregated sum of 100 contributions
    return blocks


def _exact_sums(blocks, d):
    total, out = np.zeros(d), []
    for b in blocks:
        if b is None:
            v = np.zeros(d)
        elif isinstance(b, ClippedSum):
            v = b.vector
        else:
            v = np.atleast_2d(b).sum(axis=0) if np.size(b) else np.zeros(d)
        total = total + v
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_exact_without_noise(kind, law):  # §8.3
    d, steps = 4, 300  # passes 2^k − 1, 2^k, 2^k + 1 for k <= 8
    mech = make(kind, law, dim=d, clip_bound=100.0, horizon=300)  # no contribution gets clipped
    blocks = _random_blocks(np.random.default_rng(1), steps, d)
    _, releases = run(mech, blocks, ZeroNoise())
    got = np.array([r.value for r in releases])
    exact = _exact_sums(blocks, d)
    scale = max(1.0, np.abs(exact).max())
    np.testing.assert_allclose(got, exact, rtol=1e-9, atol=1e-9 * scale)
    assert [r.step for r in releases] == list(range(1, steps + 1))


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_error_is_sum_of_keyed_node_noises(kind, law):
    """e_t equals the sum of the noises of nodes_used(t), each recomputed from its key (§1.3, §2.2)."""
    d, steps = 3, 70
    mech = make(kind, law, dim=d, clip_bound=100.0, horizon=100)
    noise = NoiseSource(KEY)
    blocks = _random_blocks(np.random.default_rng(2), steps, d)
    _, releases = run(mech, blocks, noise, stream="abc")
    exact = _exact_sums(blocks, d)
    for t, release in enumerate(releases, start=1):
        expected = np.zeros(d)
        for node in mech.nodes_used(t):
            purpose, index = mech.node_key(node)
            expected = expected + mech.node_law(node).draw(noise, "abc", purpose, index, d)
        np.testing.assert_allclose(release.value - exact[t - 1], expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("law", LAWS)
def test_hybrid_milestone_is_sum_plus_log_noises(law):  # §8.12, first half
    d = 3
    mech = make("hybrid", law, dim=d, clip_bound=100.0)
    noise = NoiseSource(KEY)
    rng = np.random.default_rng(3)
    blocks = [rng.normal(size=d) for _ in range(128)]
    _, releases = run(mech, blocks, noise)
    exact = _exact_sums(blocks, d)
    for k in range(8):
        t = 2**k
        assert mech.nodes_used(t) == [("L", j) for j in range(k + 1)]
        etas = [mech.log_noise.draw(noise, "s", "hybrid-L", (0, 0, j), d) for j in range(k + 1)]
        np.testing.assert_allclose(releases[t - 1].value - exact[t - 1], np.sum(etas, axis=0), rtol=1e-9, atol=1e-9)
        assert releases[t - 1].meta["noisy_nodes"] == k + 1


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_node_drawn_once_and_charged(kind, law):
    """Every noise draw is a node of charges_at(t) at the step it completes; no key is drawn twice;
    every node a release uses was drawn no later than that release."""
    mech = make(kind, law, horizon=300)
    noise = RecordingNoise(KEY)
    state = mech.init_state("s")
    seen: set = set()
    drawn_by: dict = {}
    for t in range(1, 301):
        before = len(noise.calls)
        state, _ = mech.step(state, np.ones(3), noise)
        calls = noise.calls[before:]
        nodes = mech.nodes_noised_at(t)
        assert len(calls) == len(nodes) == 1
        charges = mech.charges_at(t)
        for call, node, charge in zip(calls, nodes, charges):
            purpose, index = mech.node_key(node)
            law_ = mech.node_law(node)
            assert call == ("s", purpose, index, law_.law, law_.scale)
            assert (charge.first, charge.last) == mech.node_steps(node) and charge.last == t
            assert charge.label == f"{purpose}{index}"
            key = (purpose, index)
            assert key not in seen
            seen.add(key)
            drawn_by[node] = t
        assert all(drawn_by[n] <= t for n in mech.nodes_used(t))


def test_purposes_separate_noise():
    """Two trees on one stream and key with different purposes (e.g. PRIVINCREG's q and Q) never share noise."""
    noise = NoiseSource(KEY)
    for kind, default in (("plain", "tree"), ("hybrid", "hybrid-L"), ("doubling", "doubling-0")):
        assert make(kind).node_key(make(kind).nodes_noised_at(1)[0])[0] == default
        a, b = make(kind, purpose="tree-q"), make(kind, purpose="tree-Q")
        _, ra = run(a, [None] * 5, noise)
        _, rb = run(b, [None] * 5, noise)
        assert all(np.all(x.value != y.value) for x, y in zip(ra, rb))
    with pytest.raises(ValueError):
        make("plain", purpose="")


# ---------------------------------------------------------------------------------------------
# scales, §8.5 and §8.6 calibration
# ---------------------------------------------------------------------------------------------
def test_gamma_scales():
    eps, R = 0.7, 1.5
    delta2 = 2 * R
    plain = make("plain", epsilon=eps, clip_bound=R, horizon=100)  # L_T = 7
    assert plain.levels == 7
    assert plain.node_noise == NodeNoise("gamma", delta2 * 7 / eps, "exact")
    assert make("plain", epsilon=eps, sensitivity=delta2, horizon=100).node_noise.scale == pytest.approx(delta2 * 7 / eps, rel=1e-12)
    hybrid = make("hybrid", epsilon=eps, clip_bound=R)
    assert hybrid.log_noise.scale == pytest.approx(delta2 / (eps / 2), rel=1e-12)
    doubling = make("doubling", epsilon=eps, clip_bound=R)
    for k in range(1, 30):
        assert hybrid.block_noise(k).scale == pytest.approx(k * delta2 / (eps / 2), rel=1e-12)
        assert doubling.block_noise(k).scale == pytest.approx((k + 1) * delta2 / eps, rel=1e-12)
    assert doubling.block_noise(0).scale == pytest.approx(delta2 / eps, rel=1e-12)


def test_gaussian_scales_follow_sigma_tree_004():
    eps, R = 0.9, 0.5
    delta2 = 2 * R

    def formula(e, dl, levels):
        return math.sqrt(2 * levels**2 * delta2**2 * math.log(2 / dl) / e**2)

    plain = make("plain", "gaussian", epsilon=eps, clip_bound=R, horizon=1000)  # L_T = 10
    assert plain.node_noise.scale == pytest.approx(formula(eps, DELTA, 10), rel=1e-12)
    assert plain.node_noise.calibration == "paper"
    hybrid = make("hybrid", "gaussian", epsilon=eps, clip_bound=R)
    assert hybrid.log_noise.scale == pytest.approx(formula(eps / 2, DELTA / 2, 1), rel=1e-12)
    doubling = make("doubling", "gaussian", epsilon=eps, clip_bound=R)
    for k in range(1, 20):
        assert hybrid.block_noise(k).scale == pytest.approx(formula(eps / 2, DELTA / 2, k), rel=1e-12)
        assert doubling.block_noise(k).scale == pytest.approx(formula(eps, DELTA, k + 1), rel=1e-12)


@pytest.mark.parametrize("calibration", ["paper", "analytic"])
@pytest.mark.parametrize("kind", KINDS)
def test_gaussian_node_variance(kind, calibration):  # §8.5 via the tree's sigma
    """The release at t = 1 is one node (plain N(0,1), hybrid η_0, doubling root of block 0): its
    per-coordinate sample variance lies in the 99.9% chi-square interval around σ² (20,000 coords);
    a σ off by 10% (half-width of the interval ≈ 3.3%) fails it."""
    dim = 20_000
    mech = make(kind, "gaussian", dim=dim, calibration=calibration, horizon=8)
    _, (release,) = run(mech, [None], NoiseSource(KEY))
    sigma = mech.node_law(mech.nodes_used(1)[0]).scale
    assert release.meta["log_scale" if kind == "hybrid" else "scale"] == sigma
    assert gaussian_variance_matches(release.value, sigma**2)
    assert not gaussian_variance_matches(release.value, (1.1 * sigma) ** 2)
    assert not gaussian_variance_matches(release.value, (sigma / 1.1) ** 2)
    if calibration == "analytic":
        paper = make(kind, "gaussian", dim=1, horizon=8).node_law(mech.nodes_used(1)[0]).scale
        assert sigma < paper


@pytest.mark.parametrize("kind", KINDS)
def test_gamma_node_radius(kind):
    """The release at t = 1 is one K-norm node: its norm is Gamma(d, c) (KS p > 1e-3 over 20,000
    runs); with c off by 10% the KS test rejects."""
    d, runs = 3, 20_000
    mech = make(kind, dim=d * runs, horizon=8)
    _, (release,) = run(mech, [None], BatchedNoise(KEY, d))
    norms = np.linalg.norm(release.value.reshape(runs, d), axis=1)
    c = mech.node_law(mech.nodes_used(1)[0]).scale
    assert stats.kstest(norms, stats.gamma(a=d, scale=c).cdf).pvalue > 1e-3
    assert stats.kstest(norms, stats.gamma(a=d, scale=1.1 * c).cdf).pvalue < 1e-3


def test_validity_check():  # §8.6
    # sigma_tree_004 with eps = 20, L = 1, delta = 1e-5 fails the analytic check: refused
    with pytest.raises(ValueError, match="analytic"):
        make("plain", "gaussian", epsilon=20.0, horizon=1)
    with pytest.raises(ValueError):
        make("doubling", "gaussian", epsilon=20.0)  # block 0 has L = 1 at the full (eps, delta)
    with pytest.raises(ValueError):
        make("hybrid", "gaussian", epsilon=40.0, delta=2e-5)  # its halves are (20, 1e-5), L = 1
    mech = make("plain", "gaussian", epsilon=20.0, horizon=1, calibration="analytic")
    sigma = mech.node_noise.scale
    achieved = analytic_gaussian_delta(20.0, mech.sensitivity / sigma)
    assert 0.99 * DELTA < achieved <= DELTA
    assert mech.node_noise.calibration == "analytic"
    hybrid = make("hybrid", "gaussian", epsilon=40.0, delta=2e-5, calibration="analytic")
    for k in (1, 2, 7, 30):
        sens = hybrid.sensitivity * math.sqrt(k)
        achieved = analytic_gaussian_delta(20.0, sens / hybrid.block_noise(k).scale)
        assert 0.99 * 1e-5 < achieved <= 1e-5
    doubling = make("doubling", "gaussian", epsilon=20.0, calibration="analytic")
    assert analytic_gaussian_delta(20.0, doubling.sensitivity / doubling.block_noise(0).scale) <= DELTA


@pytest.mark.parametrize("calibration", ["paper", "analytic"])
def test_unbounded_gaussian_certified_for_every_block(calibration):
    """B_k / block k are certified lazily; the k = 1 (hybrid) / k = 0 (doubling) certificate covers all
    k because the joint mu never grows with k."""
    hybrid = make("hybrid", "gaussian", epsilon=3.0, calibration=calibration)
    doubling = make("doubling", "gaussian", epsilon=3.0, calibration=calibration)
    mus_h, mus_d = [], []
    for k in range(1, 63):
        sigma = hybrid.block_noise(k).scale
        certify_gaussian(sigma, hybrid.sensitivity, k, 1.5, DELTA / 2)
        mus_h.append(hybrid.sensitivity * math.sqrt(k) / sigma)
        sigma = doubling.block_noise(k).scale
        certify_gaussian(sigma, doubling.sensitivity, k + 1, 3.0, DELTA)
        mus_d.append(doubling.sensitivity * math.sqrt(k + 1) / sigma)
    assert all(b <= a * (1 + 1e-9) for a, b in zip(mus_h, mus_h[1:]))
    assert all(b <= a * (1 + 1e-9) for a, b in zip(mus_d, mus_d[1:]))


# ---------------------------------------------------------------------------------------------
# §8.7, §8.8, §8.12 second moments and covariance
# ---------------------------------------------------------------------------------------------
D, RUNS, STEPS = 5, 4000, 40


@pytest.mark.parametrize("law", LAWS)
def test_plain_second_moment(law):  # §8.7 for the plain tree
    """Mean ‖e_t‖² over 4,000 runs within 4 SE of popcount(t)·d(d+1)c² (Gamma) / popcount(t)·d·σ²
    (Gaussian) for all t <= 40; a mechanism whose scale is 10% too large fails (≈ +21% in the second
    moment vs a relative SE of at most ≈ 1.5%)."""
    mech = make("plain", law, dim=D * RUNS, horizon=STEPS)
    node_var = (D + 1) * mech.node_noise.scale**2 if law == "gamma" else mech.node_noise.scale**2
    expected = np.array([popcount(t) * D * node_var for t in range(1, STEPS + 1)])
    # noise_var(t) is the per-coordinate variance (here dim = runs·d, so use the formula directly)
    assert mech.noise_var(3) == pytest.approx(2 * ((mech.dim + 1) * mech.node_noise.scale**2 if law == "gamma" else mech.node_noise.scale**2))
    assert second_moment_ok(batched_errors(mech, D, RUNS, STEPS), expected)
    off = make("plain", law, dim=D * RUNS, horizon=STEPS, epsilon=1 / 1.1)  # scale × 1.1
    assert off.node_noise.scale == pytest.approx(1.1 * mech.node_noise.scale)
    assert not second_moment_ok(batched_errors(off, D, RUNS, STEPS), expected)


def test_plain_covariance_T8():  # §8.8, plain T = 8
    """d = 1 Gaussian, 20,000 runs: Cov(e_t, e_u) = σ²·|nodes(t) ∩ nodes(u)| (the §2.5 matrix) within
    5 SE per entry. Controls: σ off by 10%, and independent errors (diagonal only), both fail."""
    runs = 20_000
    mech = make("plain", "gaussian", dim=runs, horizon=8)
    errors = batched_errors(mech, 1, runs, 8)[:, :, 0].T  # (runs, 8)
    shared = np.array([[len(set(mech.nodes_used(t)) & set(mech.nodes_used(u))) for u in range(1, 9)] for t in range(1, 9)])
    var = mech.node_noise.scale**2
    assert covariance_matches(errors, var * shared)
    assert not covariance_matches(errors, 1.21 * var * shared)
    assert not covariance_matches(errors, var * np.diag(np.diag(shared)))


def _hybrid_expected(mech, law, steps, d, ignore_k=False):
    out = []
    for t in range(1, steps + 1):
        k = flog(t)
        v_log = (d + 1) * mech.log_noise.scale**2 if law == "gamma" else mech.log_noise.scale**2
        total = (k + 1) * v_log
        if t != 2**k:
            scale = mech.block_noise(k).scale / (k if ignore_k else 1)
            total += popcount(t - 2**k) * ((d + 1) * scale**2 if law == "gamma" else scale**2)
        out.append(d * total)
    return np.array(out)


@pytest.mark.parametrize("law", LAWS)
def test_hybrid_second_moment(law):  # §8.12: §3.1 formula, checked as in §8.7
    """E‖e_t‖² = d(d+1)[(k+1)(Δ₂/ε_L)² + popcount(t−2^k)(kΔ₂/ε_B)²] (Gamma; d[(k+1)σ_L² + popcount·σ_k²]
    Gaussian) for t <= 40. Controls: every scale 10% too large fails; the B_k scale without its factor k
    (expected value off by k² for k >= 2) fails."""
    mech = make("hybrid", law, dim=D * RUNS)
    errors = batched_errors(mech, D, RUNS, STEPS)
    expected = _hybrid_expected(mech, law, STEPS, D)
    if law == "gamma":
        delta2, eps = mech.sensitivity, mech.epsilon
        t = 13  # k = 3, u = 5
        assert expected[t - 1] == pytest.approx(D * (D + 1) * (4 * (delta2 / (eps / 2)) ** 2 + 2 * (3 * delta2 / (eps / 2)) ** 2))
    assert second_moment_ok(errors, expected)
    assert not second_moment_ok(errors, _hybrid_expected(mech, law, STEPS, D, ignore_k=True))
    off = make("hybrid", law, dim=D * RUNS, epsilon=1 / 1.1)
    assert not second_moment_ok(batched_errors(off, D, RUNS, STEPS), expected)


def _doubling_expected(mech, law, steps, d):
    def v(k):
        c = mech.block_noise(k).scale
        return (d + 1) * c**2 if law == "gamma" else c**2

    out = []
    for t in range(1, steps + 1):
        k = flog(t)
        u = t - 2**k + 1
        out.append(d * (sum(v(j) for j in range(k)) + popcount(u) * v(k)))
    return np.array(out)


@pytest.mark.parametrize("law", LAWS)
def test_doubling_second_moment(law):  # §8.12: §3.2 formula
    mech = make("doubling", law, dim=D * RUNS)
    errors = batched_errors(mech, D, RUNS, STEPS)
    expected = _doubling_expected(mech, law, STEPS, D)
    assert second_moment_ok(errors, expected)
    off = make("doubling", law, dim=D * RUNS, epsilon=1 / 1.1)
    assert not second_moment_ok(batched_errors(off, D, RUNS, STEPS), expected)


@pytest.mark.parametrize("law", LAWS)
def test_noise_var_formulas(law):  # §6
    d = 4
    plain, hybrid, doubling = (make(k, law, dim=d, horizon=500) for k in KINDS)

    def v(node):
        return (d + 1) * node.scale**2 if law == "gamma" else node.scale**2

    np.testing.assert_allclose(hybrid.noise_var(1), v(hybrid.log_noise), rtol=1e-12)
    for t in range(1, 501):
        assert plain.noise_var(t) == pytest.approx(popcount(t) * v(plain.node_noise), rel=1e-12)
        assert hybrid.noise_var(t) == pytest.approx(_hybrid_expected(hybrid, law, t, d)[-1] / d, rel=1e-12)
        assert doubling.noise_var(t) == pytest.approx(_doubling_expected(doubling, law, t, d)[-1] / d, rel=1e-12)
        for mech in (plain, hybrid, doubling):
            assert mech.noise_var(t) == pytest.approx(sum(v(mech.node_law(n)) for n in mech.nodes_used(t)), rel=1e-12)
    with pytest.raises(ValueError):
        plain.noise_var(501)
    with pytest.raises(ValueError):
        hybrid.noise_var(0)


# ---------------------------------------------------------------------------------------------
# §8.9 ledger, §2.6 / epsilon_spent, §8.11 memory
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_privacy_ledger(kind, law):
    """First 5,000 steps (plain: T = 8192): the charges of the nodes that get noise, summed per step,
    stay within (ε, δ) (Gamma: Σ Δ₂/c <= ε(1 + 1e-12); Gaussian: joint mu² passes the analytic check).
    The release's epsilon_spent at every t equals the ledger's worst element so far, never exceeds ε,
    and never decreases. Hybrid Gamma reaches exactly ε."""
    n, eps = 5000, 1.0
    mech = make(kind, law, dim=1, horizon=8192, epsilon=eps)
    pure, mu2 = np.zeros(n), np.zeros(n)
    ledger = PrivacyLedger(mech.guarantee)
    spend_cache: dict = {}
    state = mech.init_state("s")
    zero = ZeroNoise()
    last_eps = 0.0
    for t in range(1, n + 1):
        charges = mech.charges_at(t)
        ledger.record(charges)
        for c in charges:
            pure[c.first - 1 : c.last] += c.loss.pure_epsilon
            mu2[c.first - 1 : c.last] += c.loss.gaussian_mu_sq
        state, (release,) = mech.step(state, None, zero)
        if law == "gamma":
            worst = pure[:t].max()
            assert release.epsilon_spent == pytest.approx(worst, rel=1e-12)
            assert release.delta_spent == 0.0
        else:
            key = mu2[:t].max()
            if key not in spend_cache:
                spend_cache[key] = ElementLoss(gaussian_mu_sq=float(key)).epsilon_at(DELTA)
            assert release.epsilon_spent == pytest.approx(spend_cache[key], rel=1e-9)
            assert release.delta_spent == DELTA
        assert release.epsilon_spent <= eps  # exactly, no tolerance
        assert release.epsilon_spent >= last_eps
        last_eps = release.epsilon_spent
    if law == "gamma":
        assert pure.max() <= eps * (1 + 1e-12)
        assert ledger.worst(n)[0] == pytest.approx(pure.max(), rel=1e-12)
        if kind == "hybrid":
            assert pure.max() == pytest.approx(eps, rel=1e-12)  # reached (e.g. step 3 once t >= 4)
        if kind == "plain":
            assert pure.max() == pytest.approx(eps * 13 / 14, rel=1e-12)  # m_5000 = 13 of L_T = 14
            assert release.epsilon_spent == eps * 13 / 14
    else:
        worst_eps = ElementLoss(gaussian_mu_sq=float(mu2.max())).epsilon_at(DELTA)
        assert worst_eps <= eps * (1 + 1e-12)
        assert ledger.worst(n)[0] == pytest.approx(worst_eps, rel=1e-9)
        if kind == "plain":  # the joint check of §1.2 with the actual node count
            count = round(mu2.max() / (mech.sensitivity / mech.node_noise.scale) ** 2)
            assert count == 13
            certify_gaussian(mech.node_noise.scale, mech.sensitivity, count, eps, DELTA)
    ledger.check(n)


def test_plain_epsilon_spent_formula():  # §2.6
    mech = make("plain", horizon=100)  # L_T = 7
    _, releases = run(mech, [None] * 100, ZeroNoise())
    for t, r in enumerate(releases, start=1):
        assert r.epsilon_spent == pytest.approx(mech.epsilon * (flog(t) + 1) / 7, rel=1e-15)


@pytest.mark.parametrize("kind", ["hybrid", "doubling"])
def test_element_loss_matches_ledger(kind):
    """element_loss(s, t) (used for epsilon_spent) agrees with the charges for every s <= t <= 300."""
    for law in LAWS:
        mech = make(kind, law)
        pure, mu2 = np.zeros(300), np.zeros(300)
        for t in range(1, 301):
            for c in mech.charges_at(t):
                pure[c.first - 1 : c.last] += c.loss.pure_epsilon
                mu2[c.first - 1 : c.last] += c.loss.gaussian_mu_sq
            if t % 7 and t not in (63, 64, 65, 127, 128, 129, 255, 256, 257, 300):
                continue
            for s in range(1, t + 1):
                loss = mech.element_loss(s, t)
                assert loss.pure_epsilon == pytest.approx(pure[s - 1], rel=1e-12, abs=1e-15)
                assert loss.gaussian_mu_sq == pytest.approx(mu2[s - 1], rel=1e-12, abs=1e-15)


def _memory_check(kind, steps):
    mech = make(kind, dim=2, horizon=steps)
    state = mech.init_state("s")
    zero, vec = ZeroNoise(), np.zeros(2)
    for t in range(1, steps + 1):
        state, _, _, _ = mech._advance(state, vec, zero)
        vectors = state_vectors(state) // 2
        if kind == "plain":
            assert vectors == 2 * (flog(steps) + 1)  # §8.11: never more than 2(⌊log T⌋ + 1)
        elif kind == "hybrid":
            assert vectors == 2 + 2 * flog(t)  # beta, Lout, and B_k's arrays
        else:
            assert vectors == 1 + 2 * (flog(t + 1) + 1)  # carry and the next step's block arrays


@pytest.mark.parametrize("kind", KINDS)
def test_memory_bound(kind):  # §8.11 (fast version)
    _memory_check(kind, 4100)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_memory_bound_long(kind):  # §8.11 over 10^5 steps
    _memory_check(kind, 100_000)


# ---------------------------------------------------------------------------------------------
# §8.15 determinism and restore, §8.16 clipping, state types
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_determinism_and_restore(kind, law):
    mech = make(kind, law, horizon=100)
    rng = np.random.default_rng(5)
    blocks = [rng.normal(size=(2, 3)) for _ in range(40)]
    final, releases = run(mech, blocks, NoiseSource(KEY))
    _, again = run(mech, blocks, NoiseSource(KEY))
    assert releases == again  # byte-identical values, same meta and spend
    # snapshot mid-stream (just before and after a power of two), restore, continue
    for cut in (15, 16, 17):
        state, first = run(mech, blocks[:cut], NoiseSource(KEY))
        data = mech.encode_state(state)
        assert data == encode_state(state)
        restored = mech.decode_state(data)
        assert type(restored) is mech.state_type and restored.t == cut and restored.stream == "s"
        _, rest = run(mech, blocks[cut:], NoiseSource(KEY), state=restored)
        assert first + rest == releases
    assert mech.encode_state(final) == mech.encode_state(mech.decode_state(mech.encode_state(final)))
    # another key or another stream: different noise at every step
    _, other = run(mech, blocks, NoiseSource(b"x" * 32))
    assert all(np.all(a.value != b.value) for a, b in zip(releases, other))
    _, other_stream = run(mech, blocks, NoiseSource(KEY), stream="t")
    assert all(np.all(a.value != b.value) for a, b in zip(releases, other_stream))


@pytest.mark.parametrize("kind", KINDS)
def test_clipping_and_neighbours(kind):  # §8.16
    R, d = 0.5, 3
    mech = make(kind, dim=d, clip_bound=R, horizon=64)
    big = np.array([10 * R, 0.0, 0.0])
    _, (release,) = run(mech, [big], ZeroNoise())
    np.testing.assert_allclose(release.value, [R, 0.0, 0.0], rtol=1e-12)
    # neighbouring streams: the contribution 10R·e1 at step 3 is replaced by −10R·e1
    rng = np.random.default_rng(6)
    others = [rng.normal(size=(2, d)) for _ in range(40)]
    blocks_a = [o.copy() for o in others]
    blocks_b = [o.copy() for o in others]
    blocks_a[2] = np.vstack([others[2], big])
    blocks_b[2] = np.vstack([others[2], -big])
    for noise in (ZeroNoise(), NoiseSource(KEY)):
        sa, sb = mech.init_state("s"), mech.init_state("s")
        max_node_diff = 0.0
        for t in range(40):
            sa, (ra,) = mech.step(sa, blocks_a[t], noise)
            sb, (rb,) = mech.step(sb, blocks_b[t], noise)
            assert np.linalg.norm(ra.value - rb.value) <= mech.sensitivity * (1 + 1e-9)
            for name, value in vars(sa).items():
                if isinstance(value, np.ndarray) and value.size:  # node values (clean, noisy), running sums
                    diffs = np.linalg.norm(np.atleast_2d(value - getattr(sb, name)), axis=1)
                    assert np.all(diffs <= mech.sensitivity * (1 + 1e-9))
                    max_node_diff = max(max_node_diff, diffs.max())
        assert max_node_diff == pytest.approx(mech.sensitivity, rel=1e-9)  # Δ₂ = 2R is attained


@pytest.mark.parametrize("kind", KINDS)
def test_state_types_and_guarantee(kind):
    mech = make(kind)
    cls = {"plain": BinaryTreeState, "hybrid": HybridTreeState, "doubling": DoublingTreeState}[kind]
    assert mech.state_type is cls and cls.STATE_VERSION == 1
    state = mech.init_state("s")
    assert isinstance(state, cls) and state.stream == "s" and state.t == 0
    assert mech.guarantee == Guarantee(1.0, 0.0) and mech.guarantee.window is None
    assert make(kind, "gaussian").guarantee == Guarantee(1.0, DELTA)
    other = {"plain": HybridTreeState, "hybrid": DoublingTreeState, "doubling": BinaryTreeState}[kind]
    with pytest.raises(ValueError):
        decode_state(other, mech.encode_state(state))
    # a state of a differently configured mechanism is refused
    with pytest.raises(ValueError):
        mech.step(make(kind, dim=4).init_state("s"), None, ZeroNoise())
    with pytest.raises(TypeError):
        mech.init_state(3)


def test_horizon_refusal_and_validation():
    mech = make("plain", horizon=5)
    state, _ = run(mech, [None] * 5, ZeroNoise())
    with pytest.raises(ValueError, match="horizon"):
        mech.step(state, None, ZeroNoise())
    for bad in (0, -1, 2.5, True, None, "8"):
        with pytest.raises((ValueError, TypeError)):
            make("plain", horizon=bad)
    with pytest.raises(ValueError):
        mech.nodes_used(6)
    with pytest.raises(ValueError):
        mech.nodes_containing(0)
    with pytest.raises(ValueError):
        make("plain", epsilon=0.0)
    with pytest.raises(ValueError):
        make("hybrid", epsilon=-1.0)
    with pytest.raises(ValueError):
        make("doubling", delta=1e-5)  # Gamma noise is pure epsilon-DP
    with pytest.raises(ValueError):
        make("hybrid", "gaussian", delta=0.0)


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_mechanism_pickles(kind, law):
    """Engine adapters ship the mechanism to workers: a pickled copy releases the same bytes."""
    mech = make(kind, law, horizon=64)
    mech.noise_var(20)  # fill the caches first
    copy = pickle.loads(pickle.dumps(mech))
    blocks = [np.ones(3)] * 20
    assert run(mech, blocks, NoiseSource(KEY))[1] == run(copy, blocks, NoiseSource(KEY))[1]


def test_make_tree_sum():
    args = dict(dim=2, epsilon=1.0, clip_bound=1.0)
    plain = make_tree_sum(horizon=16, **args)
    assert isinstance(plain, BinaryTreeSum) and plain.horizon == 16 and plain.name == "binary_tree"
    assert isinstance(make_tree_sum(**args), HybridTreeSum)
    assert make_tree_sum(**args).name == "hybrid_tree"
    doubling = make_tree_sum(unbounded="doubling", **args)
    assert isinstance(doubling, DoublingTreeSum) and doubling.name == "doubling_tree"
    assert isinstance(make_tree_sum(horizon=16, unbounded="doubling", **args), BinaryTreeSum)
    with pytest.raises(ValueError):
        make_tree_sum(unbounded="binary", **args)
    with pytest.raises(ValueError):
        make_tree_sum(horizon=0, **args)
    gaussian = make_tree_sum(noise="gaussian", delta=1e-6, calibration="analytic", **args)
    assert gaussian.log_noise.calibration == "analytic"


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("kind", KINDS)
def test_release_meta(kind, law):  # §7
    mech = make(kind, law, horizon=40)
    _, releases = run(mech, [np.ones(3)] * 40, NoiseSource(KEY))
    required = {"noisy_nodes", "levels", "window", "noise", "scale", "noise_std", "calibration"}
    for t, r in enumerate(releases, start=1):
        meta = dict(r.meta)
        assert required <= meta.keys()
        json.dumps(meta)
        assert all(type(v) in (int, float, str, type(None)) for v in meta.values())
        assert r.mechanism == mech.name and r.stream == "s" and r.step == t
        assert r.value.shape == (3,)
        assert meta["noisy_nodes"] == len(mech.nodes_used(t))
        assert meta["window"] is None and meta["noise"] == law
        assert meta["noise_std"] == pytest.approx(math.sqrt(mech.noise_var(t)), rel=1e-15)
        assert meta["calibration"] == ("exact" if law == "gamma" else "paper")
        k = flog(t)
        if kind == "plain":
            assert meta["levels"] == mech.levels == 6 and meta["scale"] == mech.node_noise.scale
            assert meta["horizon"] == 40
        elif kind == "hybrid":
            assert meta["levels"] == meta["block"] == max(k, 1)
            assert meta["scale"] == mech.block_noise(max(k, 1)).scale
            assert meta["log_scale"] == mech.log_noise.scale
        else:
            assert meta["levels"] == k + 1 and meta["block"] == k
            assert meta["scale"] == mech.block_noise(k).scale
