"""One privacy budget per job: shares for its transforms, composed right, checked at construction.

A job's contributions are read by every transform of the job, so a contribution's loss is the
composition of what each transform spends on it. :class:`JobBudget` holds the job's total
``(epsilon, delta)`` per contribution and hands out :class:`BudgetShare`s; a :class:`BudgetPlan` refuses
(``ValueError``) any set of shares whose composition exceeds the total.

Composition rules (``compose``), per contribution, at the job's ``delta``:

* ``"pure"`` shares (Laplace, K-norm, discrete Laplace: pure epsilon): epsilons add; a pure share
  has delta 0 by definition, and one that states a delta > 0 is refused (``ValueError``), never
  composed as if its delta were 0;
* ``"gaussian"`` shares (releases that are linear in the data plus Gaussian noise, e.g. every counter
  and tree with ``noise="gaussian"``): each is a Gaussian mechanism with some ``mu``; they compose
  exactly as one Gaussian mechanism with ``mu = sqrt(sum mu_i^2)``. A share's ``mu`` is recovered from
  its ``(epsilon_i, delta_i)`` as the largest ``mu`` for which the analytic Gaussian bound (Balle and
  Wang 2018) certifies them: any Gaussian mechanism that is ``(epsilon_i, delta_i)``-DP has at most
  that ``mu``, so the recovery is an upper bound whatever the mechanism's own calibration;
* ``"approx"`` shares (any other ``(epsilon, delta)`` argument: subsampled DP-SGD, advanced
  composition, sparse vector): basic composition, epsilons and deltas add.

The three parts are combined by basic composition (``epsilon_pure + epsilon_approx +
epsilon_gauss(delta - delta_approx)``); the result is also bounded by plain basic composition of
every share, and the smaller of the two is reported.

Windowed shares (privacy expiration) compose while the contribution is inside every window: a plan
with windowed shares gives window DP over the smallest window (``BudgetPlan.window``).

Planned against spent: a share is what its transform may spend; :func:`share_use` says how much of
it the transform's mechanism can actually spend over the public steps (its ``max_spend``, where it
has one: the window tree and what runs on it). An exactly calibrated mechanism spends its whole share;
one whose calibration is looser (a paper's closed form, certified) or whose public horizon is too
short to complete its nodes spends less, and ``ShareUse.unspent`` flags it so that a job can say so
at construction and show the ratio in its summary and manifest.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from beam_dp.core.calibration import analytic_gaussian_epsilon, analytic_gaussian_sigma
from beam_dp.core.limits import check_count

__all__ = [
    "COMPOSITIONS", "UNSPENT_TOLERANCE", "BudgetPlan", "BudgetShare", "JobBudget", "ShareUse", "check_params_budget",
    "check_share", "compose", "composition_of", "flag_budget", "gaussian_mu", "max_spend_of", "share_use",
]

Composition = Literal["pure", "gaussian", "approx"]
COMPOSITIONS: tuple[str, ...] = ("pure", "gaussian", "approx")
_REL_TOL = 1e-9  # numerical slack of the bisections behind the Gaussian conversions


def gaussian_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` of a Gaussian mechanism certified ``(epsilon, delta)``-DP (slightly rounded up)."""
    if epsilon <= 0 or delta <= 0:
        return 0.0
    return (1.0 + 1e-8) / analytic_gaussian_sigma(epsilon, delta, 1.0, rel_tol=1e-12)


def _check_spend(epsilon: float, delta: float, what: str) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"{what}: epsilon must be a finite number >= 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise ValueError(f"{what}: delta must lie in [0, 1), got {delta!r}")


def _check_pure(composition: str, delta: float, what: str) -> None:
    """Refuse a pure share that states a delta > 0 (pure epsilon-DP has none to compose)."""
    if composition == "pure" and delta > 0.0:
        raise ValueError(f"{what}: a 'pure' share must have delta 0, got delta {delta!r}; declare it 'approx' "
                         "(or 'gaussian') if its mechanism spends a delta")


