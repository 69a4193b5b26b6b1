"""The unit-level spend of a continual sum's release, recomputed from its declared bounding, and of a
per-record family's release, recomputed by group privacy, for ``beam_dp.verify`` (``docs/privacy_units.md``).

A unit-level release declares in its meta its privacy unit (``privacy_unit``: the unit field's name), the
bounding ``max_steps`` ``k``, ``min_separation`` ``b``, ``max_streams_per_step`` ``m``,
``max_contributions_per_step`` ``c`` and the clip bound ``R`` (``clip_bound``). :class:`UnitCalibrations`
rebuilds the release's mechanism from its public parameters (``beam_dp.verify_calibration``'s builders),
recomputes the unit factor ``F`` from them (:func:`beam_dp.mechanisms.sums.unit_level.unit_factor`), and
recomputes the unit's spend: the release's noise declaration with every term's sensitivity set to the
unit's joint sensitivity ``2RF`` (a snapped sum declares more: its steps move by up to its enlarged bound). A release whose declared sensitivity is below ``2RF`` (so its stated
spend below the unit's) or whose budget is below that spend fails, as does a bounding
field missing or malformed, and (with the job's manifest) a release of a transform the manifest declares
unit-level that declares no unit, or another one.

A per-record family's unit-level release (ERM, growing databases, online and lifelong learners) declares
``privacy_unit`` and ``max_records`` ``k`` (no ``max_steps``); its noise declaration and budget stay
record-level (checked as at event level). :func:`record_unit_problem` recomputes the unit's spend by group
privacy (:func:`beam_dp.core.group_privacy.unit_spend` of the release's ``composition``, ``epsilon_spent``,
``delta_spent`` and ``k``) and fails a release whose stated job spend (``job_epsilon_spent``,
``job_delta_spent``: the unit's, composed with the job's other shares) or job budget is below it, or
whose ``max_records`` is missing or malformed; :meth:`UnitCalibrations.declare` records the unit of every
release, so the manifest checks cover these families too.
"""

from __future__ import annotations

import json
import math
from typing import Hashable

from beam_dp.core.group_privacy import unit_spend
from beam_dp.core.limits import MAX_COUNT
from beam_dp.core.noise_declaration import declaration_json, declared_terms, loss_of_declaration, recomputed_epsilon
from beam_dp.core.units import UnitBounds

__all__ = ["BOUNDING_FIELDS", "UnitCalibrations", "is_record_unit", "record_unit_problem", "record_unit_size"]

#: the meta fields of a unit-level release's bounding, beside ``privacy_unit``
BOUNDING_FIELDS = ("max_steps", "min_separation", "max_streams_per_step", "max_contributions_per_step", "clip_bound")
_REL_TOL = 1e-9


def _bounds(meta: dict, window: int | None) -> tuple[UnitBounds, float]:
    """The declared ``UnitBounds`` and ``R``; ``ValueError`` naming the field missing or malformed."""
    missing = [name for name in BOUNDING_FIELDS if meta.get(name) is None]
    if missing:
        raise ValueError(f"it declares privacy unit {meta['privacy_unit']!r} without its bounding {missing}")
    counts = {name: meta[name] for name in BOUNDING_FIELDS[:4]}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        raise ValueError(f"its bounding {counts} is not integer counts")
    clip = meta["clip_bound"]
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"its clip_bound {clip!r} is not a finite R > 0")
    bounds = UnitBounds(counts["max_streams_per_step"], counts["max_contributions_per_step"], counts["max_steps"],
                        counts["min_separation"], window)
    return bounds, float(clip)


def is_record_unit(mechanism: str, meta: dict) -> bool:
    """Whether a release declaring ``privacy_unit`` is a per-record family's (bounded by ``max_records``):
    it declares no ``max_steps`` and its mechanism is not a continual sum's."""
    from beam_dp.verify_calibration import _BUILDERS

    return "max_steps" not in meta and ("max_records" in meta or mechanism not in _BUILDERS)


def record_unit_size(meta: dict) -> int:
    """The declared ``max_records`` ``k`` of a per-record unit-level release; ``ValueError`` when missing or
    not an integer in ``[1, 2^62]``."""
    k = meta.get("max_records")
    if k is None:
        raise ValueError(f"it declares privacy unit {meta['privacy_unit']!r} without its bound max_records")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_COUNT:
        raise ValueError(f"its max_records {k!r} is not an integer count >= 1")
    return k


def record_unit_problem(composition: str, epsilon_spent: float, delta_spent: float, job_epsilon_spent: float,
                        job_delta_spent: float, job_epsilon_budget: float, k: int) -> str | None:
    """Why a per-record release's stated job spend (or the job's budget) is below the spend of one unit of
    ``k`` records its record-level spend gives by group privacy; ``None`` when it is not."""
    if epsilon_spent <= 0.0:
        return None
    try:
        eps, delta = unit_spend("approx" if composition == "pure" and delta_spent > 0 else composition,
                                epsilon_spent, delta_spent, k)
    except ValueError as exc:
        return f"its spend does not compose as {composition!r} ({exc})"
    stated = min(job_epsilon_spent, job_epsilon_budget)
    if not (eps <= stated * (1 + _REL_TOL) and delta <= job_delta_spent * (1 + _REL_TOL)):
        return (f"one unit of max_records={k} records spends (epsilon {eps:.6g}, delta {delta:.3g}) by group privacy "
                f"of its record-level ({epsilon_spent:.6g}, {delta_spent:.3g}), above the job spend "
                f"({job_epsilon_spent:.6g}, {job_delta_spent:.3g}) it states (job budget {job_epsilon_budget:.6g})")
    return None


