"""Pure-ε counter: k-ary Honaker tree with fitted arity, depth and per-level budgets (``"kary_tree"``).

The mechanism is :class:`~beam_dp.mechanisms.sums.honaker.HonakerTreeSum` with K-norm noise
(pure ε-DP under the L2 bound, ``Δ₂ = 2R``): each step lies in one node per level, level ``ℓ`` spends
``w_ℓ ε`` per node, so every element spends at most ``Σ_ℓ w_ℓ ε = ε`` forever (exact L1/K-norm
accounting; the guarantee does not depend on the horizon). For a horizon ``T`` the arity ``k``, the
number of levels ``L`` and the shares ``w`` are chosen to minimise the exact max per-step variance
``max_{t<=T} Σ_ℓ d_ℓ(t) v_ℓ`` (digits ``d_ℓ``, Honaker estimate variances ``v_ℓ``): a digit argument
gives the max over ``t <= T`` in O(L²), so the search over ``k ∈ [2, 16]``, ``L ∈ {L_full − 1, L_full}`` and ``w`` (scipy
Nelder–Mead over softmax shares) is exact and fast. The horizon only tunes accuracy: past it the
top level keeps adding nodes and the variance grows linearly in ``t/k^{L−1}``.

Candidates measured and dropped (``docs/counters.md``): the plain k-ary tree with uniform budgets
and the smooth binary mechanism (Andersson–Pagh 2023) both stay well above this one.

Fitted parameters for powers of two are shipped in :mod:`.fitted_params` so that every worker gets
the same parameters (hence the same noise) without running an optimiser; other horizons use the
entry of the next power of two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from beam_dp.mechanisms.sums.honaker import HonakerTreeSum, honaker_variances

__all__ = ["KaryFit", "KaryTreeSum", "fit_kary", "kary_max_variance"]


@dataclass(frozen=True)
class KaryFit:
    """Arity, levels and per-level budget shares of a fitted k-ary Honaker tree."""

    arity: int
    levels: int
    weights: tuple[float, ...]


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


def _pure_estimate_vars(weights: np.ndarray, arity: int) -> np.ndarray:
    """Honaker variances in units of ``(d+1)(Δ₂/ε)²``: node variance ``1/w_ℓ²``."""
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
                return kary_max_variance(horizon, arity, levels, _pure_estimate_vars(_softmax(x), arity))

            run = minimize(objective, np.linspace(0.0, -1.0, levels), method="Nelder-Mead",
                           options={"maxiter": 400 * levels, "xatol": 1e-7, "fatol": 1e-10})
            if best is None or run.fun < best[0]:
                weights = tuple(float(w) for w in np.round(_softmax(run.x), 12))
                best = (float(run.fun), KaryFit(arity, levels, weights))
    fit = best[1]
    return fit, kary_max_variance(horizon, fit.arity, fit.levels, _pure_estimate_vars(np.asarray(fit.weights), fit.arity))


class KaryTreeSum(HonakerTreeSum):
    """Pure-ε k-ary Honaker tree fitted for ``horizon`` (``None``: the unbounded-mode fit, see
    :data:`~beam_dp.mechanisms.sums.fitted_params.UNBOUNDED_FIT_HORIZON`). Guarantee: ``epsilon``-DP,
    event level (replace one contribution), forever. ``fit=`` overrides the table."""

    name = "kary_tree"

    def __init__(self, *, horizon: int | None = None, fit: KaryFit | None = None, purpose: str = "kary", **kwargs) -> None:
        from beam_dp.mechanisms.sums.fitted_params import kary_fit_for

        if kwargs.get("noise", "gamma") != "gamma":
            raise ValueError("kary_tree is the pure-epsilon counter: use noise='gamma' (K-norm)")
        fit = fit if fit is not None else kary_fit_for(horizon)
        self.horizon = horizon
        super().__init__(arity=fit.arity, levels=fit.levels, level_weights=fit.weights, purpose=purpose, **kwargs)

    def _step_meta(self, t: int, completed: int) -> dict:
        return {**super()._step_meta(t, completed), "fit_horizon": self.horizon}

