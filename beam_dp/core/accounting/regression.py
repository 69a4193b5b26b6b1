"""Spend of PRIVINCERM's reruns: advanced composition (account kind ``"advanced_composition"``).

Units: ε in nats, δ a probability, ``k`` a count of adaptive calls.
"""

from __future__ import annotations

import math

__all__ = ["advanced_composition"]


def advanced_composition(k: int, epsilon: float, delta: float, delta_star: float) -> tuple[float, float]:
    """Kasiviswanathan, Nissim & Jin, "Private Incremental Regression" Thm A.4: ``k`` adaptive (ε, δ)-DP calls are
    ``(ε√(2k ln(1/δ*)) + 2kε², kδ + δ*)``-DP (stated for ``ε <= 1``). The account kind
    ``"advanced_composition"`` (:mod:`beam_dp.core.noise_declaration`): PRIVINCERM's releases declare their
    spend by it; ``ValueError`` on parameters out of range (``k`` a count >= 0, ``0 <= ε <= 1``,
    ``δ ∈ [0, 1]``, ``δ* ∈ (0, 1)``)."""
    if not (k >= 0 and float(k).is_integer() and 0.0 <= epsilon <= 1.0 and 0.0 <= delta <= 1.0
            and 0.0 < delta_star < 1.0):
        raise ValueError(f"advanced composition needs a count k >= 0, epsilon in [0, 1], delta in [0, 1] and "
                         f"delta_star in (0, 1); got {k!r}, {epsilon!r}, {delta!r}, {delta_star!r}")
    if k == 0:
        return 0.0, 0.0
    return epsilon * math.sqrt(2.0 * k * math.log(1.0 / delta_star)) + 2.0 * k * epsilon**2, k * delta + delta_star
