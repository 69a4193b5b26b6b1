"""Exact calibration of the Gaussian mechanism (Balle & Wang 2018, "analytic Gaussian").

A Gaussian mechanism with L2 sensitivity ``sens`` and noise ``N(0, sigma^2 I)`` has
``mu = sens / sigma``. It is (epsilon, delta)-DP exactly when

    delta_A(epsilon; mu) = Phi(mu/2 - epsilon/mu) - e^epsilon * Phi(-mu/2 - epsilon/mu) <= delta.

Everything here is evaluated in log space with ``scipy.special.log_ndtr`` so that it stays
accurate for large epsilon and tiny delta. The two closed-form calibrations quoted by the papers
(``sigma_window_002``, ``sigma_tree_004``) are kept for fidelity and must be certified with
:func:`certify_gaussian` before use.
"""

from __future__ import annotations

import math
from typing import Generator

import numpy as np
from scipy.special import log_ndtr

from beam_dp.core.paced import run_to_end

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_epsilons",
    "analytic_gaussian_epsilons_paced",
    "analytic_gaussian_sigma",
    "certify_gaussian",
    "sigma_tree_004",
    "sigma_window_002",
]


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_delta(delta: float) -> None:
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in (0, 1) for a Gaussian mechanism, got {delta!r}")


def analytic_gaussian_delta(epsilon: float, mu: float) -> float:
    """Smallest delta for which a Gaussian mechanism with ``mu = sens/sigma`` is (epsilon, delta)-DP."""
    if mu <= 0:
        return 0.0
    a = log_ndtr(mu / 2.0 - epsilon / mu)
    b = epsilon + log_ndtr(-mu / 2.0 - epsilon / mu)
    if b >= a:  # numerically zero
        return 0.0
    # exp(a) - exp(b) = exp(a) * (1 - exp(b - a))
    return float(math.exp(a) * -math.expm1(b - a))


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 with ``analytic_gaussian_delta(epsilon, mu) <= delta`` (bisection, rel. tol 1e-12)."""
    _check_delta(delta)
    if mu <= 0:
        return 0.0
    if analytic_gaussian_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while analytic_gaussian_delta(hi, mu) > delta:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError(f"no finite epsilon reaches delta={delta} for mu={mu}")
    lo = 0.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if analytic_gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def analytic_gaussian_epsilons(mu: np.ndarray, delta: float) -> np.ndarray:
    """``analytic_gaussian_epsilon`` of every entry of ``mu`` in one vectorised bisection (the same
    bracket, halvings and tolerance per entry; agrees with the scalar to its tolerance 1e-12)."""
    return run_to_end(analytic_gaussian_epsilons_paced(mu, delta))


def analytic_gaussian_epsilons_paced(mu: np.ndarray, delta: float) -> Generator[None, None, np.ndarray]:
    """``analytic_gaussian_epsilons`` as a paced computation (``beam_dp.core.paced``): it yields after
    each vectorised evaluation of ``delta_A`` (one bracket doubling or one halving: O(len(mu))) and
    returns the epsilons. Each entry's result does not depend on the other entries or on the pacing."""
    _check_delta(delta)
    mu = np.asarray(mu, dtype=np.float64)
    m = np.where(mu > 0, mu, 1.0)  # placeholders for mu <= 0 (epsilon 0), masked out below

    def deltas(eps: np.ndarray) -> np.ndarray:
        a = log_ndtr(m / 2.0 - eps / m)
        b = eps + log_ndtr(-m / 2.0 - eps / m)
        return np.where(b >= a, 0.0, np.exp(a) * -np.expm1(np.minimum(b - a, 0.0)))

    live = (mu > 0) & (deltas(np.zeros_like(m)) > delta)
    yield
    hi = np.ones_like(m)
    over = live & (deltas(hi) > delta)
    yield
    while over.any():
        hi = np.where(over, 2.0 * hi, hi)
        if np.any(hi > 1e6):
            raise ValueError(f"no finite epsilon reaches delta={delta} for mu={float(mu[hi > 1e6].max())}")
        over &= deltas(hi) > delta
        yield
    lo = np.zeros_like(m)
    active = live & (hi - lo > 1e-12 * hi)
    while active.any():
        mid = 0.5 * (lo + hi)
        up = deltas(mid) > delta
        lo, hi = np.where(active & up, mid, lo), np.where(active & ~up, mid, hi)
        active &= hi - lo > 1e-12 * hi
        yield
    return np.where(live, hi, 0.0)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float, rel_tol: float = 1e-9) -> float:
    """Smallest sigma such that N(0, sigma^2) noise on an L2-``sensitivity`` query is (epsilon, delta)-DP."""
    _check_positive("epsilon", epsilon)
    _check_delta(delta)
    _check_positive("sensitivity", sensitivity)
    # delta_A decreases as sigma grows (mu shrinks). Bracket then bisect on sigma.
    lo, hi = sensitivity * 1e-3, sensitivity
    while analytic_gaussian_delta(epsilon, sensitivity / hi) > delta:
        lo, hi = hi, hi * 2.0
    while analytic_gaussian_delta(epsilon, sensitivity / lo) <= delta:
        lo /= 2.0
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if analytic_gaussian_delta(epsilon, sensitivity / mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def sigma_window_002(epsilon: float, delta: float, sensitivity: float, levels: int) -> float:
    """Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" (eq. 13/16): sigma^2 = 8 D^2 L^2 ln^2(2/delta) / epsilon^2. Certify before use."""
    _check_positive("epsilon", epsilon)
    _check_delta(delta)
    _check_positive("sensitivity", sensitivity)
    return math.sqrt(8.0 * sensitivity**2 * levels**2 * math.log(2.0 / delta) ** 2 / epsilon**2)


def sigma_tree_004(epsilon: float, delta: float, sensitivity: float, levels: int) -> float:
    """Kasiviswanathan, Nissim & Jin, "Private Incremental Regression" (Alg. 4 line 8): sigma^2 = 2 L^2 D^2 ln(2/delta) / epsilon^2. Certify before use."""
    _check_positive("epsilon", epsilon)
    _check_delta(delta)
    _check_positive("sensitivity", sensitivity)
    return math.sqrt(2.0 * levels**2 * sensitivity**2 * math.log(2.0 / delta) / epsilon**2)


def certify_gaussian(sigma: float, sensitivity: float, levels: int, epsilon: float, delta: float) -> float:
    """Check that node noise ``sigma`` on a tree whose steps lie in ``levels`` nodes is (epsilon, delta)-DP.

    One element moves each of at most ``levels`` node values by ``sensitivity`` in L2, so the joint
    vector of node values is one Gaussian mechanism with sensitivity ``sensitivity * sqrt(levels)``.
    Returns ``delta_A``; raises ``ValueError`` when it exceeds ``delta``.
    """
    mu = sensitivity * math.sqrt(levels) / sigma
    achieved = analytic_gaussian_delta(epsilon, mu)
    if achieved > delta:
        raise ValueError(
            f"Gaussian noise sigma={sigma:.6g} is not ({epsilon}, {delta})-DP for a step in {levels} nodes "
            f"of sensitivity {sensitivity}: the exact (analytic) delta is {achieved:.3g} > {delta}. "
            "Use calibration='analytic' to compute the smallest valid sigma."
        )
    return achieved
