"""Spend of the ERM family's calls that are not a sum of noise terms (account kind ``"erm_sampled_k_norm"``),
and dp-accounting's PLD composition of Gaussian charges (an independent check of the composition the
Gaussian variant uses).

``sampled_k_norm_loss`` is the cost of a K-norm call on a Bernoulli(p) sample of its members (the
sampling variants); every call is charged with it, and the verifier recomputes a release's sampled
calls with it. Units: ε in nats, sensitivities and scales in the model's L2 norm.
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["pld_epsilon", "sampled_k_norm_loss"]


def pld_epsilon(mus: Iterable[float], delta: float, value_discretization_interval: float = 1e-4) -> float:
    """ε at ``delta`` of the composition of Gaussian mechanisms with ``μ_i = Δ_i/σ_i`` (dp-accounting PLD)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=value_discretization_interval)
    for mu in mus:
        if mu > 0:
            accountant.compose(dp_event.GaussianDpEvent(1.0 / mu))
    return float(accountant.get_epsilon(delta))


def sampled_k_norm_loss(*, sensitivity: float, scale: float, p: float, count: float = 1.0) -> tuple[float, float]:
    """``(ε, 0)`` of ``count`` K-norm output perturbations of scale ``b = scale`` at L2 sensitivity
    ``Δ = sensitivity``, each on an independent Bernoulli(``p``) sample of the members (amplification
    by sampling): ``count·ln(1 + p(e^{Δ/b} − 1))``; ``p = 1`` is the unsampled ``Δ/b``.
    ``ValueError`` out of range (the verifier's account ``erm_sampled_k_norm``)."""
    if not (math.isfinite(sensitivity) and sensitivity > 0 and math.isfinite(scale) and scale > 0
            and 0 < p <= 1 and math.isfinite(count) and count >= 0 and count == int(count)):
        raise ValueError(f"a sampled K-norm account needs sensitivity > 0, scale > 0, 0 < p <= 1 and a whole "
                         f"count >= 0, got ({sensitivity}, {scale}, {p}, {count})")
    return count * math.log1p(p * math.expm1(sensitivity / scale)), 0.0
