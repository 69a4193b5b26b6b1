"""Window tree mechanism (Chan, Shi & Song, "Private and Continual Release of Statistics", checks §8 items 1, 2, 3, 5, 7–11, 13–16).

Statistical tests use a fixed key, one stream name per independent run, and tolerances taken from
the sampling distribution of the statistic (stated at each test). Every calibration test also
runs a deliberately mis-calibrated variant of the mechanism (``_variant``: same keys, node scale
multiplied by a factor) through the same check and asserts that it FAILS.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest

from beam_dp.core.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    sigma_window_002,
)
from beam_dp.core.guarantee import Guarantee, PrivacyLedger
from beam_dp.core.noise import NoiseSource
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import ClippedSum, NodeNoise
from beam_dp.mechanisms.sums.window_tree import WindowTreeState, WindowTreeSum
from beam_dp.testing.noise import ZeroNoise
from beam_dp.testing.stats import covariance_matches, gaussian_variance_matches, mean_matches

KEY = b"k" * 32
NS = NoiseSource(KEY)
WINDOWS = (1, 2, 3, 4, 5, 16, 100)
# W -> (B, L_W)
LAYOUT = {1: (1, 1), 2: (2, 2), 3: (4, 3), 4: (4, 3), 5: (8, 4), 8: (8, 4), 16: (16, 5), 100: (128, 8)}


def make(window, dim=3, epsilon=1.0, noise="gamma", delta=0.0, calibration="paper", clip_bound=1.0):
    if noise == "gaussian" and delta == 0.0:
        delta = 1e-5
    return WindowTreeSum(
        dim=dim, epsilon=epsilon, delta=delta, clip_bound=clip_bound, noise=noise, calibration=calibration, window=window
    )


def _variant(mech, factor):
    """The same mechanism with every node's noise scale multiplied by ``factor`` (mis-calibrated)."""
    bad = copy.copy(mech)
    bad.node_noise = NodeNoise(mech.node_noise.law, mech.node_noise.scale * factor, mech.node_noise.calibration)
    return bad


def run(mech, blocks, noise=NS, stream="s"):
    """Feed ``blocks`` one step each; return (states after each step, releases)."""
    state = mech.init_state(stream)
    states, releases = [], []
    for block in blocks:
        state, out = mech.step(state, block, noise)
        assert len(out) == 1
        states.append(state)
        releases.append(out[0])
    return states, releases


def random_vectors(rng, n, d, radius=1.0):
    """``n`` vectors of norm <= radius (no clipping at R = radius)."""
    v = rng.normal(size=(n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True) * rng.uniform(0, radius, size=(n, 1))


def draw_nodes(mech, noise, streams, nodes):
    """Node noises ``(runs, nodes, d)`` exactly as the mechanism draws them (keyed by node)."""
    out = np.empty((len(streams), len(nodes), mech.dim))
    draw = mech.node_noise.draw
    for r, stream in enumerate(streams):
        for n, node in enumerate(nodes):
            out[r, n] = draw(noise, stream, "wtm", node, mech.dim)
    return out


def incidence(mech, steps, nodes):
    """0/1 matrix (steps, nodes): node used by the release at that step."""
    col = {node: i for i, node in enumerate(nodes)}
    a = np.zeros((len(steps), len(nodes)))
    for r, t in enumerate(steps):
        for node in mech.nodes_used(t):
            a[r, col[node]] = 1.0
    return a


def three_case_k(t, B, L):
    """k_t"""
    k, j = (t - 1) // B + 1, t - ((t - 1) // B) * B
    if k == 1:
        return bin(t).count("1")
    if j == B:
        return 1
    return bin(j).count("1") + bin(B - j).count("1")


# Spec §5 (W = 4): node names -> ids N_b(level, index) = (b, level, index).
N5 = {
    "v1": (1, 0, 1), "v2": (1, 0, 2), "v3": (1, 0, 3), "v4": (1, 0, 4), "s12": (1, 1, 1), "s34": (1, 1, 2), "s14": (1, 2, 1),
    "v5": (2, 0, 1), "v6": (2, 0, 2), "v7": (2, 0, 3), "v8": (2, 0, 4), "s56": (2, 1, 1), "s78": (2, 1, 2), "s58": (2, 2, 1),
    "v9": (3, 0, 1), "s9_10": (3, 1, 1),
}  # fmt: skip
CONTAINING_W4 = {
    1: {"v1", "s12", "s14"}, 2: {"v2", "s12", "s14"}, 3: {"v3", "s34", "s14"}, 4: {"v4", "s34", "s14"},
    5: {"v5", "s56", "s58"}, 6: {"v6", "s56", "s58"}, 7: {"v7", "s78", "s58"}, 8: {"v8", "s78", "s58"},
}  # fmt: skip
USED_W4 = {  # (clean through, noisy nodes in step order) — §5 table plus t = 9, 10 from its text
    1: (0, ["v1"]), 2: (0, ["s12"]), 3: (0, ["s12", "v3"]), 4: (0, ["s14"]),
    5: (1, ["v2", "s34", "v5"]), 6: (2, ["s34", "s56"]), 7: (3, ["v4", "s56", "v7"]), 8: (4, ["s58"]),
    9: (5, ["v6", "s78", "v9"]), 10: (6, ["s78", "s9_10"]),
}  # fmt: skip
COMPLETES_W4 = {1: {"v1"}, 2: {"v2", "s12"}, 3: {"v3"}, 4: {"v4", "s34", "s14"},
                5: {"v5"}, 6: {"v6", "s56"}, 7: {"v7"}, 8: {"v8", "s78", "s58"}}  # fmt: skip

SHARED_WINDOW_W4 = np.array([
    [1, 0, 0, 0, 0, 0, 0, 0],
    [0, 1, 1, 0, 0, 0, 0, 0],
    [0, 1, 2, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 3, 1, 0, 0],
    [0, 0, 0, 0, 1, 2, 1, 0],
    [0, 0, 0, 0, 0, 1, 3, 0],
    [0, 0, 0, 0, 0, 0, 0, 1],
], dtype=float)  # fmt: skip
SHARED_PLAIN_T8 = np.array([
    [1, 0, 0, 0, 0, 0, 0, 0],
    [0, 1, 1, 0, 0, 0, 0, 0],
    [0, 1, 2, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 1, 1, 1, 0],
    [0, 0, 0, 1, 2, 1, 1, 0],
    [0, 0, 0, 1, 1, 2, 2, 0],
    [0, 0, 0, 1, 1, 2, 3, 0],
    [0, 0, 0, 0, 0, 0, 0, 1],
], dtype=float)  # fmt: skip


# -- construction -------------------------------------------------------------------------------


@pytest.mark.parametrize("window", sorted(LAYOUT))
def test_blocks_levels_scale_and_guarantee(window):
    B, L = LAYOUT[window]
    mech = make(window, epsilon=0.7, clip_bound=1.5)
    assert (mech.window, mech.block, mech.levels, mech.name) == (window, B, L, "window_tree")
    assert L == math.ceil(math.log2(window)) + 1
    assert mech.sensitivity == 3.0
    assert mech.guarantee == Guarantee(0.7, 0.0, window=B, window_requested=window)
    assert "window DP" in mech.guarantee.describe()
    # c_W = Δ₂ (⌈log W⌉ + 1) / ε (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" eq. 11); one node costs ε / L_W
    assert mech.node_noise == NodeNoise("gamma", 3.0 * L / 0.7, "exact")
    assert mech.node_noise.charge(1, 1, mech.sensitivity).loss.pure_epsilon == pytest.approx(0.7 / L, rel=1e-14)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True, None])
