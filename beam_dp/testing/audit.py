"""Empirical privacy audits: a high-confidence *lower bound* on epsilon from neighbouring runs.

Run a mechanism many times on a pair of neighbouring inputs D, D' (fresh noise each run), reduce
each run's releases to a scalar statistic, and test thresholds: for a rejection set
``S = {stat >= tau}`` (and its mirror), ``(epsilon, delta)``-DP implies
``P_D[S] <= e^epsilon P_D'[S] + delta``. With Clopper–Pearson bounds ``p_lo`` on ``P_D[S]`` and
``q_hi`` on ``P_D'[S]`` (Bonferroni-corrected over all thresholds and both directions),
``epsilon >= ln((p_lo - delta) / q_hi)`` holds with the stated confidence. A correct mechanism's
bound stays below its claim; a mechanism with too little noise exceeds it.

Thresholds are chosen on a first half of the samples and evaluated on the second half, so the
selection does not bias the bound.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import stats

__all__ = ["AuditResult", "epsilon_lower_bound", "run_audit"]


class AuditResult(tuple):
    """``(epsilon_lower_bound, threshold, direction)``."""

    @property
    def epsilon(self) -> float:
        return self[0]


def _cp_lower(k: int, n: int, alpha: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def _cp_upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def _best_threshold(a: np.ndarray, b: np.ndarray, candidates: np.ndarray) -> tuple[float, float]:
    """Threshold maximising the plug-in ln(P_a[x>=t] / P_b[x>=t]) with at least 30 hits in b."""
    a_sorted, b_sorted = np.sort(a), np.sort(b)
    pa = 1.0 - np.searchsorted(a_sorted, candidates, side="left") / len(a)
    hits_b = len(b) - np.searchsorted(b_sorted, candidates, side="left")
    ok = hits_b >= 30
    if not ok.any():
        return float(candidates[0]), -math.inf
    ratio = np.where(ok, np.log(np.maximum(pa, 1e-300)) - np.log(np.maximum(hits_b, 1) / len(b)), -np.inf)
    i = int(np.argmax(ratio))
    return float(candidates[i]), float(ratio[i])


def epsilon_lower_bound(
    stat_d: np.ndarray, stat_d_prime: np.ndarray, delta: float = 0.0, confidence: float = 0.95
) -> AuditResult:
    """Lower bound on epsilon (with probability ``confidence``) from statistic samples under D and D'."""
    x, y = np.asarray(stat_d, dtype=float), np.asarray(stat_d_prime, dtype=float)
    hx, hy = len(x) // 2, len(y) // 2
    candidates = np.quantile(np.concatenate([x[:hx], y[:hy]]), np.linspace(0.001, 0.999, 400))
    best = AuditResult((0.0, float("nan"), ""))
    tests = []
    for direction, (a_sel, b_sel, a_ev, b_ev) in {
        "D>=t": (x[:hx], y[:hy], x[hx:], y[hy:]),
        "D'>=t": (y[:hy], x[:hx], y[hy:], x[hx:]),
        "D<=t": (-x[:hx], -y[:hy], -x[hx:], -y[hy:]),
        "D'<=t": (-y[:hy], -x[:hx], -y[hy:], -x[hx:]),
    }.items():
        cand = candidates if not direction.endswith("<=t") else -candidates[::-1]
        tau, _ = _best_threshold(a_sel, b_sel, cand)
        tests.append((direction, tau, int(np.sum(a_ev >= tau)), len(a_ev), int(np.sum(b_ev >= tau)), len(b_ev)))
    alpha = (1 - confidence) / len(tests)  # Bonferroni over the four one-sided tests
    for direction, tau, ka, na, kb, nb in tests:
        p_lo, q_hi = _cp_lower(ka, na, alpha), _cp_upper(kb, nb, alpha)
        if p_lo - delta > 0 and q_hi > 0:
            eps = math.log((p_lo - delta) / q_hi)
            if eps > best[0]:
                best = AuditResult((eps, tau, direction))
    return best


def run_audit(
    run: Callable[[bool, int], float], runs: int, delta: float = 0.0, confidence: float = 0.95
) -> AuditResult:
    """``run(neighbour, seed) -> statistic`` for ``seed in range(runs)`` on D (False) and D' (True)."""
    d = np.array([run(False, seed) for seed in range(runs)])
    d_prime = np.array([run(True, seed) for seed in range(runs)])
    return epsilon_lower_bound(d, d_prime, delta, confidence)
