"""Samplers and the keyed ``NoiseSource`` (Chan, Shi & Song, "Private and Continual Release of Statistics"; ARCHITECTURE §4).

Every statistical check is a function returning ``True``/``False``. Each is asserted twice: it must
PASS on draws from the real sampler and FAIL on draws from a deliberately mis-calibrated one (the
negative control). All draws come from fixed keys/seeds, so the outcome is deterministic; the
tolerances are nevertheless chosen from the sampling distribution of each statistic (explained at
each check) so that a correct sampler would pass with overwhelming probability for any seed.
"""

from __future__ import annotations

import logging
import math
import pickle

import numpy as np
import pytest
from scipy import stats

from beam_dp.core import keyed_noise, noise
from beam_dp.core.calibration import sigma_tree_004, sigma_window_002
from beam_dp.core.noise import KEY_ENV_VAR, NoiseSource, load_key
from beam_dp.testing import ZeroNoise
from beam_dp.testing.stats import covariance_matches, gaussian_variance_matches, mean_matches

KEY = bytes(range(32))
N_DRAWS = 20_000
P_MIN = 1e-3  # KS / chi-square p-value threshold: a correct sampler fails with probability 1e-3 per test


def _gen(*index: int, purpose: str = "test") -> np.random.Generator:
    """A fixed-key generator (draws are a pure function of KEY and the node key)."""
    return NoiseSource(KEY).generator("core-tests", purpose, *index)


# --------------------------------------------------------------------------------------------------
# K-norm ("Gamma") sampler,
# --------------------------------------------------------------------------------------------------


def _knorm_checks(samples: np.ndarray, c: float) -> dict[str, bool]:
    """The four checks of §8.4 (+ the per-coordinate variance of §1.1) for draws of K-norm(scale=c).

    Tolerances:
    * ``ks``: ‖n‖ ~ Gamma(d, c) exactly; the KS p-value is uniform under H0, threshold 1e-3.
    * ``direction_mean``: u = n/‖n‖ is uniform on the sphere, E u_i = 0 and Var u_i = 1/d ≤ 1, so the
      SE of mean(u_i) is ≤ 1/√n and 5/√n is at least 5 SE (two-sided tail 5.7e-7 per coordinate).
    * ``direction_sq``: E u_1² = 1/d; SE estimated from the sample (std(u_1²)/√n), 5 SE allowed. For
      d = 1, u_1² ≡ 1 and the SE is 0, so a 1e-12 floor absorbs rounding.
    * ``coord_var``: E n_i² = (d+1)c² (mean 0 known); SE of the mean of n_i² estimated from the sample,
      5 SE allowed for every coordinate (via ``mean_matches``).
    """
    n, d = samples.shape
    norms = np.linalg.norm(samples, axis=1)
    u = samples / norms[:, None]
    u1sq = u[:, 0] ** 2
    se_u1sq = u1sq.std(ddof=1) / math.sqrt(n)
    return {
        "ks": stats.kstest(norms, stats.gamma(a=d, scale=c).cdf).pvalue > P_MIN,
        "direction_mean": bool(np.all(np.abs(u.mean(axis=0)) < 5.0 / math.sqrt(n))),
        "direction_sq": abs(u1sq.mean() - 1.0 / d) <= 5.0 * se_u1sq + 1e-12,
        "coord_var": mean_matches(samples**2, (d + 1) * c**2, n_se=5.0),
    }


@pytest.mark.parametrize("d", [1, 3, 50])
def test_knorm_matches_gamma_law_and_miscalibrated_fails(d):
    c = 0.7
    rng = _gen(d, purpose="knorm")
    good = noise.k_norm(rng, c, d, N_DRAWS)
    assert good.shape == (N_DRAWS, d)
    checks = _knorm_checks(good, c)
    assert all(checks.values()), checks

    # Negative control (§8.4): the sampler's c multiplied by 1.1, tested against Gamma(d, c).
    over = noise.k_norm(_gen(d, purpose="knorm-1.1"), 1.1 * c, d, N_DRAWS)
    bad = _knorm_checks(over, c)
    assert not bad["ks"], "KS must detect a 10% error in the K-norm scale"
    assert not all(bad.values())
    # Negative control: 2x under-noised (c/2).
    under = noise.k_norm(_gen(d, purpose="knorm-half"), c / 2, d, N_DRAWS)
    bad = _knorm_checks(under, c)
    assert not bad["ks"] and not bad["coord_var"]


