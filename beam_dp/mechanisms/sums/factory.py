"""``make_counter``: one continual prefix-sum mechanism by name (what ``ContinualSum(counter=...)`` uses).

==============  ==========================================  ===================  ====================
counter         mechanism                                   noise                horizon
==============  ==========================================  ===================  ====================
``"tree"``      ``make_tree_sum`` (binary / hybrid /        gamma or gaussian    ``horizon`` known →
                doubling, ``tree.py``)                                           binary, else
                                                                                 ``unbounded``
``"honaker"``   binary tree + online Honaker estimation     gamma or gaussian    tunes the depth only
``"toeplitz"``  square-root Toeplitz factorization          gaussian             required
``"blt"``       4-buffer BLT factorization                  gaussian             ``None`` = unbounded
                                                                                 mode
``"kary"``      fitted k-ary Honaker tree                   gamma (pure ε)       tunes the fit only
``"auto"``      ``"blt"`` for gaussian, ``"kary"`` for
                gamma (the measured winners), ``"tree"``
                for discrete_laplace
==============  ==========================================  ===================  ====================

``noise="discrete_laplace"`` (integer-valued counts, pure ε; dim 1, integer ``clip_bound``) is
implemented by the trees only: ``"auto"`` means ``"tree"`` and any other counter is refused.

For every counter but ``"tree"``, a ``horizon`` of ``None`` falls back to ``public_end`` (a public last
step such as the clock's end) when given, else to the counter's unbounded mode. ``calibration``
applies to ``"tree"`` only (the papers' closed-form sigma); the other counters always calibrate
exactly (analytic Gaussian, exact K-norm).
"""

from __future__ import annotations

from typing import Any

from beam_dp.mechanisms.base import ContinualSumMechanism
from beam_dp.mechanisms.sums.blt import BLTSum
from beam_dp.mechanisms.sums.blt_math import ERRORS
from beam_dp.mechanisms.sums.fitted_params import UNBOUNDED_FIT_HORIZON
from beam_dp.mechanisms.sums.honaker import HonakerTreeSum
from beam_dp.mechanisms.sums.pure import KaryTreeSum
from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtSum
from beam_dp.mechanisms.sums.tree import make_tree_sum

__all__ = ["COUNTERS", "make_counter", "resolve_counter"]

COUNTERS = ("auto", "tree", "honaker", "toeplitz", "blt", "kary")


def resolve_counter(counter: str, noise: str) -> str:
    """The concrete counter name ``"auto"`` stands for under ``noise``."""
    if counter not in COUNTERS:
        raise ValueError(f"counter must be one of {COUNTERS}, got {counter!r}")
    if noise == "discrete_laplace":
        if counter not in ("auto", "tree"):
            raise ValueError(f"discrete_laplace noise is implemented by counter='tree' only, got {counter!r}")
        return "tree"
    if counter != "auto":
        return counter
    return "blt" if noise == "gaussian" else "kary"


def make_counter(
    counter: str = "auto",
    *,
    horizon: int | None = None,
    unbounded: str = "hybrid",
    public_end: int | None = None,
    noise: str = "gamma",
    calibration: str = "paper",
    blt_error: str = "max",
    **kwargs: Any,
) -> ContinualSumMechanism:
    """Build the counter ``counter`` (see the module table). ``blt_error``: the BLT's fit, ``"max"``
    (minimal max per-step variance) or ``"mean"`` (minimal mean variance over the horizon); ``"mean"``
    is refused for any other counter. ``kwargs``: ``dim``, ``epsilon``, ``delta``, ``clip_bound`` or
    ``sensitivity``, ``purpose``."""
    name = resolve_counter(counter, noise)
    if blt_error not in ERRORS:
        raise ValueError(f"blt_error must be one of {ERRORS}, got {blt_error!r}")
    if blt_error != "max" and name != "blt":
        raise ValueError(f"blt_error={blt_error!r} selects a BLT fit, but the counter is {name!r} "
                         f"(counter='blt', or 'auto' with noise='gaussian')")
    if name == "tree":
        return make_tree_sum(horizon=horizon, unbounded=unbounded, noise=noise, calibration=calibration, **kwargs)
    horizon = horizon if horizon is not None else public_end
    if name == "honaker":
        levels = (horizon if horizon is not None else UNBOUNDED_FIT_HORIZON).bit_length()
        return HonakerTreeSum(arity=2, levels=levels, noise=noise, **kwargs)
    if name == "toeplitz":
        return ToeplitzSqrtSum(horizon=horizon, noise=noise, **kwargs)
    if name == "blt":
        return BLTSum(horizon=horizon, noise=noise, error=blt_error, **kwargs)
    return KaryTreeSum(horizon=horizon, noise=noise, **kwargs)