def compose(spends: Iterable[tuple[str, float, float]], delta: float) -> float:
    """Epsilon, at ``delta``, of a contribution charged every ``(composition, epsilon_i, delta_i)``.

    Returns ``math.inf`` when ``delta`` cannot cover the shares' deltas; ``ValueError`` for an unknown
    composition or a ``"pure"`` share with a delta > 0 (its delta would otherwise be dropped).
    """
    pure = approx_eps = approx_delta = mu_sq = 0.0
    basic_eps = basic_delta = 0.0
    for composition, eps, dlt in spends:
        if composition not in COMPOSITIONS:
            raise ValueError(f"unknown composition {composition!r}; expected one of {COMPOSITIONS}")
        _check_pure(composition, dlt, "compose")
        basic_eps, basic_delta = basic_eps + eps, basic_delta + dlt
        if composition == "pure" or dlt == 0.0:
            pure += eps
        elif composition == "gaussian":
            mu_sq += gaussian_mu(eps, dlt) ** 2
        else:
            approx_eps, approx_delta = approx_eps + eps, approx_delta + dlt
    basic = basic_eps if basic_delta <= delta * (1.0 + _REL_TOL) else math.inf
    if mu_sq == 0.0:
        tight = pure + approx_eps if approx_delta <= delta * (1.0 + _REL_TOL) else math.inf
    elif delta - approx_delta <= 0.0:
        tight = math.inf
    else:
        tight = pure + approx_eps + analytic_gaussian_epsilon(math.sqrt(mu_sq), delta - approx_delta)
    return min(basic, tight)


@dataclass(frozen=True)
class BudgetShare:
    """One transform's share of a job's budget: give its ``epsilon``/``delta`` to the transform's params
    (``**share.params()``), which then also carry the share so that every release reports the job's spend."""

    name: str
    epsilon: float
    delta: float
    composition: Composition
    plan: "BudgetPlan"
    #: a per-record family's records per privacy unit (``per_unit``): the share is the unit's, its
    #: transform calibrates at the record-level budget whose group of ``max_records`` fits it
    max_records: int = 1

    def per_unit(self, max_records: int) -> "BudgetShare":
        """This share as one privacy unit's, for a per-record transform bounded to ``max_records`` records
        per unit (:mod:`beam_dp.core.group_privacy`)."""
        return dataclasses.replace(self, max_records=check_count("max_records", max_records))

    def record_budget(self) -> tuple[float, float]:
        """The record-level ``(epsilon, delta)`` a transform of this share calibrates at."""
        if self.max_records == 1:
            return self.epsilon, self.delta
        from beam_dp.core.group_privacy import record_budget

        return record_budget(self.composition, self.epsilon, self.delta, self.max_records)

    def unit_spend(self, epsilon_spent: float, delta_spent: float) -> tuple[float, float]:
        """A record-level spend of this share's transform as the spend of one unit (itself if ``max_records`` is 1)."""
        if self.max_records == 1 or epsilon_spent <= 0.0:
            return float(epsilon_spent), float(delta_spent)
        from beam_dp.core.group_privacy import unit_spend

        return unit_spend(self.composition, epsilon_spent, delta_spent, self.max_records)

    def params(self) -> dict:
        """Keyword arguments for a beam_dp params class: ``epsilon``, ``delta`` (record level for a unit's
        share) and ``budget``."""
        epsilon, delta = self.record_budget()
        return {"epsilon": epsilon, "delta": delta, "budget": self}

    def job_spend(self, epsilon_spent: float, delta_spent: float) -> tuple[float, float]:
        """The job's worst spend per contribution (per unit, for a unit's share) when this share's transform
        has spent ``(epsilon_spent, delta_spent)`` so far: composed with every other share at its full
        amount (an upper bound, since no transform ever spends more than its share)."""
        return self.plan.spend_with(self.name, *self.unit_spend(epsilon_spent, delta_spent))

    def __repr__(self) -> str:
        return (f"BudgetShare({self.name!r}, epsilon={self.epsilon:.6g}, delta={self.delta:.3g}, "
                f"{self.composition}, of a job budget of ({self.plan.epsilon:g}, {self.plan.delta:g}))")


@dataclass(frozen=True, eq=False)
class BudgetPlan:
    """A job's total ``(epsilon, delta)`` and the shares of its transforms; composition checked at construction."""

    epsilon: float
    delta: float
    shares: tuple[tuple[str, Composition, float, float], ...]

    def __post_init__(self) -> None:
        names = [name for name, *_ in self.shares]
        if len(set(names)) != len(names):
            raise ValueError(f"budget share names must be unique, got {names}")
        for name, composition, eps, dlt in self.shares:
            _check_spend(eps, dlt, f"share {name!r}")
            if composition not in COMPOSITIONS:
                raise ValueError(f"share {name!r}: composition must be one of {COMPOSITIONS}, got {composition!r}")
            _check_pure(composition, dlt, f"share {name!r}")
        total = self.total_epsilon()
        if total > self.epsilon * (1.0 + 1e-7):
            raise ValueError(
                f"the shares {names} compose to epsilon {total:.6g} at delta {self.delta:g}, more than the "
                f"job's total epsilon {self.epsilon:g}"
            )

    def total_epsilon(self) -> float:
        """The composition of every share at its full amount, at the job's delta."""
        return compose(((c, e, d) for _, c, e, d in self.shares), self.delta)

    def spend_with(self, name: str, epsilon_spent: float, delta_spent: float) -> tuple[float, float]:
        """``(epsilon, delta)`` of the job when share ``name`` has spent this much and the others their all."""
        spends = [(c, epsilon_spent, delta_spent) if n == name else (c, e, d) for n, c, e, d in self.shares]
        if name not in self.names:
            raise KeyError(f"no budget share named {name!r}; shares are {self.names}")
        uses_delta = any(d > 0 for _, _, d in spends)
        return compose(spends, self.delta), (self.delta if uses_delta else 0.0)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, *_ in self.shares)

    def __getitem__(self, name: str) -> BudgetShare:
        for n, composition, eps, dlt in self.shares:
            if n == name:
                return BudgetShare(n, eps, dlt, composition, self)
        raise KeyError(f"no budget share named {name!r}; shares are {self.names}")


