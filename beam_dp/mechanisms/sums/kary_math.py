"""Exact arithmetic of k-ary trees with online Honaker estimation, and the fit of the pure-ε one.

A k-ary tree with ``L`` levels (``HonakerTreeSum``) releases at step ``t`` the sum of the estimates of
``d_ℓ(t)`` completed nodes of each level ``ℓ`` (:func:`kary_digits`: the base-``k`` digits of ``t``, the top
one unbounded), whose variances ``v_ℓ`` follow from the node noise variances by the bottom-up Honaker
combination (:func:`honaker_variances`), so ``noise_var(t) = Σ_ℓ d_ℓ(t) v_ℓ`` exactly.

:func:`fit_kary` picks, for a horizon ``T``, the arity ``k``, the number of levels ``L`` and the per-level
budget shares ``w`` of the pure-ε tree (K-norm noise; node variance ``∝ 1/w_ℓ²``) that minimise the
exact max per-step variance ``max_{t<=T} Σ_ℓ d_ℓ(t) v_ℓ``: :func:`kary_max_variance` gives that max in
O(L²) by a digit argument, so the search over ``k ∈ [2, 16]``, ``L ∈ {L_full − 1, L_full}`` and ``w``
(scipy Nelder–Mead over softmax shares) is exact and fast. The fit only tunes accuracy: every share
vector gives the same guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["KaryFit", "fit_kary", "honaker_variances", "kary_digits", "kary_max_variance", "pure_estimate_vars"]


@dataclass(frozen=True)
class KaryFit:
    """Arity, levels and per-level budget shares of a fitted k-ary Honaker tree."""

    arity: int
    levels: int
    weights: tuple[float, ...]


def kary_digits(t: np.ndarray | int, arity: int, levels: int) -> np.ndarray:
    """Digits ``d_ℓ(t)``, shape ``(levels, len(t))``: base-``arity`` digits of ``t`` for ``ℓ < levels−1``
    and the unbounded top digit ``⌊t/arity^{levels−1}⌋``. Vectorised over ``t``."""
    rest = np.atleast_1d(np.asarray(t, dtype=np.int64)).copy()
    out = np.empty((levels, rest.size), dtype=np.int64)
    for level in range(levels - 1):
        out[level] = rest % arity
        rest //= arity
    out[levels - 1] = rest
    return out


def honaker_variances(node_vars: Sequence[float], arity: int) -> np.ndarray:
    """Variances ``v_ℓ`` of the bottom-up Honaker node estimates from the node noise variances
    ``σ_ℓ²`` (``inf`` for a level without noise; level 0 must be finite)."""
    v = np.empty(len(node_vars))
    for level, s2 in enumerate(node_vars):
        if level == 0:
            v[0] = s2
        elif math.isinf(s2):
            v[level] = arity * v[level - 1]
        else:
            v[level] = 1.0 / (1.0 / s2 + 1.0 / (arity * v[level - 1]))
    return v


def _top_digits(horizon: int, arity: int, levels: int) -> list[int]:
    digits, rest = [], horizon
    for _ in range(levels - 1):
        digits.append(rest % arity)
        rest //= arity
    return digits + [rest]


def kary_max_variance(horizon: int, arity: int, levels: int, estimate_vars: np.ndarray) -> float:
    """``max_{1<=t<=T} Σ_ℓ d_ℓ(t) v_ℓ`` exactly, for ``v >= 0``: the max is ``T`` itself or, for a
    non-zero digit ``p`` of ``T``, ``T``'s digits above ``p``, ``d_p − 1`` at ``p`` and ``k−1`` below."""
    digits = _top_digits(horizon, arity, levels)
    v = np.asarray(estimate_vars, float)
    best = float(np.dot(digits, v))
    for p in range(levels):
        if digits[p] > 0:
            cand = float(np.dot(digits[p + 1:], v[p + 1:])) + (digits[p] - 1) * v[p] + (arity - 1) * v[:p].sum()
            best = max(best, cand)
    return best


def pure_estimate_vars(weights: np.ndarray, arity: int) -> np.ndarray:
    """Honaker variances of the pure-ε tree with shares ``weights``, in units of ``(d+1)(Δ₂/ε)²``:
    node variance ``1/w_ℓ²`` (a level with share 0 has no noise)."""
    with np.errstate(divide="ignore"):
        return honaker_variances(np.where(weights > 0, 1.0 / weights**2, np.inf), arity)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def fit_kary(horizon: int, max_arity: int = 16) -> tuple[KaryFit, float]:
    """The fitted tree for ``horizon`` and its max variance in units of ``(d+1)(Δ₂/ε)²``."""
    if horizon < 1:
        raise ValueError("horizon must be >= 1")
    best: tuple[float, KaryFit] | None = None
    from scipy.optimize import minimize  # on first use (a fit not in the table): ~0.3 s of start-up

    for arity in range(2, max_arity + 1):
        full = 1
        while arity ** (full - 1) < horizon:
            full += 1
        for levels in range(max(1, full - 1), full + 1):
            def objective(x: np.ndarray) -> float:
                return kary_max_variance(horizon, arity, levels, pure_estimate_vars(_softmax(x), arity))

            run = minimize(objective, np.linspace(0.0, -1.0, levels), method="Nelder-Mead",
                           options={"maxiter": 400 * levels, "xatol": 1e-7, "fatol": 1e-10})
            if best is None or run.fun < best[0]:
                weights = tuple(float(w) for w in np.round(_softmax(run.x), 12))
                best = (float(run.fun), KaryFit(arity, levels, weights))
    fit = best[1]
    return fit, kary_max_variance(horizon, fit.arity, fit.levels, pure_estimate_vars(np.asarray(fit.weights), fit.arity))
