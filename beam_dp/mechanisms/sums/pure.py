"""Pure-ε counter: k-ary Honaker tree with fitted arity, depth and per-level budgets (``"kary_tree"``).

The mechanism is :class:`~beam_dp.mechanisms.sums.honaker.HonakerTreeSum` with K-norm noise
(pure ε-DP under the L2 bound, ``Δ₂ = 2R``): each step lies in one node per level, level ``ℓ`` spends
``w_ℓ ε`` per node, so every element spends at most ``Σ_ℓ w_ℓ ε = ε`` forever (exact L1/K-norm
accounting; the guarantee does not depend on the horizon). For a horizon ``T`` the arity ``k``, the
number of levels ``L`` and the shares ``w`` are chosen to minimise the exact max per-step variance
``max_{t<=T} Σ_ℓ d_ℓ(t) v_ℓ`` (digits ``d_ℓ``, Honaker estimate variances ``v_ℓ``): a digit argument
gives the max over ``t <= T`` in O(L²), so the search over ``k ∈ [2, 16]``, ``L ∈ {L_full − 1, L_full}`` and ``w`` (scipy
Nelder–Mead over softmax shares; :mod:`.kary_math`) is exact and fast. The horizon only tunes accuracy: past it the
top level keeps adding nodes and the variance grows linearly in ``t/k^{L−1}``.

Candidates measured and dropped (``docs/sums.md``): the plain k-ary tree with uniform budgets
and the smooth binary mechanism (Andersson–Pagh 2023) both stay well above this one.

Fitted parameters for powers of two are shipped in :mod:`.fitted_params` so that every worker gets
the same parameters (hence the same noise) without running an optimiser; other horizons use the
entry of the next power of two.
"""

from __future__ import annotations

from typing import Any

from beam_dp.core.limits import check_count
from beam_dp.mechanisms.base import SumSpec
from beam_dp.mechanisms.sums.honaker import HonakerTreeSum
from beam_dp.mechanisms.sums.kary_math import KaryFit
from beam_dp.mechanisms.sums.tree import MAX_STEP

__all__ = ["KaryTreeSum"]


class KaryTreeSum(HonakerTreeSum):
    """Pure-ε k-ary Honaker tree fitted for ``horizon`` (``None``: the unbounded-mode fit, see
    :data:`~beam_dp.mechanisms.sums.fitted_params.UNBOUNDED_FIT_HORIZON`). Guarantee: ``epsilon``-DP,
    event level (replace one contribution), forever. ``fit=`` overrides the table."""

    name = "kary_tree"

    noise_laws = ("gamma",)

    def __init__(self, spec: SumSpec | None = None, /, *, horizon: int | None = None, fit: KaryFit | None = None,
                 purpose: str = "kary", **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as
                keywords); ``noise="gamma"`` only.
            horizon: the public last step the shipped fit is chosen for, in ``[1, 2**62]``, or None.
            fit: a :class:`~.kary_math.KaryFit` overriding the table.
            purpose: the noise purpose.
        """
        from beam_dp.mechanisms.sums.fitted_params import kary_fit_for

        self.horizon = None if horizon is None else check_count("horizon", horizon, 1, MAX_STEP)
        fit = fit if fit is not None else kary_fit_for(self.horizon)
        super().__init__(spec, arity=fit.arity, levels=fit.levels, level_weights=fit.weights, purpose=purpose, **given)

    def _step_meta(self, t: int, completed: int) -> dict:
        return {**super()._step_meta(t, completed), "fit_horizon": self.horizon}

