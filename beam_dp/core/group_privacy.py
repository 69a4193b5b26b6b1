"""Group privacy: the guarantee of a record-level mechanism for a privacy unit of up to ``k`` records.

A per-record family (ERM, growing databases, online learners, incremental regression, lifelong
learners) whose records are bounded to at most ``k`` per privacy unit protects one unit as it protects
a group of ``k`` records. Two inputs that differ in one unit's whole contribution are joined by a chain
of at most ``k`` single-record changes, so a record-level guarantee composes along the chain:

* ``pure`` (ε-DP): a group of ``k`` is ``kε``-DP (exact: no tighter bound holds in general);
* ``gaussian`` (μ-GDP, every Gaussian family's accounting): a group of ``k`` is ``kμ``-GDP (Dong, Roth
  and Su 2022, Theorem 2.14; exact for the Gaussian mechanism, whose sensitivity grows ``k``-fold);
* ``approx`` ((ε, δ)-DP): a group of ``k`` is ``(kε, δ·(e^{kε} − 1)/(e^{ε} − 1))``-DP (the chain's
  deltas, each scaled by the likelihood ratio before it; Vadhan 2017, Lemma 2.2).

:func:`unit_spend` is that group guarantee of a record-level spend; :func:`record_budget` inverts it:
the record-level budget whose unit-level guarantee is at most the unit budget asked for. Both are pure
functions of public numbers: the verifier recomputes :func:`unit_spend` from what a release declares.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from beam_dp.core.budget import COMPOSITIONS, gaussian_mu
from beam_dp.core.calibration import analytic_gaussian_epsilon
from beam_dp.core.limits import MAX_COUNT, check_count

__all__ = ["RecordUnit", "check_unit_share", "record_budget", "unit_spend"]

_FIELD = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


def _checked(composition: str, epsilon: float, delta: float, k: int) -> int:
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    if not (isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
            and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    if composition == "pure" and delta > 0.0:
        raise ValueError(f"a pure guarantee has delta 0, got {delta!r}")
    if composition == "gaussian" and delta == 0.0:
        raise ValueError("a Gaussian guarantee needs delta > 0")
    return check_count("max_records", k, 1, MAX_COUNT)


def _log_expm1(x: float) -> float:
    """``log(e^x − 1)`` for ``x > 0``, without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def unit_spend(composition: str, epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """``(ε, δ)`` of one privacy unit of at most ``k`` records under a record-level ``(epsilon, delta)``
    spend of ``composition`` (``pure``, ``gaussian`` or ``approx``; see the module docstring)."""
    k = _checked(composition, epsilon, delta, k)
    if k == 1:
        return float(epsilon), float(delta)
    if composition == "pure":
        return k * float(epsilon), 0.0
    if composition == "gaussian":  # kμ-GDP, read at the same delta
        return analytic_gaussian_epsilon(k * gaussian_mu(epsilon, delta), delta), float(delta)
    if delta == 0.0:
        return k * float(epsilon), 0.0
    log_delta = math.log(delta) + _log_expm1(k * epsilon) - _log_expm1(epsilon)
    return k * float(epsilon), (math.exp(log_delta) if log_delta < 0.0 else 1.0)  # 1: no guarantee left


def record_budget(composition: str, epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """The record-level ``(ε, δ)`` to calibrate at so that a unit of at most ``k`` records is
    ``(epsilon, delta)``-DP: :func:`unit_spend` of the result is at most ``(epsilon, delta)``."""
    k = _checked(composition, epsilon, delta, k)
    if k == 1:
        return float(epsilon), float(delta)
    if composition == "pure":
        return float(epsilon) / k, 0.0
    if composition == "gaussian":  # μ/k-GDP at the same delta, rounded down past gaussian_mu's rounding up
        mu = gaussian_mu(epsilon, delta) / (1.0 + 1e-8) ** 2
        return analytic_gaussian_epsilon(mu / k * (1.0 - 1e-9), delta), float(delta)
    eps = float(epsilon) / k
    if delta == 0.0:
        return eps, 0.0
    return eps, math.exp(math.log(delta) + _log_expm1(eps) - _log_expm1(epsilon)) * (1.0 - 1e-12)


@dataclass(frozen=True)
class RecordUnit:
    """The privacy unit of a per-record family and its bound (see ``docs/privacy_units.md``).

    Args:
        column: the field holding the unit id (a mapping key or row attribute; a tuple record carries the
            id as its last item).
        max_records: ``k``: at most this many records per unit over the stream's life; the release then
            protects one unit's whole contribution as it protects a group of ``k`` records.
    """

    column: str
    max_records: int

    def __post_init__(self) -> None:
        if not (isinstance(self.column, str) and re.match(_FIELD, self.column)):
            raise ValueError(f"the privacy unit column must be a field name ({_FIELD}), got {self.column!r}")
        object.__setattr__(self, "max_records", check_count("max_records", self.max_records, 1, MAX_COUNT))

    def declaration(self) -> dict[str, Any]:
        """The meta fields a unit-level release declares beside its record-level noise."""
        return {"privacy_unit": self.column, "max_records": self.max_records}


def check_unit_share(unit: RecordUnit | None, budget: Any) -> None:
    """Refuse (``ValueError``) a per-record family's params whose ``privacy_unit`` is not a
    :class:`RecordUnit` or whose budget share is not that unit's (``BudgetShare.per_unit``), so every row's
    job spend is the unit's; nothing to check at record level (``unit`` None)."""
    if unit is None:
        return
    if not isinstance(unit, RecordUnit):
        raise ValueError(f"privacy_unit must be a RecordUnit, got {type(unit).__name__}")
    if getattr(budget, "max_records", None) != unit.max_records:
        raise ValueError(f"a privacy unit of {unit.max_records} records needs its budget share per unit "
                         "(beam_dp.beam.shell.unit_records.with_record_unit)")