class UnitCalibrations:
    """The unit-level checks of a job's releases, one per distinct (mechanism, meta, budget,
    declaration), and which noise domains declare which unit."""

    def __init__(self) -> None:
        self._factors: dict[tuple, float] = {}
        self.units: dict[Hashable, set[str | None]] = {}  # noise domain -> the units its releases declare

    def problem(self, mechanism: str, meta_text: str, epsilon: float, delta: float, declaration: str,
                domain: Hashable = None) -> str | None:
        """Why a release's declared unit-level spend is below the one recomputed from its bounding;
        ``None`` when it is not, or the release is event-level (no ``privacy_unit``)."""
        try:
            meta = json.loads(meta_text) if meta_text else {}
            unit = meta.get("privacy_unit") if isinstance(meta, dict) else None
            self.declare(domain, unit)
            if unit is None or is_record_unit(mechanism, meta):  # a per-record unit: record_unit_problem
                return None
            return self._check(mechanism, meta, float(epsilon), float(delta), declaration)
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            return f"its unit-level parameters do not rebuild a {mechanism} ({type(exc).__name__}: {exc})"

    def declare(self, domain: Hashable, unit: str | None) -> None:
        """Record that a release of noise domain ``domain`` declares privacy unit ``unit`` (None: none)."""
        self.units.setdefault(domain, set()).add(unit)

    def _check(self, mechanism: str, meta: dict, epsilon: float, delta: float, declaration: str) -> str | None:
        from beam_dp.mechanisms.sums.unit_level import unit_factor
        from beam_dp.verify_calibration import _BUILDERS

        window = meta.get("window_requested") if mechanism == "window_tree" else None
        bounds, clip = _bounds(meta, None if window is None else int(window))
        terms, accounts = declared_terms(declaration)
        sensitivities = {s for _, s, _, _ in terms}
        if accounts or len(sensitivities) != 1:
            return f"its declaration is not a {mechanism}'s (accounts, or not one sensitivity)"
        sensitivity = sensitivities.pop()
        reads, build = _BUILDERS[mechanism]
        key = (mechanism, meta.get("noise"), *(json.dumps(meta.get(k)) for k in reads), epsilon, delta, sensitivity,
               bounds)
        factor = self._factors.get(key)
        if factor is None:
            common = {"dim": 1, "epsilon": epsilon, "delta": delta, "sensitivity": sensitivity, "noise": meta["noise"]}
            rebuilt, _ = build(meta, common)
            factor = self._factors[key] = unit_factor(rebuilt, bounds).factor
        joint = 2.0 * clip * factor
        unit_terms = tuple((law, joint, scale, weight) for law, _, scale, weight in terms)
        spend = recomputed_epsilon(loss_of_declaration(declaration_json(unit_terms)), delta)
        if sensitivity < joint * (1 - _REL_TOL) or spend > epsilon * (1 + _REL_TOL):
            return (f"its bounding (k={bounds.max_steps}, b={bounds.min_separation}, m={bounds.max_streams_per_step}, "
                    f"c={bounds.max_contributions_per_step}, R={clip:g}) gives one unit a joint sensitivity "
                    f"{joint:.6g}, above the {sensitivity:.6g} its noise declares: a spend of epsilon {spend:.6g} "
                    f"(its budget {epsilon:.6g})")
        return None

    def manifest_problems(self, declared: dict[str, str]) -> list[str]:
        """Problems against the manifest's ``{noise domain: privacy unit}`` of its unit-level transforms: a
        release of one without the unit's bounding, or naming another unit; a release naming a unit in a
        transform the manifest declares event-level."""
        problems = []
        for domain, units in sorted(self.units.items(), key=lambda item: str(item[0])):
            unit = declared.get(domain)  # type: ignore[call-overload]
            if unit is not None and units != {unit}:
                problems.append(f"releases of {domain!r} declare privacy units {sorted(map(str, units))}; the "
                                f"manifest declares the transform at the level of unit {unit!r}: its bounding must "
                                "be on every release")
            elif unit is None and units - {None}:
                problems.append(f"releases of {domain!r} declare a privacy unit, but the manifest declares the "
                                "transform event-level")
        return problems

    def mixed(self) -> list[str]:
        """Without a manifest: a noise domain whose releases do not all declare one unit."""
        return [f"releases of {domain!r} declare privacy units {sorted(map(str, units))}: one transform's releases "
                "declare one unit on every release" for domain, units in sorted(self.units.items(),
                                                                                 key=lambda item: str(item[0]))
                if len(units) > 1]
