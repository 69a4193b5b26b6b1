"""Privacy guarantees, per-element privacy loss and the per-element ledger.

Units: ``epsilon`` is in nats (the usual DP epsilon), ``delta`` is a probability. Steps are the
public step numbers t = 1, 2, ... of one stream. A *charge* is one noisy use of the data (a tree
node, a model training call): it covers a contiguous range of steps and costs every element in
that range either a pure-epsilon amount (Laplace, K-norm) or a Gaussian ``mu = sensitivity/sigma``.

An element's loss is the sum of the charges that cover it: pure epsilons add (sequential
composition) and Gaussian charges combine exactly as one Gaussian mechanism with
``mu = sqrt(sum mu_i^2)`` (the node values are jointly Gaussian). A loss with both parts is
reported by basic composition: ``epsilon_pure + epsilon_gauss(delta)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generator, Iterable, Sequence, cast

import numpy as np

from beam_dp.core.calibration import analytic_gaussian_epsilon, analytic_gaussian_epsilons_paced
from beam_dp.core.noise_declaration import GAUSSIAN_LAWS, NoiseTerm, declaration_json, merge_terms
from beam_dp.core.paced import run_to_end

__all__ = ["Charge", "ElementLoss", "Guarantee", "PrivacyLedger", "require_within_budget", "spends", "spends_paced"]

EVENT_LEVEL = "event-level: replace one contribution"


@dataclass(frozen=True)
class Guarantee:
    """The promise a mechanism makes for every element, whatever the stream length.

    ``window=None`` means the protection never expires; ``window=B`` means a step is protected
    while fewer than ``B`` later steps have been released (privacy expiration), after which its
    value may appear un-noised in releases. ``window_requested`` is the user's W (B >= W).
    """

    epsilon: float
    delta: float = 0.0
    neighbouring: str = EVENT_LEVEL
    window: int | None = None
    window_requested: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float, np.floating)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float, np.floating)) and 0.0 <= self.delta < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")
        for name in ("window", "window_requested"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")

    @property
    def pure(self) -> bool:
        return self.delta == 0.0

    def describe(self) -> str:
        kind = f"{self.epsilon:g}-DP" if self.pure else f"({self.epsilon:g}, {self.delta:g})-DP"
        scope = "forever" if self.window is None else f"over the last {self.window} steps (window DP)"
        return f"{kind}, {self.neighbouring}, {scope}"

    def as_dict(self) -> dict:
        return {
            "epsilon": float(self.epsilon),
            "delta": float(self.delta),
            "neighbouring": self.neighbouring,
            "window": self.window,
            "window_requested": self.window_requested,
        }


@dataclass(frozen=True)
class ElementLoss:
    """Privacy loss of one element: a pure-epsilon part plus a Gaussian part ``mu^2``."""

    pure_epsilon: float = 0.0
    gaussian_mu_sq: float = 0.0
    # what noise the loss came from (``beam_dp.core.noise_declaration``): written on releases so that
    # a verifier recomputes the spend; not part of the loss's value
    noise: tuple[NoiseTerm, ...] = field(default=(), compare=False)

    @classmethod
    def of_noise(cls, law: str, sensitivity: float, scale: float, weight: float = 1.0,
                 pure_epsilon: float | None = None) -> "ElementLoss":
        """The loss of an element lying ``weight`` times in noise of ``law`` and ``scale`` at L2
        ``sensitivity``: ``weight·Δ/scale`` pure (or ``pure_epsilon``, the mechanism's own exact
        arithmetic for the same amount) or ``mu² = weight·(Δ/scale)²``; declared for the release."""
        if weight == 0:
            return cls()
        term = ((law, float(sensitivity), float(scale), float(weight)),)
        if law in GAUSSIAN_LAWS:
            return cls(0.0, weight * (sensitivity / scale) ** 2, term)
        return cls(weight * sensitivity / scale if pure_epsilon is None else pure_epsilon, 0.0, term)

    def declaration(self) -> str:
        """The ``noise`` column text of this loss (``""`` when its mechanism declared no noise)."""
        return declaration_json(self.noise)

    def __add__(self, other: "ElementLoss") -> "ElementLoss":
        return ElementLoss(self.pure_epsilon + other.pure_epsilon, self.gaussian_mu_sq + other.gaussian_mu_sq,
                           merge_terms(self.noise, other.noise))

    def epsilon_at(self, delta: float) -> float:
        """Epsilon of this loss at ``delta`` (exact for a pure or a purely Gaussian loss)."""
        if self.gaussian_mu_sq == 0.0:
            return self.pure_epsilon
        if delta <= 0.0:
            return math.inf
        return self.pure_epsilon + analytic_gaussian_epsilon(math.sqrt(self.gaussian_mu_sq), delta)

    def spend(self, delta: float) -> tuple[float, float]:
        """``(epsilon_spent, delta_spent)`` to report on a release."""
        if self.gaussian_mu_sq == 0.0:
            return self.pure_epsilon, 0.0
        return self.epsilon_at(delta), delta


def spends(losses: Sequence[ElementLoss], delta: float) -> list[tuple[float, float]]:
    """``[loss.spend(delta) for loss in losses]`` with one vectorised analytic-Gaussian bisection for
    all the Gaussian parts (entry for entry the value a loss gets alone)."""
    return run_to_end(spends_paced(losses, delta))


def spends_paced(losses: Sequence[ElementLoss], delta: float) -> Generator[None, None, list[tuple[float, float]]]:
    """``spends`` as a paced computation (``beam_dp.core.paced``): one unit per step of the bisection."""
    out: list[tuple[float, float] | None] = [
        loss.spend(delta) if loss.gaussian_mu_sq == 0.0 or delta <= 0.0 else None for loss in losses]
    gaussian = [i for i, spent in enumerate(out) if spent is None]
    if gaussian:
        eps = yield from analytic_gaussian_epsilons_paced(np.sqrt([losses[i].gaussian_mu_sq for i in gaussian]), delta)
        for i, e in zip(gaussian, eps.tolist()):
            out[i] = (losses[i].pure_epsilon + e, delta)
    return cast("list[tuple[float, float]]", out)  # every entry is set by now


def require_within_budget(guarantee: Guarantee, loss: ElementLoss, what: str, rel_tol: float = 1e-12) -> None:
    """Refuse (``ValueError``) a configuration whose worst per-element loss exceeds the guarantee."""
    if loss.gaussian_mu_sq > 0.0 and guarantee.delta == 0.0:
        raise ValueError(f"{what}: Gaussian noise cannot give pure epsilon-DP; set delta > 0")
    eps = loss.epsilon_at(guarantee.delta)
    if eps > guarantee.epsilon * (1.0 + rel_tol):
        raise ValueError(
            f"{what}: worst per-element epsilon {eps:.6g} exceeds the budget {guarantee.epsilon:g}"
            f" (delta={guarantee.delta:g})"
        )


@dataclass(frozen=True)
class Charge:
    """One noisy use of the data covering steps ``first..last`` (inclusive)."""

    first: int
    last: int
    loss: ElementLoss
    label: str = ""

    def __post_init__(self) -> None:
        if self.first < 1 or self.last < self.first:
            raise ValueError(f"a charge must cover 1 <= first <= last, got [{self.first}, {self.last}]")

    @classmethod
    def pure(cls, first: int, last: int, epsilon: float, label: str = "") -> "Charge":
        return cls(first, last, ElementLoss(pure_epsilon=epsilon), label)

    @classmethod
    def gaussian(cls, first: int, last: int, sensitivity: float, sigma: float, label: str = "") -> "Charge":
        return cls(first, last, ElementLoss(gaussian_mu_sq=(sensitivity / sigma) ** 2), label)


@dataclass
class PrivacyLedger:
    """Log of charges from which each element's spend can be recomputed.

    ``record`` appends charges; ``loss_per_step(n)`` sums, for steps 1..n, the charges covering
    each step (vectorised difference arrays); ``worst`` returns the largest per-element spend and
    ``check`` raises when it exceeds the guarantee.
    """

    guarantee: Guarantee
    charges: list[Charge] = field(default_factory=list)

    def record(self, charges: Iterable[Charge]) -> None:
        self.charges.extend(charges)

    def loss_per_step(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Arrays ``(pure_epsilon[t-1], gaussian_mu_sq[t-1])`` for t = 1..n_steps."""
        pure = np.zeros(n_steps + 1)
        gauss = np.zeros(n_steps + 1)
        if self.charges:
            first = np.array([c.first for c in self.charges]) - 1
            last = np.array([c.last for c in self.charges])
            keep = first < n_steps
            first, last = first[keep], np.minimum(last[keep], n_steps)
            eps = np.array([c.loss.pure_epsilon for c in self.charges])[keep]
            mu2 = np.array([c.loss.gaussian_mu_sq for c in self.charges])[keep]
            np.add.at(pure, first, eps)
            np.add.at(pure, last, -eps)
            np.add.at(gauss, first, mu2)
            np.add.at(gauss, last, -mu2)
        return np.cumsum(pure)[:-1], np.cumsum(gauss)[:-1]

    def worst(self, n_steps: int) -> tuple[float, float]:
        """Worst ``(epsilon, delta)`` over the elements of steps 1..n_steps."""
        if n_steps == 0:
            return 0.0, 0.0
        pure, gauss = self.loss_per_step(n_steps)
        if not np.any(gauss > 0):
            return float(pure.max()), 0.0
        distinct = np.unique(np.stack([pure, gauss], axis=1), axis=0)  # few distinct losses
        return max((ElementLoss(float(p), float(g)).spend(self.guarantee.delta) for p, g in distinct),
                   key=lambda spend: spend[0])

    def check(self, n_steps: int, rel_tol: float = 1e-12) -> None:
        eps, _ = self.worst(n_steps)
        if eps > self.guarantee.epsilon * (1.0 + rel_tol):
            raise ValueError(f"ledger: an element spent epsilon {eps:.6g} > budget {self.guarantee.epsilon:g}")