def test_window_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError):
        make(bad)


def test_window_is_required_and_base_validation_applies():
    with pytest.raises(TypeError):
        WindowTreeSum(dim=2, epsilon=1.0, clip_bound=1.0)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        WindowTreeSum(dim=2, epsilon=0.0, clip_bound=1.0, window=4)
    with pytest.raises(ValueError):
        WindowTreeSum(dim=2, epsilon=1.0, delta=1e-5, clip_bound=1.0, window=4)  # gamma with delta
    with pytest.raises(ValueError):
        WindowTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, sensitivity=2.0, window=4)
    mech = WindowTreeSum(dim=2, epsilon=1.0, sensitivity=2.0, window=4)
    assert mech.clip_bound == 1.0 and mech.sensitivity == 2.0


# -- §8.1 / §8.2: node bookkeeping ----------------------------------------------------------------


def test_w4_node_sets_match_spec_example():
    mech = make(4)
    for t, names in CONTAINING_W4.items():
        assert set(mech.nodes_containing(t)) == {N5[n] for n in names}, t
    for t, (clean, names) in USED_W4.items():
        assert mech.nodes_used(t) == [N5[n] for n in names], t
        assert mech.clean_through(t) == clean
        assert mech.noisy_nodes(t) == len(names)
    for t, names in COMPLETES_W4.items():
        got = {(c.first, c.last) for c in mech.charges_at(t)}
        assert got == {mech.node_steps(N5[n]) for n in names}
        assert all(c.last == t for c in mech.charges_at(t))
    # "s78 is first read at t = 9; v8 at t = 11"
    first_read = {name: min(t for t in range(1, 20) if N5[name] in mech.nodes_used(t)) for name in ("s78", "v8")}
    assert first_read == {"s78": 9, "v8": 11}


