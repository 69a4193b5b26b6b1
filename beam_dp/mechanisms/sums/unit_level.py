"""Unit-level calibration of a continual sum (user-level DP): the factor its noise is scaled by so that
one privacy unit, bounded by :class:`~beam_dp.core.units.UnitBounds` ``(m, c, k, b, W)``, gets the
guarantee one event gets at event level. Pure numpy, no engine.

After bounding (:func:`beam_dp.core.units.bound_block`) a unit adds at most one vector of norm ``R`` per
(stream, step), takes part in at most ``k`` steps, ``b`` apart, and reaches at most ``m`` streams per
step. In a stream where it takes ``j`` steps it moves that stream's counter ``g(j)`` times as much as one
event (:func:`~beam_dp.mechanisms.sums.participation.unit_sensitivity` of ``Participation(j, b)``):
Gaussian ``g(j) = multiplier(j)²`` (in ``mu²``), pure ``g(j) = multiplier(j)`` (in ``ε``). Streams are
separate mechanisms with independent noise, so their losses add: the unit's loss is ``Σ_s g(k_s)`` times
one event's, with ``1 <= k_s <= k`` and ``Σ_s k_s <= C``: ``C = m·k`` (each of its ``<= k`` steps reaches
``<= m`` streams). Under the window rule (the window tree, ``k`` steps within any ``W`` consecutive ones)
only the steps in the ``B >= W`` steps the tree protects move a release, and ``j`` counts a stream's steps
in a ``W``-window of them: ``C = m·k·⌈B/W⌉``.

``G = max Σ_s g(k_s)`` over that relaxation (a bound: it forgets that the streams share the unit's ``k``
steps) is an unbounded knapsack, items ``j = 1..k`` of weight ``j`` and value ``g(j)``, capacity ``C``:
exact when the best ratio ``g(j)/j`` has ``j | C`` (``⌊C/j⌋`` copies), else by dynamic programming up to
:data:`MAX_KNAPSACK` capacity, else the fractional bound ``C · max_j g(j)/j``. Pure noise needs none of
it: ``g(j) <= j`` (group privacy) and ``g(1) = 1``, so ``G = C`` (``C`` streams of one step each).

Scaling every noise scale by ``F = √G`` (Gaussian) or ``F = G`` (pure) divides each stream's loss by
``F²`` (resp. ``F``), so the unit's total is ``G/F² = 1`` (resp. ``G/F``) times one event's at event
level: the claimed ``(ε, δ)``. The mechanism is built on ``R·F`` (its noise and its declared ``Δ₂ = 2RF``:
the unit's joint sensitivity) while the data stay clipped to ``R``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from beam_dp.core.limits import check_count
from beam_dp.core.units import UnitBounds
from beam_dp.mechanisms.sums.participation import Participation, unit_sensitivity

__all__ = ["EVENT_FIELDS", "MAX_CALIBRATED_STEPS", "MAX_KNAPSACK", "PrivacyUnit", "UnitFactor", "best_unit_loss", "unit_factor"]

#: the event fields a unit column cannot be (a mapping's keys, a row's attributes)
EVENT_FIELDS = ("stream_id", "timestamp", "value")
#: the largest ``max_steps`` whose per-stream losses ``g(1..k)`` a Gaussian calibration computes
MAX_CALIBRATED_STEPS = 256
#: the largest knapsack capacity ``C`` solved by dynamic programming (beyond: the fractional bound)
MAX_KNAPSACK = 1 << 16


@dataclass(frozen=True)
class PrivacyUnit:
    """The privacy unit of a transform and how much one unit may contribute (see ``docs/privacy_units.md``).

    Args:
        column: the event field holding the unit id (a mapping key or row attribute; the 4th item of a
            tuple event): a non-empty UTF-8 string of at most 1024 bytes, hashed with the job's key.
        max_streams_per_step: ``m``: streams a unit contributes to per step.
        max_contributions_per_step: ``c``: contributions of a unit summed per (stream, step), the sum then
            clipped to the transform's ``clip_bound`` ``R``.
        max_steps: ``k``: steps a unit takes part in over the stream's life (window-DP: within any
            ``window`` consecutive steps, at most 64).
        min_separation: ``b``: steps between two of a unit's steps (1: any distinct steps).
    """

    column: str
    max_streams_per_step: int
    max_contributions_per_step: int
    max_steps: int
    min_separation: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column or not self.column.isprintable():
            raise ValueError("the privacy unit column must be a non-empty printable string")
        if self.column in EVENT_FIELDS:
            raise ValueError(f"the privacy unit column must not be an event field ({', '.join(EVENT_FIELDS)}), "
                             f"got {self.column!r}")
        self.bounds()  # every count checked

    def bounds(self, window: int | None = None) -> UnitBounds:
        """The :class:`UnitBounds` of the ledger (``window``: the window rule's ``W``)."""
        return UnitBounds(self.max_streams_per_step, self.max_contributions_per_step, self.max_steps,
                          self.min_separation, window)

    def declaration(self) -> dict[str, Any]:
        """What a release declares of the unit (meta fields)."""
        return {"privacy_unit": self.column, "max_steps": self.max_steps, "min_separation": self.min_separation,
                "max_streams_per_step": self.max_streams_per_step,
                "max_contributions_per_step": self.max_contributions_per_step}


@dataclass(frozen=True)
class UnitFactor:
    """``factor``: ``F``, the noise scale multiplier; ``loss``: ``G``, the unit's loss over one event's
    (``mu²`` Gaussian, ``ε`` pure) at event-level noise; ``exact``: ``G`` is the knapsack's maximum (not
    the fractional bound); ``capacity``: ``C``."""

    factor: float
    loss: float
    exact: bool
    capacity: int


def best_unit_loss(g: np.ndarray, capacity: int) -> tuple[float, bool]:
    """``(max Σ_s g[k_s − 1], exact)`` over ``1 <= k_s <= len(g)``, ``Σ k_s <= capacity`` (an unbounded
    knapsack, ``g >= 0``): see the module docstring."""
    g = np.asarray(g, dtype=np.float64)
    k = len(g)
    if k < 1 or not np.all(np.isfinite(g)) or np.any(g < 0):
        raise ValueError("g must be a non-empty finite non-negative vector")
    capacity = check_count("capacity", capacity)
    k = min(k, capacity)
    g = g[:k]
    ratio = g / np.arange(1, k + 1)
    best = int(np.argmax(ratio)) + 1
    if capacity % best == 0:  # the fractional bound, attained
        return capacity // best * float(g[best - 1]), True
    if capacity > MAX_KNAPSACK:
        return capacity * float(ratio[best - 1]), False
    table = np.zeros(capacity + 1)
    for c in range(1, capacity + 1):
        j = min(k, c)
        table[c] = np.max(table[c - j:c][::-1] + g[:j])
    return float(table[capacity]), True


def unit_factor(mechanism: Any, bounds: UnitBounds) -> UnitFactor:
    """The unit-level factor ``F`` of ``mechanism`` (as built at event level; scale-free) under ``bounds``
    (the window rule for a window tree, the forever rule otherwise): see the module docstring.
    ``ValueError`` where it cannot be bounded (the rule does not fit the counter, or ``k`` beyond
    :data:`MAX_CALIBRATED_STEPS` for Gaussian noise)."""
    from beam_dp.mechanisms.sums.snapping import SnappedSum
    from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

    inner = mechanism.inner if isinstance(mechanism, SnappedSum) else mechanism
    windowed = isinstance(inner, WindowTreeSum)
    if (bounds.window if windowed else None) != (inner.window if windowed else bounds.window):
        raise ValueError("a window tree bounds units by the window rule (max_steps within its window), every "
                         "other counter by the forever rule")
    k, b = bounds.max_steps, bounds.min_separation
    spans = -(-inner.block // bounds.window) if windowed else 1
    capacity = bounds.max_streams_per_step * k * spans
    pure = getattr(inner, "noise_law", "gaussian") != "gaussian"
    if pure and not windowed:  # g(j) <= j and g(1) = 1: C streams of one step each
        return UnitFactor(float(capacity), float(capacity), True, capacity)
    if k > MAX_CALIBRATED_STEPS:
        raise ValueError(f"max_steps={k} cannot be calibrated at the unit level: at most {MAX_CALIBRATED_STEPS} "
                         "steps per unit with this counter")
    power = 1 if pure else 2
    g = np.array([unit_sensitivity(mechanism, Participation(j, b)).multiplier ** power for j in range(1, k + 1)])
    loss, exact = best_unit_loss(g, capacity)
    loss = max(loss, float(g[0]))
    return UnitFactor(loss if pure else math.sqrt(loss), loss, exact, capacity)