def test_knorm_d1_is_laplace():
    # §1.1: for d = 1 the K-norm law is Laplace(scale c).
    c = 1.3
    x = noise.k_norm(_gen(purpose="knorm-d1"), c, 1, N_DRAWS)[:, 0]
    assert stats.kstest(x, stats.laplace(scale=c).cdf).pvalue > P_MIN
    x_bad = noise.k_norm(_gen(purpose="knorm-d1-half"), c / 2, 1, N_DRAWS)[:, 0]
    assert stats.kstest(x_bad, stats.laplace(scale=c).cdf).pvalue <= P_MIN


def test_knorm_coordinates_uncorrelated():
    # §1.1: coordinates uncorrelated, each with variance (d+1)c². Covariance within 5 SE per entry
    # (SE of each entry estimated from the products, see covariance_matches).
    d, c = 3, 0.5
    x = noise.k_norm(_gen(purpose="knorm-cov"), c, d, N_DRAWS)
    expected = (d + 1) * c**2 * np.eye(d)
    assert covariance_matches(x, expected)
    x_bad = noise.k_norm(_gen(purpose="knorm-cov-half"), c / 2, d, N_DRAWS)
    assert not covariance_matches(x_bad, expected)


def test_knorm_per_node_draws_via_noise_source():
    # One vector per node key (as mechanisms draw it): the norms over 3,000 distinct node keys are
    # Gamma(d, c) (KS, p > 1e-3), and c/2 fails.
    d, c = 3, 2.0
    ns = NoiseSource(KEY)
    good = np.array([ns.k_norm("s", "tree", (0, lvl, i), c, d) for lvl in range(3) for i in range(1000)])
    bad = np.array([ns.k_norm("s", "tree", (0, lvl, i), c / 2, d) for lvl in range(3) for i in range(1000)])
    law = stats.gamma(a=d, scale=c).cdf
    assert good.shape == (3000, d)
    assert stats.kstest(np.linalg.norm(good, axis=1), law).pvalue > P_MIN
    assert stats.kstest(np.linalg.norm(bad, axis=1), law).pvalue <= P_MIN


def test_knorm_shapes_and_validation():
    rng = _gen(purpose="knorm-shape")
    assert noise.k_norm(rng, 1.0, 4).shape == (4,)
    assert noise.k_norm(rng, 1.0, 4, 7).shape == (7, 4)
    for bad_scale in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            noise.k_norm(rng, bad_scale, 3)
    with pytest.raises(ValueError):
        noise.k_norm(rng, 1.0, 0)


# --------------------------------------------------------------------------------------------------
# Laplace
# --------------------------------------------------------------------------------------------------


def _laplace_ok(x: np.ndarray, scale: float) -> bool:
    """KS against scipy's Laplace(0, scale): p uniform under H0, threshold 1e-3."""
    return stats.kstest(x, stats.laplace(scale=scale).cdf).pvalue > P_MIN


@pytest.mark.parametrize("scale", [0.01, 1.0, 25.0])
def test_laplace_ks_and_half_scale_fails(scale):
    x = noise.laplace(_gen(purpose=f"lap-{scale}"), scale, N_DRAWS)
    assert x.shape == (N_DRAWS,)
    assert _laplace_ok(x, scale)
    # Variance 2b² (mean 0 known): mean of x² within 5 SE (SE from the sample).
    assert mean_matches(x**2, 2 * scale**2, n_se=5.0)
    # Negative control: 2x under-noised.
    x_bad = noise.laplace(_gen(purpose=f"lap-half-{scale}"), scale / 2, N_DRAWS)
    assert not _laplace_ok(x_bad, scale)
    assert not mean_matches(x_bad**2, 2 * scale**2, n_se=5.0)


