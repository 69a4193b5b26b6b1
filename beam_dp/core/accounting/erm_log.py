"""Per-element spend of the ERM family re-derived from its release log.

``spend_from_log`` rebuilds each position's loss from the training events carried in the release
meta: an event charges every position of its member ranges ``ε_event`` (pure) or a
Gaussian ``μ``; charges add (pure) or compose exactly into one Gaussian (μ² add). It uses the core
:class:`~beam_dp.core.PrivacyLedger`, so the release log alone proves each element's spend.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, PrivacyLedger

__all__ = ["events_of", "spend_from_log"]


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
