"""Re-deriving per-element spend from the release log, and dp-accounting cross-checks.

``spend_from_log`` rebuilds each position's loss from the training events carried in the release
meta: an event charges every position of its member ranges ``ε_event`` (pure) or a
Gaussian ``μ``; charges add (pure) or compose exactly into one Gaussian (μ² add). It uses the core
:class:`~beam_dp.core.PrivacyLedger`, so the release log alone proves each element's spend.

``pld_epsilon`` composes a list of Gaussian charges with dp-accounting's PLD accountant (an
independent implementation of the composition the Gaussian variant uses).

``sampled_k_norm_loss`` is the cost of a K-norm call on a Bernoulli(p) sample of its members (the
sampling variants); every call is charged with it, and the verifier recomputes a release's sampled
calls with it (account kind ``erm_sampled_k_norm``).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np

from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, PrivacyLedger

__all__ = ["events_of", "pld_epsilon", "sampled_k_norm_loss", "spend_from_log"]


def events_of(releases: Iterable) -> list[dict]:
    """All training events logged by ``releases`` (``Release`` objects or row dicts), de-duplicated."""
    seen, out = set(), []
    for r in releases:
        meta = r.meta if hasattr(r, "meta") else r["meta"]
        for event in meta["events"]:
            if event["model_id"] not in seen:
                seen.add(event["model_id"])
                out.append(event)
    return out


def spend_from_log(events: Iterable[Mapping], n_positions: int, guarantee: Guarantee
                   ) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Per-position ``(pure ε, μ²)`` for positions 1..n_positions and the worst ``(ε, δ)``."""
    ledger = PrivacyLedger(guarantee)
    ledger.record(Charge(a, b, ElementLoss(float(e["epsilon"]), float(e["mu"]) ** 2), f"model {e['model_id']}")
                  for e in events for a, b in e["members"])
    pure, mu_sq = ledger.loss_per_step(n_positions)
    return pure, mu_sq, ledger.worst(n_positions)


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