@dataclass(frozen=True)
class JobBudget:
    """A job's total privacy budget per contribution: ``epsilon``, and ``delta`` (0 for pure epsilon-DP).

    ``split`` divides it among named transforms by weight, optimally for the composition rules of the
    module docstring; ``plan`` checks explicit shares. Both refuse a plan that exceeds the total.
    """

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"JobBudget.epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0.0 <= self.delta < 1.0):
            raise ValueError(f"JobBudget.delta must lie in [0, 1), got {self.delta!r}")

    def plan(self, shares: Mapping[str, tuple[Composition, float, float]]) -> BudgetPlan:
        """Explicit shares ``{name: (composition, epsilon, delta)}``; refused if they compose above the total."""
        return BudgetPlan(self.epsilon, self.delta, tuple((n, c, float(e), float(d)) for n, (c, e, d) in shares.items()))

    def split(self, compositions: Mapping[str, Composition], weights: Mapping[str, float] | None = None) -> BudgetPlan:
        """Divide the budget among ``{name: composition}`` in proportion to ``weights`` (default equal).

        Epsilon is split by weight across all shares, the Gaussian shares' part taken together; the
        Gaussian part's ``mu`` is then split so that ``mu_i^2`` is proportional to the weights, and
        each Gaussian share is handed the ``(epsilon_i, delta_G)`` that its ``mu_i`` certifies. Delta
        goes by weight to the ``"approx"`` shares and to the Gaussian part taken together.
        """
        if not compositions:
            raise ValueError("split needs at least one share")
        weights = {name: float((weights or {}).get(name, 1.0)) for name in compositions}
        if any(not (math.isfinite(w) and w > 0) for w in weights.values()):
            raise ValueError(f"weights must be finite and > 0, got {weights}")
        for name, composition in compositions.items():
            if composition not in COMPOSITIONS:
                raise ValueError(f"share {name!r}: composition must be one of {COMPOSITIONS}, got {composition!r}")
            if composition != "pure" and self.delta == 0.0:
                raise ValueError(f"share {name!r} is {composition!r} and needs delta > 0, but the job's delta is 0")
        total_w = sum(weights.values())
        gauss = [n for n, c in compositions.items() if c == "gaussian"]
        approx = [n for n, c in compositions.items() if c == "approx"]
        gauss_w = sum(weights[n] for n in gauss)
        delta_w = gauss_w + sum(weights[n] for n in approx)
        shares: dict[str, tuple[Composition, float, float]] = {}
        # the last few ulps are kept back so that the recomposed plan never exceeds the total numerically
        epsilon = self.epsilon * (1.0 - 1e-9)
        delta = self.delta * (1.0 - 1e-9)
        for name, composition in compositions.items():
            if composition == "pure":
                shares[name] = ("pure", epsilon * weights[name] / total_w, 0.0)
            elif composition == "approx":
                shares[name] = ("approx", epsilon * weights[name] / total_w, delta * weights[name] / delta_w)
        if gauss:
            delta_g = delta * gauss_w / delta_w
            mu_g = gaussian_mu(epsilon * gauss_w / total_w, delta_g) / (1.0 + 1e-6)
            for name in gauss:
                mu_i = mu_g * math.sqrt(weights[name] / gauss_w)
                shares[name] = ("gaussian", analytic_gaussian_epsilon(mu_i, delta_g), delta_g)
        return self.plan({name: shares[name] for name in compositions})


def flag_budget(epsilon: float, delta: float, noise: str | None, names: Iterable[str]) -> BudgetPlan:
    """The job budget of a command line's ``--epsilon``/``--delta``/``--noise``, split equally among the
    job's transforms ``names`` (``"gaussian"`` shares for Gaussian noise, else ``"pure"``): the one rule of
    every engine's entry (the Beam jobs, the native Flink job), so that matching flags calibrate every
    transform to the same share. ``ValueError`` for a budget it cannot split."""
    composition: Composition = "gaussian" if noise == "gaussian" else "pure"
    return JobBudget(epsilon, delta).split({name: composition for name in names})