def test_laplace_validation_and_scalar():
    rng = _gen(purpose="lap-v")
    assert np.ndim(noise.laplace(rng, 1.0)) == 0
    for bad in (0.0, -2.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            noise.laplace(rng, bad, 3)


# --------------------------------------------------------------------------------------------------
# Gaussian, incl. for both calibrations
# --------------------------------------------------------------------------------------------------


def _gauss_ok(x: np.ndarray, sigma: float) -> bool:
    """Sum x²/σ² ~ χ²(n) (mean known 0): inside the exact two-sided 99.9% interval; and KS p > 1e-3."""
    return gaussian_variance_matches(x, sigma**2, confidence=0.999) and (
        stats.kstest(x.ravel(), stats.norm(scale=sigma).cdf).pvalue > P_MIN
    )


@pytest.mark.parametrize("sigma", [0.05, 1.0, 40.0])
def test_gaussian_variance_and_half_sigma_fails(sigma):
    x = noise.gaussian(_gen(purpose=f"gauss-{sigma}"), sigma, N_DRAWS)
    assert _gauss_ok(x, sigma)
    x_bad = noise.gaussian(_gen(purpose=f"gauss-half-{sigma}"), sigma / 2, N_DRAWS)
    assert not _gauss_ok(x_bad, sigma)
    assert not gaussian_variance_matches(x_bad, sigma**2)


@pytest.mark.parametrize("calibration", [sigma_window_002, sigma_tree_004])
def test_gaussian_node_variance_for_both_calibrations(calibration):
    # §8.5: per-coordinate sample variance of a node inside a 99.9% chi-square interval around σ².
    sigma = calibration(1.0, 1e-5, 2.0, 4)  # eps=1, delta=1e-5, Δ₂=2, L=4
    ns = NoiseSource(KEY)
    # (a) one node with 20,000 coordinates: its coordinates' sample variance.
    node = ns.gaussian("s", "wtm", (3, 2, 1), sigma, N_DRAWS)
    assert gaussian_variance_matches(node, sigma**2)
    # (b) 2,000 nodes of dimension 4: each coordinate's variance across nodes.
    nodes = np.array([ns.gaussian("s", "tree", (0, 1, i), sigma, 4) for i in range(2000)])
    for j in range(4):
        assert gaussian_variance_matches(nodes[:, j], sigma**2)
    # Negative control: the same nodes drawn with σ/2 fail.
    node_bad = ns.gaussian("s", "wtm", (3, 2, 1), sigma / 2, N_DRAWS)
    assert not gaussian_variance_matches(node_bad, sigma**2)
    nodes_bad = np.array([ns.gaussian("s", "tree", (0, 1, i), sigma / 2, 4) for i in range(2000)])
    assert not any(gaussian_variance_matches(nodes_bad[:, j], sigma**2) for j in range(4))


def test_gaussian_validation():
    rng = _gen(purpose="gauss-v")
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            noise.gaussian(rng, bad, 2)


# --------------------------------------------------------------------------------------------------
# Discrete samplers: chi-square goodness of fit against the exact pmf
# --------------------------------------------------------------------------------------------------


def _chisq_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square GOF on integer bins. ``pmf`` (over the contiguous ``support``) must sum to 1.

    Central bins are single integers with expected count ≥ ``min_expected`` (the usual validity rule
    for the chi-square approximation); everything left/right of them is lumped into the two end bins
    (x ≤ lo, x ≥ hi), so no probability mass (and no sample) is dropped.
    """
    n = samples.size
    expected = n * pmf
    keep = np.flatnonzero(expected >= min_expected)
    lo, hi = support[keep[0]], support[keep[-1]]
    clamped = np.clip(samples.ravel(), lo, hi)
    observed = np.bincount(clamped - lo, minlength=hi - lo + 1).astype(np.float64)
    exp_bins = expected[keep[0] : keep[-1] + 1].copy()
    exp_bins[0] += expected[: keep[0]].sum()
    exp_bins[-1] += expected[keep[-1] + 1 :].sum()
    if observed.size < 2:
        return 1.0 if observed[0] == n else 0.0
    return float(stats.chisquare(observed, exp_bins * (n / exp_bins.sum())).pvalue)


def _dlap_pmf(x: np.ndarray, s: float) -> np.ndarray:
    """Exact pmf of the discrete Laplace: (1−e^{−1/s})/(1+e^{−1/s}) · e^{−|x|/s}."""
    q = math.exp(-1.0 / s)
    return (1 - q) / (1 + q) * np.exp(-np.abs(x) / s)


def _dlap_ok(x: np.ndarray, s: float) -> bool:
    support = np.arange(-int(40 * s) - 2, int(40 * s) + 3)  # mass outside < e^{-40} (negligible)
    pmf = _dlap_pmf(support, s)
    return _chisq_pvalue(x, support, pmf / pmf.sum()) > P_MIN


def test_discrete_laplace_pmf_formula_matches_scipy():
    for s in (0.3, 1.0, 7.0):
        k = np.arange(-20, 21)
        np.testing.assert_allclose(_dlap_pmf(k, s), stats.dlaplace(a=1.0 / s).pmf(k), rtol=1e-12)


@pytest.mark.parametrize("s", [0.5, 2.0, 10.0])
def test_discrete_laplace_pmf_moments_and_half_scale_fails(s):
    x = noise.discrete_laplace(_gen(purpose=f"dlap-{s}"), s, N_DRAWS)
    assert x.dtype.kind == "i" and x.shape == (N_DRAWS,)
    assert _dlap_ok(x, s)
    # Mean 0 within 5 SE; variance 2e^{−1/s}/(1−e^{−1/s})² via E x² (mean known 0), 5 SE.
    q = math.exp(-1.0 / s)
    var = 2 * q / (1 - q) ** 2
    assert mean_matches(x, 0.0, n_se=5.0)
    assert mean_matches(x.astype(np.float64) ** 2, var, n_se=5.0)
    # Negative control: 2x under-noised.
    x_bad = noise.discrete_laplace(_gen(purpose=f"dlap-half-{s}"), s / 2, N_DRAWS)
    assert not _dlap_ok(x_bad, s)
    assert not mean_matches(x_bad.astype(np.float64) ** 2, var, n_se=5.0)


def test_discrete_laplace_scalar_and_validation():
    rng = _gen(purpose="dlap-scalar")
    v = noise.discrete_laplace(rng, 3.0)
    assert np.ndim(v) == 0 and np.asarray(v).dtype.kind == "i"
    assert noise.discrete_laplace(rng, 3.0, (2, 3)).shape == (2, 3)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            noise.discrete_laplace(rng, bad, 3)


def _dgauss_ok(x: np.ndarray, sigma: float) -> bool:
    half = int(math.ceil(14 * sigma)) + 3  # mass beyond 14σ is < e^{-98}: normalising here is exact
    support = np.arange(-half, half + 1)
    w = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma**2))
    return _chisq_pvalue(x, support, w / w.sum()) > P_MIN


@pytest.mark.parametrize("sigma", [0.5, 3.0, 20.0])
def test_discrete_gaussian_pmf_and_half_sigma_fails(sigma):
    x = noise.discrete_gaussian(_gen(purpose=f"dgauss-{sigma}"), sigma, N_DRAWS)
    assert x.dtype == np.int64 and x.shape == (N_DRAWS,)
    assert _dgauss_ok(x, sigma)
    assert mean_matches(x, 0.0, n_se=5.0)
    x_bad = noise.discrete_gaussian(_gen(purpose=f"dgauss-half-{sigma}"), sigma / 2, N_DRAWS)
    assert not _dgauss_ok(x_bad, sigma)


def test_discrete_gaussian_shapes_and_validation():
    rng = _gen(purpose="dgauss-shape")
    v = noise.discrete_gaussian(rng, 2.0)
    assert np.ndim(v) == 0 and np.asarray(v).dtype.kind == "i"
    assert noise.discrete_gaussian(rng, 2.0, (3, 4)).shape == (3, 4)
    assert noise.discrete_gaussian(rng, 2.0, 0).shape == (0,)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            noise.discrete_gaussian(rng, bad, 3)


def test_chisq_helper_is_sensitive():
    # Sanity check of the helper itself: exact-pmf samples pass, a shifted copy fails.
    rng = np.random.default_rng(7)
    support = np.arange(-10, 11)
    pmf = np.exp(-np.abs(support) / 2.0)
    pmf /= pmf.sum()
    x = rng.choice(support, size=N_DRAWS, p=pmf)
    assert _chisq_pvalue(x, support, pmf) > P_MIN
    assert _chisq_pvalue(x + 1, support, pmf) <= P_MIN


# --------------------------------------------------------------------------------------------------
# NoiseSource: keyed, reproducible, secret
# --------------------------------------------------------------------------------------------------


SAMPLER_CALLS = {
    "laplace": lambda ns, *k: ns.laplace(*k, scale=1.0, size=5),
    "gaussian": lambda ns, *k: ns.gaussian(*k, sigma=1.0, size=5),
    "k_norm": lambda ns, *k: ns.k_norm(*k, scale=1.0, dim=5),
    "discrete_laplace": lambda ns, *k: ns.discrete_laplace(*k, scale=10.0, size=5),
    "discrete_gaussian": lambda ns, *k: ns.discrete_gaussian(*k, sigma=10.0, size=5),
}


@pytest.mark.parametrize("sampler", sorted(SAMPLER_CALLS))
def test_same_node_key_same_draws(sampler):
    call = SAMPLER_CALLS[sampler]
    a = call(NoiseSource(KEY), "stream-1", "tree", (0, 2, 5))
    b = call(NoiseSource(bytearray(KEY)), "stream-1", "tree", (0, 2, 5))  # new instance, same key
    c = call(NoiseSource(KEY), "stream-1", "tree", (0, 2, 5))
    assert a.shape == (5,)
    assert a.tobytes() == b.tobytes() == c.tobytes()


@pytest.mark.parametrize("sampler", sorted(SAMPLER_CALLS))
def test_different_node_keys_different_draws(sampler):
    call = SAMPLER_CALLS[sampler]
    ns = NoiseSource(KEY)
    base = call(ns, "stream-1", "tree", (0, 2, 5))
    variants = [
        call(ns, "stream-1", "tree", (0, 2, 6)),  # index
        call(ns, "stream-1", "tree", (0, 5, 2)),  # index order
        call(ns, "stream-1", "tree", (0, 2)),  # index length
        call(ns, "stream-1", "tree", (0, 2, 5, 0)),
        call(ns, "stream-1", "wtm", (0, 2, 5)),  # purpose
        call(ns, "stream-2", "tree", (0, 2, 5)),  # stream
        call(NoiseSource(bytes(reversed(KEY))), "stream-1", "tree", (0, 2, 5)),  # key
    ]
    for v in variants:
        assert not np.array_equal(base, v)


def test_generator_encoding_is_unambiguous():
    ns = NoiseSource(KEY)
    a = ns.generator("ab", "c", 1).standard_normal(4)
    b = ns.generator("a", "bc", 1).standard_normal(4)
    assert not np.array_equal(a, b)
    # The same generator key always restarts at the same point: replays see the same stream.
    g1, g2 = ns.generator("x", "y", 1, 2), ns.generator("x", "y", 1, 2)
    assert np.array_equal(g1.standard_normal(8), g2.standard_normal(8))


def test_long_keys_are_distinguished():
    # Keys over 64 bytes are hashed; two keys differing only at byte 100 must still differ.
    k1 = bytes(100) + b"\x01" + bytes(27)
    k2 = bytes(100) + b"\x02" + bytes(27)
    a = NoiseSource(k1).gaussian("s", "p", (1,), 1.0, 4)
    b = NoiseSource(k2).gaussian("s", "p", (1,), 1.0, 4)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("bad_key", [b"", b"x" * 15, "a" * 32, None, 12345])
def test_short_or_non_bytes_keys_refused(bad_key):
    with pytest.raises(ValueError):
        NoiseSource(bad_key)


def test_minimum_key_length_accepted():
    NoiseSource(b"k" * 16)


def test_repr_and_str_hide_key():
    key = b"SECRETKEY-" + bytes(range(200, 222))
    ns = NoiseSource(key)
    for text in (repr(ns), str(ns), f"{ns}"):
        assert key.hex() not in text
        assert repr(key) not in text
        assert "SECRETKEY" not in text


def test_noise_source_cannot_be_pickled():
    with pytest.raises(TypeError):
        pickle.dumps(NoiseSource(KEY))
    with pytest.raises(TypeError):
        pickle.dumps({"noise": NoiseSource(KEY)}, protocol=pickle.HIGHEST_PROTOCOL)


# ---- load_key / from_config ------------------------------------------------------------------


def test_load_key_from_raw_file(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    raw = bytes([0x00, 0xFF, 0x80, 0x0A] * 8)  # not ASCII hex, contains whitespace-like bytes
    path = tmp_path / "key.bin"
    path.write_bytes(raw)
    assert load_key(key_file=path) == raw
    assert load_key(key_file=str(path)) == raw


def test_load_key_from_hex_file(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    key = bytes(range(100, 132))
    path = tmp_path / "key.hex"
    path.write_text(key.hex() + "\n")
    assert load_key(key_file=path) == key
    path.write_text("  " + key.hex().upper() + "\r\n")
    assert load_key(key_file=path) == key


def test_load_key_file_wins_over_env(tmp_path, monkeypatch):
    file_key, env_key = bytes(range(32)), bytes(range(50, 82))
    path = tmp_path / "key.hex"
    path.write_text(file_key.hex())
    monkeypatch.setenv(KEY_ENV_VAR, env_key.hex())
    assert load_key(key_file=path) == file_key
    assert load_key() == env_key


def test_load_key_from_env(monkeypatch):
    key = bytes(range(7, 47))
    monkeypatch.setenv(KEY_ENV_VAR, key.hex())
    assert load_key() == key
    monkeypatch.setenv("MY_KEY", " " + key.hex() + "\n")
    assert load_key(env_var="MY_KEY") == key


@pytest.mark.parametrize("value", ["ab" * 15, "abc" * 11, "zz" * 16, "0" * 31])
def test_load_key_env_too_short_or_not_hex(monkeypatch, value):
    monkeypatch.setenv(KEY_ENV_VAR, value)
    with pytest.raises(ValueError):
        load_key()
    with pytest.raises(ValueError):
        NoiseSource.from_config()


def test_load_key_nothing_configured(monkeypatch):
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    assert load_key() is None
    assert load_key(env_var=None) is None


def test_from_config_without_key_warns_and_works(monkeypatch, caplog):
    monkeypatch.delenv(KEY_ENV_VAR, raising=False)
    with caplog.at_level(logging.WARNING, logger="beam_dp.core.noise"):
        ns1 = NoiseSource.from_config()
        ns2 = NoiseSource.from_config()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "beam_dp.core.noise"]
    assert len(warnings) == 2
    assert "random key" in warnings[0].getMessage()
    # It works, and two random keys give different noise.
    a = ns1.gaussian("s", "p", (1,), 1.0, 8)
    b = ns2.gaussian("s", "p", (1,), 1.0, 8)
    assert a.shape == (8,) and np.all(np.isfinite(a))
    assert not np.array_equal(a, b)


def test_from_config_with_key_is_reproducible_and_silent(monkeypatch, caplog, tmp_path):
    key = bytes(range(1, 33))
    monkeypatch.setenv(KEY_ENV_VAR, key.hex())
    with caplog.at_level(logging.DEBUG, logger="beam_dp.core.noise"):
        ns = NoiseSource.from_config()
        path = tmp_path / "k"
        path.write_bytes(key)  # raw bytes (contain no hex text)
        ns_file = NoiseSource.from_config(env_var=None, key_file=str(path))
    assert not caplog.records
    expected = NoiseSource(key).gaussian("s", "p", (1,), 1.0, 8)
    assert ns.gaussian("s", "p", (1,), 1.0, 8).tobytes() == expected.tobytes()
    assert ns_file.gaussian("s", "p", (1,), 1.0, 8).tobytes() == expected.tobytes()
    # The key is never logged, even at DEBUG.
    assert key.hex() not in caplog.text


# ---- ZeroNoise -----------------------------------------------------------------------------------


def test_zero_noise_returns_zeros_for_every_sampler():
    z = ZeroNoise()
    key = ("s", "tree", (0, 1, 2))
    assert np.array_equal(z.laplace(*key, 1.0, 4), np.zeros(4))
    assert np.array_equal(z.gaussian(*key, 1.0, 4), np.zeros(4))
    assert np.array_equal(z.k_norm(*key, 1.0, 3), np.zeros(3))
    dl = z.discrete_laplace(*key, 1.0, 5)
    dg = z.discrete_gaussian(*key, 1.0, 5)
    assert np.array_equal(dl, np.zeros(5)) and dl.dtype.kind == "i"
    assert np.array_equal(dg, np.zeros(5)) and dg.dtype.kind == "i"
    assert isinstance(z, NoiseSource)
    assert "test only" in repr(z)


# --------------------------------------------------------------------------------------------------
# Vectorised keyed cells (beam_dp.core.keyed_noise)
# --------------------------------------------------------------------------------------------------


def test_array_philox_equals_numpy_philox():
    """``philox4x64`` on arrays is numpy's Philox4x64-10: numpy's generator keyed ``k`` at counter ``c``
    returns block ``c + 1`` next (exact integer arithmetic, so compared bit for bit)."""
    rng = np.random.default_rng(11)
    counters = rng.integers(1, 2**63, (64, 4), dtype=np.uint64)
    counters[:, 1:] *= np.uint64(2)  # use the top bit of the other words too
    keys = rng.integers(0, 2**63, (64, 2), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    expected = np.empty((64, 4), dtype=np.uint64)
    for i in range(64):
        bitgen = np.random.Philox(key=0)
        before = counters[i] - np.array([1, 0, 0, 0], dtype=np.uint64)
        bitgen.state = {"bit_generator": "Philox", "state": {"counter": before, "key": keys[i]},
                        "buffer": np.zeros(4, np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
        expected[i] = bitgen.random_raw(4)
    assert np.array_equal(keyed_noise.philox4x64(counters, keys), expected)


LAW_SCALES = {"laplace": 0.5, "gaussian": 2.0, "k_norm": 1.5, "discrete_laplace": 3.0, "discrete_gaussian": 3.0}


@pytest.mark.parametrize("law", sorted(LAW_SCALES))
def test_cells_are_identical_whatever_the_grouping(law):
    """A cell's draw depends only on its own coordinates: one call for 40 cells (the array Philox), the
    same cells one by one (numpy's C Philox), in reverse order and as a subset give the same numbers."""
    ns = NoiseSource(KEY)
    streams = [f"s{i % 13}" for i in range(40)]
    index = np.stack([np.arange(40), np.arange(40) % 3, -np.arange(40)], axis=1)
    scale = LAW_SCALES[law]
    batch = ns.draw_cells(law, streams, "cells", index, scale, 7)
    single = np.stack([getattr(ns, law)(s, "cells", tuple(row), scale, 7) for s, row in zip(streams, index)])
    assert batch.shape == (40, 7)
    assert np.array_equal(batch, single)  # the same words and the same numpy code path per row
    reverse = ns.draw_cells(law, streams[::-1], "cells", index[::-1], scale, 7)
    assert np.array_equal(reverse[::-1], batch)
    part = ns.draw_cells(law, streams[5:30], "cells", index[5:30], scale, 7)
    assert np.array_equal(part, batch[5:30])
    shared = ns.draw_cells(law, streams[:9], "cells", (4, 5), scale, 7)
    assert np.array_equal(shared[3], getattr(ns, law)(streams[3], "cells", (4, 5), scale, 7))


def test_long_indices_keep_their_prefix_in_the_key():
    ns = NoiseSource(KEY)
    a = ns.draw_cells("gaussian", ["s"] * 6, "p", np.array([[1, 2, 3, 4]] * 3 + [[2, 2, 3, 4]] * 3), 1.0, 4)
    assert np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[3])
    assert np.array_equal(a[3], ns.gaussian("s", "p", (2, 2, 3, 4), 1.0, 4))


def test_cells_validation():
    ns = NoiseSource(KEY)
    with pytest.raises(ValueError, match="law"):
        ns.draw_cells("cauchy", ["s"], "p", (1,), 1.0, 3)
    with pytest.raises(ValueError, match="scale"):
        ns.draw_cells("gaussian", ["s"], "p", (1,), -1.0, 3)
    with pytest.raises(ValueError, match="index"):
        ns.draw_cells("gaussian", ["s", "t"], "p", np.zeros((3, 1), np.int64), 1.0, 3)


def test_test_doubles_overriding_one_cell_are_honoured_in_batches():
    assert np.array_equal(ZeroNoise().draw_cells("gaussian", ["a"] * 9, "p", (1,), 1.0, 3), np.zeros((9, 3)))


# Keyed cells across many streams: the laws of the draws (the same checks as for the Generator entry
# point above; one draw per cell, N_DRAWS cells, so the batch path itself is what is tested).
def _cells(law: str, scale: float, size: int, purpose: str) -> np.ndarray:
    streams = [f"user-{i}" for i in range(N_DRAWS)]
    return NoiseSource(KEY).draw_cells(law, streams, purpose, (3,), scale, size)


def test_keyed_cells_gaussian_law_and_half_sigma_fails():
    assert _gauss_ok(_cells("gaussian", 2.0, 1, "g")[:, 0], 2.0)
    assert not _gauss_ok(_cells("gaussian", 1.0, 1, "g-half")[:, 0], 2.0)


def test_keyed_cells_knorm_law_and_miscalibrated_fails():
    assert all(_knorm_checks(_cells("k_norm", 0.7, 3, "k"), 0.7).values())
    assert not _knorm_checks(_cells("k_norm", 1.1 * 0.7, 3, "k-1.1"), 0.7)["ks"]


def test_keyed_cells_laplace_and_discrete_laws_and_half_scale_fails():
    assert _laplace_ok(_cells("laplace", 1.0, 1, "l")[:, 0], 1.0)
    assert not _laplace_ok(_cells("laplace", 0.5, 1, "l-half")[:, 0], 1.0)
    assert _dlap_ok(_cells("discrete_laplace", 2.0, 1, "dl")[:, 0], 2.0)
    assert not _dlap_ok(_cells("discrete_laplace", 1.0, 1, "dl-half")[:, 0], 2.0)
    assert _dgauss_ok(_cells("discrete_gaussian", 3.0, 1, "dg")[:, 0], 3.0)
    assert not _dgauss_ok(_cells("discrete_gaussian", 1.5, 1, "dg-half")[:, 0], 3.0)


def test_cached_cell_keys_are_bounded_and_draw_what_fresh_keys_draw():
    """A group's stacked cell keys are cached up to ``MAX_CACHED_ROW_CELLS`` cells in all (then the
    cache starts over), and cached keys draw exactly what keys stacked afresh draw."""
    source = NoiseSource(bytes(range(32)))
    cells = source._cells
    cells.MAX_CACHED_ROW_CELLS = 10  # instance override: a tiny bound
    groups = [[f"s{i}" for i in range(start, start + 4)] for start in (0, 4, 8, 12)]
    first = [source.draw_cells("gaussian", g, "p", np.array([3]), 1.0, 2) for g in groups]
    assert 0 < cells._rows_cached <= 10 and len(cells._rows_cache) <= 2
    again = [source.draw_cells("gaussian", g, "p", np.array([3]), 1.0, 2) for g in groups]  # cached or restacked
    fresh = NoiseSource(bytes(range(32)))
    alone = [fresh.draw_cells("gaussian", [s], "p", np.array([3]), 1.0, 2)[0] for g in groups for s in g]
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
    np.testing.assert_array_equal(np.concatenate(first), np.stack(alone))
    assert cells._rows_cached <= 10


def test_long_cells_take_the_c_path_with_the_same_words():
    """Cells of many words (a DP-SGD gradient's noise) are drawn per cell by numpy's C Philox: the same
    words as the vectorised ``philox4x64`` path that short cells of large batches take (exact: integers)."""
    cells = keyed_noise.CellKeys(b"k" * 32)
    keys, heads = cells.cells(["s"] * 6, "p", np.arange(12, dtype=np.int64).reshape(6, 2))
    count = keyed_noise._LONG_CELL + 5
    long = cells.words(keys, heads, count, 1)
    blocks = -(-count // 4)
    counter = np.empty((6, blocks, 4), dtype=np.uint64)
    counter[:, :, 0] = np.arange(2, blocks + 2, dtype=np.uint64)[None, :]
    counter[:, :, 1:] = heads[:, None, :]
    vectorised = keyed_noise.philox4x64(counter, keys[:, None, :]).reshape(6, -1)[:, :count]
    assert np.array_equal(long, vectorised)
