"""Continual-learning metrics (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning"): average accuracy, forgetting, p-values.

``acc[l, t]`` is the test accuracy on task t after training task l (0-based here; rows l < t may
hold anything, they are not read by the average accuracy).
"""

from __future__ import annotations

import numpy as np

__all__ = ["average_accuracy", "average_forgetting", "curve_p_value", "forgetting"]


def _matrix(acc) -> np.ndarray:
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"expected a square accuracy matrix, got shape {a.shape}")
    return a


def average_accuracy(acc) -> np.ndarray:
    """``A_τ = (1/τ) Σ_{t≤τ} a_{τ,t}`` for τ = 1..m."""
    a = _matrix(acc)
    m = a.shape[0]
    return np.array([a[tau, : tau + 1].mean() for tau in range(m)])


def forgetting(acc, tau: int | None = None) -> np.ndarray:
    """``f_t^τ = max_{l<τ} (a_{l,t} − a_{τ,t})`` for t < τ (τ 0-based; default the last task)."""
    a = _matrix(acc)
    tau = a.shape[0] - 1 if tau is None else tau
    if tau < 1:
        return np.zeros(0)
    return a[:tau, :tau].max(axis=0) - a[tau, :tau]


def average_forgetting(acc, tau: int | None = None) -> float:
    """``F_τ = (1/(τ−1)) Σ_{t<τ} f_t^τ`` (0 after the first task)."""
    f = forgetting(acc, tau)
    return float(f.mean()) if f.size else 0.0


def curve_p_value(curve_a, curve_b) -> float:
    """Two-sided two-sample Student t-test (equal variances) between two average-accuracy curves."""
    from scipy import stats  # on first use: scipy.stats costs ~0.5 s of start-up

    return float(stats.ttest_ind(np.asarray(curve_a, float), np.asarray(curve_b, float), equal_var=True).pvalue)