def composition_of(mechanism) -> Composition:
    """How a mechanism's releases compose: its declared ``composition`` if it has one, else ``"pure"``
    for a pure guarantee and ``"approx"`` (basic composition: always valid) otherwise."""
    declared = getattr(mechanism, "composition", None)
    if declared is not None:
        return declared
    return "pure" if mechanism.guarantee.delta == 0.0 else "approx"


def check_share(share: BudgetShare | None, epsilon: float, delta: float, composition: Composition, what: str) -> None:
    """Refuse (``ValueError``) params whose ``(epsilon, delta, composition)`` do not fit their budget share
    (a unit's share: their spend as one unit's, :meth:`BudgetShare.unit_spend`)."""
    if share is None:
        return
    if not isinstance(share, BudgetShare):
        raise ValueError(f"{what}: budget must be a BudgetShare (JobBudget(...).split(...)[name]), got {share!r}")
    fits = {"pure": ("pure",), "gaussian": ("gaussian",), "approx": COMPOSITIONS}[share.composition]
    if composition not in fits:
        raise ValueError(f"{what}: its releases compose as {composition!r}, but its budget share is "
                         f"{share.composition!r}; split the job's budget with the right composition")
    spent = share.unit_spend(epsilon, delta)
    if spent[0] > share.epsilon * (1.0 + 1e-12) or spent[1] > share.delta * (1.0 + 1e-12):
        raise ValueError(f"{what}: (epsilon={epsilon:g}, delta={delta:g}) exceeds its budget share {share!r}")


def check_params_budget(params, mechanism) -> None:
    """Refuse params whose mechanism does not fit ``params.budget`` (a no-op without a budget share)."""
    check_share(params.budget, float(mechanism.guarantee.epsilon), float(mechanism.guarantee.delta),
                composition_of(mechanism), type(params).__name__)


#: a share counts as unspent when its transform can spend less than this fraction below it
UNSPENT_TOLERANCE = 1e-3


def max_spend_of(mechanism, last_step: int | None = None) -> tuple[float, float] | None:
    """The most ``mechanism`` spends on one contribution over steps ``1..last_step`` (``None``: any
    step), ``(epsilon, delta)``, where it says: a ``max_spend(last_step)`` method on it, on the
    mechanism a ``SnappedSum`` wraps (``inner``) or on the window tree an online learner runs
    (``tree``). ``None`` when it does not say (its guarantee is then the bound)."""
    for candidate in (mechanism, getattr(mechanism, "inner", None), getattr(mechanism, "tree", None)):
        method = getattr(candidate, "max_spend", None)
        if callable(method):
            epsilon, delta = method(last_step)
            return float(epsilon), float(delta)
    return None


@dataclass(frozen=True)
class ShareUse:
    """A transform's planned share ``(planned_epsilon, planned_delta)`` and the most it can spend of it
    (``spendable_*``, equal to the planned amounts when its mechanism does not say)."""

    name: str
    planned_epsilon: float
    planned_delta: float
    spendable_epsilon: float
    spendable_delta: float

    @property
    def ratio(self) -> float:
        """Spendable over planned epsilon (1 for an empty share)."""
        return self.spendable_epsilon / self.planned_epsilon if self.planned_epsilon > 0 else 1.0

    @property
    def unspent(self) -> bool:
        """Whether the transform leaves more than ``UNSPENT_TOLERANCE`` of its share unspent."""
        return self.ratio < 1.0 - UNSPENT_TOLERANCE

    def describe(self) -> str:
        return (f"{self.name}: share epsilon {self.planned_epsilon:.4g}, spends at most {self.spendable_epsilon:.4g} "
                f"({100.0 * self.ratio:.1f}%)")


def share_use(name: str, params, mechanism=None) -> ShareUse:
    """How much of its share (``params.budget``, else its own ``epsilon``/``delta``) the transform of
    ``params`` can spend by its clock's public last step (any step when it has none); a unit's share: as
    one unit's spend."""
    mechanism = params.build_mechanism() if mechanism is None else mechanism
    share = getattr(params, "budget", None)
    planned = ((float(share.epsilon), float(share.delta)) if share is not None
               else (float(mechanism.guarantee.epsilon), float(mechanism.guarantee.delta)))
    last_step = getattr(getattr(params, "clock", None), "last_step", None)
    spent = max_spend_of(mechanism, last_step)  # the mechanism's, per record for a unit's share
    spendable = planned if spent is None else spent if share is None else share.unit_spend(*spent)
    return ShareUse(name, planned[0], planned[1], spendable[0], spendable[1])
