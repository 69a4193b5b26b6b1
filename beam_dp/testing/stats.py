"""Statistical checks used by the calibration tests.

Each check returns ``True``/``False`` rather than asserting, so a test can assert that the real
mechanism passes *and* that a deliberately mis-calibrated one fails (the negative control).
Tolerances come from the sampling distribution of the statistic: standard errors estimated from
the samples themselves, or exact chi-square quantiles for Gaussian variances.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["covariance_matches", "gaussian_variance_matches", "mean_matches"]


def mean_matches(samples: np.ndarray, expected: float | np.ndarray, n_se: float = 4.0, axis: int = 0) -> bool:
    """Sample mean within ``n_se`` standard errors (sample std / sqrt(n)) of ``expected`` (all entries)."""
    samples = np.asarray(samples, dtype=np.float64)
    n = samples.shape[axis]
    mean = samples.mean(axis=axis)
    se = samples.std(axis=axis, ddof=1) / np.sqrt(n)
    return bool(np.all(np.abs(mean - expected) <= n_se * se))


def gaussian_variance_matches(samples: np.ndarray, variance: float, confidence: float = 0.999) -> bool:
    """Sample variance of i.i.d. N(0, variance) draws (mean known = 0) inside the two-sided chi-square
    interval: sum(x²)/variance ~ chi²(n)."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    statistic = float(np.sum(x**2) / variance)
    lo, hi = stats.chi2.ppf([(1 - confidence) / 2, (1 + confidence) / 2], df=n)
    return bool(lo <= statistic <= hi)


def covariance_matches(errors: np.ndarray, expected: np.ndarray, n_se: float = 5.0) -> bool:
    """Empirical covariance (mean known = 0) of ``errors`` (runs, T) within ``n_se`` standard errors of
    ``expected`` (T, T), entrywise; the SE of each entry is std(e_t e_u)/sqrt(runs)."""
    e = np.asarray(errors, dtype=np.float64)
    runs = e.shape[0]
    products = e[:, :, None] * e[:, None, :]
    cov = products.mean(axis=0)
    se = products.std(axis=0, ddof=1) / np.sqrt(runs)
    # an entry with (numerically) zero SE must match to rounding
    return bool(np.all(np.abs(cov - expected) <= n_se * se + 1e-12 * (1 + np.abs(expected))))