@pytest.mark.parametrize("window", WINDOWS)
def test_every_step_lies_in_exactly_levels_nodes_of_its_own_block(window):
    """§8.1, cross-checked against the ledger charges (node coverage as instrumented)."""
    mech = make(window)
    B, L, T = mech.block, mech.levels, 4096
    covering: dict[int, set] = {t: set() for t in range(1, T + 1)}
    for t in range(1, T + 1):
        for c in mech.charges_at(t):
            for u in range(c.first, c.last + 1):
                covering[u].add((c.first, c.last))
    complete = (T // B) * B  # steps whose block is complete by T
    for t in range(1, T + 1):
        nodes = mech.nodes_containing(t)
        assert len(set(nodes)) == L
        k = (t - 1) // B + 1
        for node in nodes:
            first, last = mech.node_steps(node)
            assert node[0] == k and (k - 1) * B < first <= t <= last <= k * B
        if t <= complete:
            assert covering[t] == {mech.node_steps(n) for n in nodes}


@pytest.mark.parametrize("window", WINDOWS)
def test_prefix_suffix_decomposition(window):
    """§8.2: k_t (three cases), max k_t = L_W, used nodes tile exactly (t - B, t], are complete by t,
    suffix nodes are right children of block k-1, prefix nodes left children or the root of block k."""
    mech = make(window)
    B, L = mech.block, mech.levels
    node_var = mech.node_variance(mech.node_noise)
    ks = []
    for t in range(1, 4097):
        used = mech.nodes_used(t)
        k_t = three_case_k(t, B, L)
        assert mech.noisy_nodes(t) == len(used) == k_t, t
        assert mech.noise_var(t) == pytest.approx(k_t * node_var, rel=1e-14)
        ks.append(k_t)
        covered = []
        for node in used:
            first, last = mech.node_steps(node)
            assert last <= t  # complete (noised) by t
            covered.extend(range(first, last + 1))
        assert covered == list(range(max(0, t - B) + 1, t + 1)), t
        assert mech.clean_through(t) == max(0, t - B)
        k = (t - 1) // B + 1
        for b, level, i in used:
            if b == k - 1:
                assert i % 2 == 0  # right child
            else:
                assert b == k and (i % 2 == 1 or level == mech.levels - 1)
    assert max(ks) == L


def test_window_at_least_horizon_is_a_plain_tree():
    """§8.13: with W >= T the nodes are those of a plain tree with ⌈log W⌉ + 1 levels over [1, T],
    and so are the releases (checked against an independent TREEMECH (§2.4) run on the same keys)."""
    for window, T in [(8, 8), (13, 13), (16, 8), (64, 40)]:
        mech = make(window, dim=2)
        L = mech.levels
        assert mech.node_noise.scale == pytest.approx(mech.sensitivity * L / mech.epsilon)
        for t in range(1, T + 1):
            plain_used = {(1, lv, t >> lv) for lv in range(L) if (t >> lv) & 1}  # §2.2: N(ℓ, ⌊t/2^ℓ⌋)
            assert set(mech.nodes_used(t)) == plain_used
            assert set(mech.nodes_containing(t)) == {(1, lv, -(-t // 2**lv)) for lv in range(L)}
        # TREEMECH (§2.4) with node N(i, t/2^i) keyed like the window tree's block 1
        rng = np.random.default_rng(window)
        vs = random_vectors(rng, T, 2)
        a, b = np.zeros((L, 2)), np.zeros((L, 2))
        _, releases = run(mech, list(vs))
        for t in range(1, T + 1):
            i = (t & -t).bit_length() - 1
            a[i] = vs[t - 1] + a[:i].sum(axis=0)
            a[:i] = 0.0
            b[:i] = 0.0
            b[i] = a[i] + mech.node_noise.draw(NS, "s", "wtm", (1, i, t >> i), 2)
            expected = sum(b[j] for j in range(L) if (t >> j) & 1)
            np.testing.assert_allclose(releases[t - 1].value, expected, rtol=1e-9, atol=1e-9)


# -- §8.3: exactness without noise -------------------------------------------------------------------


@pytest.mark.parametrize("window", (1, 2, 3, 4, 5, 16))
def test_exact_without_noise(window):
    mech = make(window, dim=3, clip_bound=2.0)
    B = mech.block
    T = max(40, 3 * B + 3)  # crosses several block boundaries (and powers of two)
    rng = np.random.default_rng(100 + window)
    blocks, truth = [], []
    for t in range(1, T + 1):
        kind = t % 4
        if kind == 0:
            v = random_vectors(rng, 1, 3, 2.0)[0] * 1e3 ** rng.uniform(-1, 0)
            blocks.append(v)
            truth.append(v)
        elif kind == 1:  # several raw contributions, some clipped
            rows = rng.normal(size=(3, 3)) * 2.0
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            blocks.append(rows)
            truth.append((rows * np.minimum(1.0, 2.0 / norms)).sum(axis=0))
        elif kind == 2:  # pre-aggregated
            cs = mech.clip_and_sum(random_vectors(rng, 2, 3, 2.0))
            blocks.append(cs)
            truth.append(cs.vector)
        else:  # empty step: still releases
            blocks.append(None)
            truth.append(np.zeros(3))
    states, releases = run(mech, blocks, noise=ZeroNoise())
    S = np.cumsum(truth, axis=0)
    for t, (state, rel) in enumerate(zip(states, releases), start=1):
        assert rel.step == t and state.t == t
        np.testing.assert_allclose(rel.value, S[t - 1], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mech.clean_part(state), S[t - B - 1] if t > B else 0.0, rtol=1e-9, atol=1e-12)


# -- §8.10: no clean use inside the window -----------------------------------------------------------


@pytest.mark.parametrize("window", (1, 3, 4, 5, 8))
def test_no_clean_use_inside_the_window(window):
    """With one-hot step vectors, the clean part of the release at s holds exactly steps 1..s-B, and
    the release is that clean part plus the (clean + noise) values of nodes_used(s), whose noise is
    the keyed draw of the node."""
    mech = make(window, dim=1)  # dim fixed below
    B = mech.block
    T = 4 * B + 3
    mech = make(window, dim=T)
    vs = np.eye(T)  # step u contributes e_u (norm 1 = R)
    states, releases = run(mech, list(vs), stream="onehot")
    for s, (state, rel) in enumerate(zip(states, releases), start=1):
        clean = mech.clean_part(state)
        through = mech.clean_through(s)  # 0: the clean part is empty
        assert through == max(0, s - B) and (through == 0 or through <= s - B)
        np.testing.assert_array_equal(np.nonzero(clean)[0] + 1, np.arange(1, through + 1))
        held = mech.held_nodes(state)
        total = clean.copy()
        for node in mech.nodes_used(s):
            value, node_noise = held[node]
            np.testing.assert_array_equal(node_noise, mech.node_noise.draw(NS, "onehot", "wtm", node, T))
            total += value + node_noise
        np.testing.assert_allclose(rel.value, total, rtol=1e-9, atol=1e-9)


# -- §8.5: Gaussian scale ------------------------------------------------------------------------


@pytest.mark.parametrize("eps,delta,levels", [(0.1, 1e-10, 1), (1.0, 1e-5, 3), (5.0, 1e-6, 8), (50.0, 0.05, 30)])
def test_sigma_window_002_formula(eps, delta, levels):
    expected = math.sqrt(8 * 2.0**2 * levels**2 * math.log(2 / delta) ** 2 / eps**2)
    assert sigma_window_002(eps, delta, 2.0, levels) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("window", (1, 4, 5, 100))
def test_gaussian_calibrations(window):
    paper = make(window, noise="gaussian", epsilon=2.0, delta=1e-6, clip_bound=0.5)
    L = paper.levels
    assert paper.node_noise.law == "gaussian" and paper.node_noise.calibration == "paper"
    assert paper.node_noise.scale == pytest.approx(sigma_window_002(2.0, 1e-6, 1.0, L), rel=1e-12)
    assert analytic_gaussian_delta(2.0, math.sqrt(L) / paper.node_noise.scale) <= 1e-6  # §1.2 joint check
    exact = make(window, noise="gaussian", epsilon=2.0, delta=1e-6, clip_bound=0.5, calibration="analytic")
    sigma = exact.node_noise.scale
    assert exact.node_noise.calibration == "analytic" and sigma < paper.node_noise.scale
    assert sigma == pytest.approx(analytic_gaussian_sigma(2.0, 1e-6, math.sqrt(L)), rel=1e-12)
    achieved = analytic_gaussian_delta(2.0, math.sqrt(L) / sigma)
    assert 0.99e-6 < achieved <= 1e-6


def test_gaussian_paper_calibration_is_certified(monkeypatch):
    """A paper sigma failing the analytic check must raise (fail closed); 'analytic' recalibrates."""
    import beam_dp.mechanisms.sums.window_tree as wt

    monkeypatch.setattr(wt, "sigma_window_002", lambda eps, delta, sens, levels: 0.2 * sens * math.sqrt(levels) / eps)
    with pytest.raises(ValueError, match="analytic"):
        make(4, noise="gaussian", epsilon=1.0, delta=1e-5)
    assert make(4, noise="gaussian", epsilon=1.0, delta=1e-5, calibration="analytic").node_noise.scale > 0


@pytest.mark.parametrize("calibration", ["paper", "analytic"])
def test_gaussian_node_variance(calibration):
    """Per-coordinate variance of node noise inside the 99.9% chi-square interval around σ_W²
    (sum x²/σ² ~ χ²(n), n = 7 nodes × 300 blocks × d 5); a 2× under-noised variant fails."""
    mech = make(4, dim=5, noise="gaussian", calibration=calibration)
    nodes = [(b, lv, i) for b in range(1, 301) for lv in range(3) for i in range(1, (4 >> lv) + 1)]
    samples = draw_nodes(mech, NS, ["var"], nodes)
    sigma2 = mech.node_noise.scale**2
    assert gaussian_variance_matches(samples, sigma2)
    assert not gaussian_variance_matches(draw_nodes(_variant(mech, 0.5), NS, ["var"], nodes[:500]), sigma2)
    # the mechanism's own state holds exactly these keyed draws
    states, _ = run(mech, [np.zeros(5)] * 8, stream="var")
    for node, (_, node_noise) in mech.held_nodes(states[-1]).items():
        np.testing.assert_array_equal(node_noise, samples[0, nodes.index(node)])


# -- §8.7: second moment of the error -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("law", ["gamma", "gaussian"])
def test_second_moment_of_error(law):
    """Over 4,000 runs (d = 5, W = 8, t <= 40) the mean of ‖e_t‖² lies within ±4 SE of
    k_t d(d+1)c_W² (Gamma) / k_t d σ_W² (Gaussian). SE = sample std of ‖e_t‖² / √4000 (‖e_t‖² has
    finite variance; for a correct scale each t fails with prob. ≈ 6e-5). e_t is computed in bulk
    from the keyed node noises of nodes_used(t); on a few runs the mechanism's own releases minus
    the true sums are checked to equal that sum. A variant with the scale off by 10% must fail."""
    d, W, T, runs = 5, 8, 40, 4000
    mech = make(W, dim=d, noise=law, epsilon=1.0)
    steps = list(range(1, T + 1))
    nodes = sorted({n for t in steps for n in mech.nodes_used(t)})
    A = incidence(mech, steps, nodes)
    streams = [f"m2-{law}-{r}" for r in range(runs)]
    noises = draw_nodes(mech, NS, streams, nodes)
    errors = np.einsum("tn,rnd->rtd", A, noises)
    sq = (errors**2).sum(axis=2)
    k_t = np.array([mech.noisy_nodes(t) for t in steps])
    expected = k_t * d * mech.node_variance(mech.node_noise)  # = k_t d(d+1)c² or k_t d σ²
    if law == "gamma":
        assert np.allclose(expected, k_t * d * (d + 1) * mech.node_noise.scale**2)
    assert mean_matches(sq, expected, n_se=4.0)

    # the bulk errors are the mechanism's errors
    rng = np.random.default_rng(7)
    for r in (0, 1, runs - 1):
        vs = random_vectors(rng, T, d)
        _, releases = run(mech, list(vs), stream=streams[r])
        got = np.array([rel.value for rel in releases]) - np.cumsum(vs, axis=0)
        np.testing.assert_allclose(got, errors[r], rtol=1e-9, atol=1e-9)
        assert [rel.meta["noisy_nodes"] for rel in releases] == list(k_t)

    # negative control: node scale 1.1 c. Keyed draws scale exactly with the scale parameter (checked
    # on some nodes), so the variant's errors are 1.1 × errors.
    bad = _variant(mech, 1.1)
    np.testing.assert_allclose(draw_nodes(bad, NS, streams[:20], nodes), 1.1 * noises[:20], rtol=1e-12)
    assert not mean_matches(sq * 1.1**2, expected, n_se=4.0)


# -- §8.8: covariance structure ---------------------------------------------------------------------


@pytest.mark.slow
def test_covariance_structure_w4():
    """d = 1 Gaussian, 20,000 runs: Cov(e_1..e_8) = σ² × the shared-node matrix of §5 within 5 SE per
    entry (SE = std(e_t e_u)/√runs, from the samples). Controls that must fail: a 2× under-noised
    variant, and the plain tree's (§2.5) matrix."""
    mech = make(4, dim=1, noise="gaussian")
    runs, steps = 20000, list(range(1, 9))
    nodes = sorted({n for t in steps for n in mech.nodes_used(t)})
    A = incidence(mech, steps, nodes)
    assert np.array_equal(A @ A.T, SHARED_WINDOW_W4)  # |nodes(t) ∩ nodes(u)|
    noises = draw_nodes(mech, NS, [f"cov-{r}" for r in range(runs)], nodes)[:, :, 0]
    errors = noises @ A.T
    sigma2 = mech.node_noise.scale**2
    assert covariance_matches(errors, sigma2 * SHARED_WINDOW_W4, n_se=5.0)
    assert not covariance_matches(errors, sigma2 * SHARED_PLAIN_T8, n_se=5.0)
    bad = _variant(mech, 0.5)
    bad_noises = draw_nodes(bad, NS, [f"cov-{r}" for r in range(2000)], nodes)[:, :, 0]
    assert not covariance_matches(bad_noises @ A.T, sigma2 * SHARED_WINDOW_W4, n_se=5.0)


# -- §8.9 / §4.6: ledger and spend -----------------------------------------------------------------------


def _ledger(mech, steps):
    ledger = PrivacyLedger(mech.guarantee)
    for t in range(1, steps + 1):
        ledger.record(mech.charges_at(t))
    return ledger


@pytest.mark.parametrize("window", (4, 100))
def test_privacy_ledger_gamma(window):
    """§8.9: per step, Σ Δ₂/c over the nodes containing it is <= ε(1+1e-12), and = ε once its block is
    complete (L_W nodes); the c-halved variant overspends."""
    mech = make(window, epsilon=0.8)
    n = 5000
    ledger = _ledger(mech, n)
    pure, gauss = ledger.loss_per_step(n)
    assert not np.any(gauss)
    assert np.all(pure <= 0.8 * (1 + 1e-12))
    complete = (n // mech.block) * mech.block
    np.testing.assert_allclose(pure[:complete], 0.8, rtol=1e-12)
    counts = np.zeros(n + 2)
    for t in range(1, n + 1):
        for c in mech.charges_at(t):
            counts[c.first : c.last + 1] += 1
    assert np.all(counts[1 : complete + 1] == mech.levels)
    ledger.check(n)
    with pytest.raises(ValueError):
        _ledger(_variant(mech, 0.5), n).check(n)


@pytest.mark.parametrize("window", (4, 100))
@pytest.mark.parametrize("calibration", ["paper", "analytic"])
def test_privacy_ledger_gaussian(window, calibration):
    """§8.9 Gaussian: the joint analytic check holds per step with its actual node count; a 2× under-
    noised variant of the tight (analytic) calibration fails it."""
    mech = make(window, noise="gaussian", epsilon=1.0, delta=1e-5, calibration=calibration)
    n = 5000
    ledger = _ledger(mech, n)
    pure, mu2 = ledger.loss_per_step(n)
    assert not np.any(pure)
    complete = (n // mech.block) * mech.block
    np.testing.assert_allclose(mu2[:complete], mech.levels * (mech.sensitivity / mech.node_noise.scale) ** 2, rtol=1e-12)
    for value in np.unique(mu2):
        assert analytic_gaussian_delta(1.0, math.sqrt(value)) <= 1e-5
    ledger.check(n)
    if calibration == "analytic":
        with pytest.raises(ValueError):
            _ledger(_variant(mech, 0.5), n).check(n)


@pytest.mark.parametrize("window", (1, 4, 5))
def test_epsilon_spent_gamma(window):
    """§4.6: ε · min(L_W, ⌊log t⌋ + 1) / L_W, the worst protected step of the ledger, never above ε."""
    mech = make(window, epsilon=0.9)
    B, L = mech.block, mech.levels
    _, releases = run(mech, [np.ones(3) * 0.1] * (3 * B + 2))
    ledger = PrivacyLedger(mech.guarantee)
    for t, rel in enumerate(releases, start=1):
        ledger.record(mech.charges_at(t))
        pure, _ = ledger.loss_per_step(t)
        protected = pure[max(0, t - B) : t]
        assert rel.epsilon_spent == pytest.approx(0.9 * min(L, math.floor(math.log2(t)) + 1) / L, rel=1e-12)
        assert rel.epsilon_spent == pytest.approx(protected.max(), rel=1e-12)
        assert rel.epsilon_spent <= 0.9 and rel.delta_spent == 0.0


def test_epsilon_spent_gaussian():
    mech = make(5, noise="gaussian", epsilon=1.0, delta=1e-5, calibration="analytic")
    _, releases = run(mech, [None] * 20)
    mu = mech.sensitivity / mech.node_noise.scale
    for t, rel in enumerate(releases, start=1):
        m = min(mech.levels, t.bit_length())
        assert rel.delta_spent == 1e-5
        assert rel.epsilon_spent == pytest.approx(analytic_gaussian_epsilon(mu * math.sqrt(m), 1e-5), rel=1e-9)
        assert rel.epsilon_spent <= 1.0 * (1 + 1e-9)
    assert releases[-1].epsilon_spent == pytest.approx(1.0, rel=1e-6)  # tight calibration: reached


# -- §8.11: memory bound --------------------------------------------------------------------------------


def _stored_vectors(state, dim):
    """Vectors of length ``dim`` held by the state, counting whole underlying buffers."""
    owners = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, np.ndarray):
            owner = value
            while owner.base is not None:
                owner = owner.base
            owners[id(owner)] = owner.size
    return sum(owners.values()) / dim


def test_memory_bound_with_noise():
    mech = make(5, dim=2)
    bound = 6 * mech.block + 1
    state = mech.init_state("mem")
    most = 0.0
    for _ in range(5 * mech.block + 3):
        state, _ = mech.step(state, np.ones(2) * 0.1, NS)
        most = max(most, _stored_vectors(state, 2))
    assert most <= bound


@pytest.mark.slow
@pytest.mark.parametrize("window", (16, 100))
def test_memory_bound_long_run(window):
    """§8.11: never more than 6B + 1 vectors over 10⁵ steps (noise values do not affect the layout)."""
    mech = make(window, dim=2)
    bound = 6 * mech.block + 1
    state, zero, v = mech.init_state("mem"), ZeroNoise(), np.full(2, 0.1)
    most = 0.0
    for _ in range(100_000):
        state, _, _, _ = mech._advance(state, v, zero)
        most = max(most, _stored_vectors(state, 2))
    assert state.t == 100_000
    assert most <= bound


# -- §8.14: exact privacy-loss audit ------------------------------------------------------------------


def test_exact_privacy_loss_audit_laplace_nodes():
    """W = 4, d = 1 Gamma (= Laplace) nodes. Neighbouring streams differ at step 5 by Δ₂; over T = 8
    the released node values of the two streams differ only at the nodes containing step 5, so the
    exact log-likelihood ratio of all node values is Σ_{n ∋ 5} (|y_n - c'_n| - |y_n - c_n|)/c.
    Its maximum over 10,000 samples is <= ε + 1e-9 (and reaches ε); with c halved it exceeds ε."""
    eps = 1.0
    mech = make(4, dim=1, epsilon=eps, clip_bound=1.0)
    rng = np.random.default_rng(5)
    vs = rng.uniform(-1, 1, size=(8, 1))
    vs_n = vs.copy()
    vs[4], vs_n[4] = 1.0, -1.0  # step 5 moves by Δ₂ = 2R = 2
    s_a, _ = run(mech, list(vs), noise=ZeroNoise())
    s_b, _ = run(mech, list(vs_n), noise=ZeroNoise())
    held_a, held_b = mech.held_nodes(s_a[-1]), mech.held_nodes(s_b[-1])  # all nodes of block 2
    differ = {n for n in held_a if not np.array_equal(held_a[n][0], held_b[n][0])}
    assert differ == set(mech.nodes_containing(5))
    # block 1 (folded into the clean base) does not contain step 5 and is identical in both runs
    for t in range(1, 5):
        assert set(mech.nodes_containing(t)).isdisjoint(differ)

    nodes = mech.nodes_containing(5)
    clean_a = np.array([held_a[n][0][0] for n in nodes])
    clean_b = np.array([held_b[n][0][0] for n in nodes])
    assert np.allclose(np.abs(clean_a - clean_b), mech.sensitivity)

    def max_llr(m):
        y = clean_a + draw_nodes(m, NS, [f"audit-{r}" for r in range(10000)], nodes)[:, :, 0]
        c = m.node_noise.scale
        return float(((np.abs(y - clean_b) - np.abs(y - clean_a)) / c).sum(axis=1).max())

    worst = max_llr(mech)
    assert worst <= eps + 1e-9
    assert worst == pytest.approx(eps, rel=1e-9)  # P(all three noises <= 0) = 1/8: the bound is reached
    assert max_llr(_variant(mech, 0.5)) > eps
    # the audited node values are the mechanism's own: its state after T = 8 on stream audit-0
    states, _ = run(mech, list(vs), stream="audit-0")
    held = mech.held_nodes(states[-1])
    for n, (value, node_noise) in held.items():
        np.testing.assert_array_equal(value, held_a[n][0])
        np.testing.assert_array_equal(node_noise, mech.node_noise.draw(NS, "audit-0", "wtm", n, 1))


# -- §8.15: determinism and restore -----------------------------------------------------------------


def test_determinism_restore_and_keys():
    mech = make(5, dim=3)
    rng = np.random.default_rng(15)
    blocks = list(random_vectors(rng, 30, 3))
    _, ref = run(mech, blocks, noise=NoiseSource(KEY))
    _, again = run(mech, blocks, noise=NoiseSource(b"k" * 32))
    assert ref == again  # Release equality compares value bytes and meta
    assert all(a.value.tobytes() == b.value.tobytes() for a, b in zip(ref, again))
    _, other_key = run(mech, blocks, noise=NoiseSource(b"j" * 32))
    assert all(not np.array_equal(a.value, b.value) for a, b in zip(ref, other_key))
    _, other_stream = run(mech, blocks, stream="s2")
    assert all(not np.array_equal(a.value, b.value) for a, b in zip(ref, other_stream))

    for cut in (1, 5, 8, 9, 13, 16, 17, 23):
        states, _ = run(mech, blocks[:cut])
        data = mech.encode_state(states[-1])
        assert data == encode_state(states[-1])
        restored = mech.decode_state(data)
        assert isinstance(restored, WindowTreeState) and restored.t == cut
        assert encode_state(decode_state(WindowTreeState, data)) == data
        state, tail = restored, []
        for block in blocks[cut:]:
            state, out = mech.step(state, block, NS)
            tail.extend(out)
        assert tail == ref[cut:], cut


def test_stepping_never_changes_a_state_and_retries_are_safe():
    """Stepping the same state again (a retry, or a different input) gives a result as if it were the
    first time, and never alters the earlier state or a branch made from it."""
    mech = make(4, dim=2)
    rng = np.random.default_rng(3)
    blocks = list(random_vectors(rng, 20, 2))
    states, ref = run(mech, blocks)
    base = states[9]  # t = 10, mid-block
    before = mech.encode_state(base)
    s1, r1 = mech.step(base, blocks[10], NS)
    s2, r2 = mech.step(base, np.zeros(2), NS)  # a different branch from the same state
    s3, r3 = mech.step(base, blocks[10], NS)  # a retry
    assert mech.encode_state(base) == before
    assert r1 == r3 == [ref[10]] and mech.encode_state(s1) == mech.encode_state(s3)
    np.testing.assert_allclose(r2[0].value, ref[10].value - blocks[10], rtol=1e-12, atol=1e-12)
    state, tail = s1, []
    for block in blocks[11:]:
        state, out = mech.step(state, block, NS)
        tail.extend(out)
    assert tail == ref[11:]
    with pytest.raises((AttributeError, dataclasses.FrozenInstanceError)):
        base.t = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        base.cur_prefix[0, 0] = 1.0  # state arrays are read-only


def test_state_fields_and_corrupt_state():
    mech = make(4, dim=2)
    states, _ = run(mech, [np.ones(2) * 0.1] * 6)
    state = states[-1]
    assert WindowTreeState.STATE_VERSION == 1 and mech.state_type is WindowTreeState
    assert state.stream == "s" and state.t == 6
    for f in dataclasses.fields(state):
        assert isinstance(getattr(state, f.name), (int, float, str, np.ndarray, tuple))
    with pytest.raises(ValueError):
        mech.step(dataclasses.replace(state, t=7), np.ones(2), NS)
    with pytest.raises(ValueError):
        make(4, dim=3).step(state, np.ones(3), NS)
    with pytest.raises(ValueError):
        mech.nodes_used(0)


# -- §8.16: clipping ---------------------------------------------------------------------------


def test_clipping_and_neighbouring_node_values():
    R = 1.5
    mech = make(4, dim=3, clip_bound=R)
    u = np.array([3.0, -4.0, 12.0]) / 13.0
    cs = mech.clip_and_sum(np.array([10 * R * u]))
    assert cs.clipped == 1 and cs.count == 1
    _, (rel,) = run(mech, [np.array([10 * R * u])], noise=ZeroNoise())
    np.testing.assert_allclose(rel.value, R * u, rtol=1e-12)
    assert np.linalg.norm(rel.value) == pytest.approx(R, rel=1e-12)

    rng = np.random.default_rng(16)
    blocks = [rng.normal(size=(3, 3)) * 10 * R for _ in range(12)]
    neighbour = [b.copy() for b in blocks]
    blocks[5][0], neighbour[5][0] = 10 * R * u, -10 * R * u  # replace one contribution of step 6
    nodes_a, nodes_b = {}, {}
    for bl, out in ((blocks, nodes_a), (neighbour, nodes_b)):
        for state in run(mech, bl, noise=ZeroNoise())[0]:
            out.update({n: v for n, (v, _) in mech.held_nodes(state).items()})
    assert nodes_a.keys() == nodes_b.keys() and len(nodes_a) == 3 * 7
    for node in nodes_a:
        gap = np.linalg.norm(nodes_a[node] - nodes_b[node])
        assert gap <= mech.sensitivity * (1 + 1e-12)
        if node in mech.nodes_containing(6):
            assert gap == pytest.approx(mech.sensitivity, rel=1e-12)
        else:  # the same steps: equal up to the rounding of prefix-sum differences
            assert gap <= 1e-12 * 10 * R * 12


# -- §7: release meta ----------------------------------------------------------------------------


@pytest.mark.parametrize("noise,calibration", [("gamma", "paper"), ("gaussian", "paper"), ("gaussian", "analytic")])
def test_release_meta(noise, calibration):
    mech = make(5, dim=2, noise=noise, calibration=calibration)
    _, releases = run(mech, [np.ones(2) * 0.1] * 20, stream="meta")
    for t, rel in enumerate(releases, start=1):
        assert (rel.stream, rel.step, rel.mechanism) == ("meta", t, "window_tree")
        assert rel.value.shape == (2,)
        meta = dict(rel.meta)
        assert meta == {
            "noisy_nodes": mech.noisy_nodes(t),
            "levels": 4,
            "window": 8,
            "window_requested": 5,
            "noise": noise,
            "scale": mech.node_noise.scale,
            "noise_std": pytest.approx(math.sqrt(mech.noise_var(t)), rel=1e-12),
            "calibration": "exact" if noise == "gamma" else calibration,
        }
        assert json.loads(json.dumps(meta)) == meta  # plain JSON values
        assert type(meta["noisy_nodes"]) is int and type(meta["scale"]) is float


def test_clipped_sum_and_raw_blocks_agree():
    mech = make(3, dim=2, clip_bound=1.0)
    rows = np.array([[3.0, 4.0], [0.1, 0.2]])
    _, a = run(mech, [rows, None, rows])
    _, b = run(mech, [mech.clip_and_sum(rows), mech.empty_block(), ClippedSum(mech.clip_and_sum(rows).vector, 2, 1)])
    assert a == b


@pytest.mark.parametrize("law", ["gamma", "gaussian"])
def test_node_noise_drawn_ahead_equals_node_noise_drawn_step_by_step(law):
    """``StepsAhead`` (a call closing many steps) draws the nodes completing at each step of the next
    steps in one batch: every node gets the value of its own keyed cell, whatever it is drawn with."""
    from beam_dp.core.noise_ahead import StepsAhead

    tree = WindowTreeSum(dim=3, epsilon=1.0, delta=1e-6 if law == "gaussian" else 0.0, clip_bound=1.0,
                         noise=law, window=4)
    source, streams = NoiseSource(KEY), ("a", "b")
    ahead = StepsAhead(source, 5)  # 5 steps a draw: refills cross block boundaries (B = 4)
    for t in range(1, 15):
        nodes = tree.nodes_completing(t)
        drawn = tree.node_noise.draw_step(ahead, streams, "wtm", t, tree.nodes_completing, 3)
        # the same cells, drawn in a larger array: equal up to the last bit of vectorised log/sin/cos
        np.testing.assert_allclose(drawn, tree.node_noise.draw_nodes(source, streams, "wtm", nodes, 3),
                                   rtol=1e-13, atol=1e-13)
    assert tree.node_noise.draw_step(source, streams, "wtm", 3, tree.nodes_completing, 3).shape == (2, 1, 3)


def test_a_tree_stepped_with_noise_drawn_ahead_releases_what_it_releases_step_by_step():
    from beam_dp.core.noise_ahead import StepsAhead
    from tests.release_checks import assert_release_matches

    tree = WindowTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, window=8)
    rng = np.random.default_rng(3)
    blocks = [rng.normal(size=(2, 2)) / 3 for _ in range(40)]
    source = NoiseSource(KEY)
    ahead = StepsAhead(source, 16)
    s1 = s2 = tree.init_state("s")
    for block in blocks:
        s1, (r1,) = tree.step(s1, block, source)
        s2, (r2,) = tree.step(s2, block, ahead)
        assert_release_matches(r2, r1, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(s2.cur_noise, s1.cur_noise, rtol=1e-13, atol=1e-13)  # the state holds the same noises
