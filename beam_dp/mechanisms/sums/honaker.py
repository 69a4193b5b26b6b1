"""Online Honaker-efficient k-ary tree for private continual prefix sums (``"honaker_tree"``).

Layout. Levels ``ℓ = 0..L−1``; node ``(ℓ, i)`` covers steps ``(i−1)k^ℓ + 1 .. i·k^ℓ`` and completes at
step ``i·k^ℓ``. Every step lies in exactly one node per level (the top level ``L−1`` has as many nodes
as needed, so the mechanism never runs out of steps). Level ``ℓ`` gets a share ``w_ℓ >= 0`` of the
budget (``Σ w_ℓ = 1``, ``w_0 > 0``); a level with ``w_ℓ = 0`` draws no noise and releases nothing of
its own. ``arity=2`` with uniform shares is the binary tree of ``tree.py`` with Honaker estimation.

Noise per node (per coordinate of a ``d``-vector; ``Δ₂ = 2R``, replace-one):

* ``noise="gamma"`` (pure ε): K-norm noise of scale ``c_ℓ = Δ₂/(w_ℓ ε)``, cost ``w_ℓ ε`` per node,
  per-coordinate variance ``(d+1)c_ℓ²``;
* ``noise="gaussian"`` ((ε, δ)): ``σ_ℓ = Δ₂ z/√w_ℓ`` with ``z = analytic_gaussian_sigma(ε, δ, 1)``,
  i.e. ``mu_ℓ² = w_ℓ/z²`` per node; an element's nodes jointly form one Gaussian mechanism with
  ``mu² = Σ w_ℓ/z² = 1/z²``, certified with the exact analytic test at ``(ε, δ)``.

Guarantee: ``epsilon``-DP (gamma) or ``(epsilon, delta)``-DP (gaussian), event level (replace one
contribution), forever, for any stream length (a step lies in ≤ one node per level whatever ``t``).

Estimation (Honaker 2015, online/bottom-up form). When node ``N`` completes its estimate is the
inverse-variance combination of its own noisy value and the sum of its ``k`` children's estimates:
``v_ℓ = 1/(1/σ_ℓ² + 1/(k v_{ℓ−1}))`` (``v_0 = σ_0²``; a level without noise has ``v_ℓ = k v_{ℓ−1}``).
This is post-processing and, since a prefix ``[1, t]`` is a disjoint union of completed nodes whose
subtrees hold all completed nodes inside ``[1, t]``, it is the best linear unbiased online estimate
from the tree's nodes. The release at ``t`` sums the estimates of the ``d_ℓ(t)`` completed nodes of
each level under open parents (``d_ℓ`` = base-``k`` digits of ``t``; the top digit is
``⌊t/k^{L−1}⌋``), so ``noise_var(t) = Σ_ℓ d_ℓ(t)·v_ℓ`` exactly; estimates of disjoint subtrees are
independent.

State (``HonakerTreeState``): ``clean``/``est`` of shape ``(L, d)``: row ``ℓ−1`` holds the clean sum and
the summed estimates of the completed children of the open level-``ℓ`` node (``ℓ = 1..L``; row
``L−1`` of ``est`` accumulates the completed top-level nodes). ``2L`` vectors, O(L·d).

Noise keys: ``(stream, purpose, (0, ℓ, i))``, drawn once, at the step node ``(ℓ, i)`` completes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from beam_dp.core.calibration import analytic_gaussian_sigma, certify_gaussian
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, require_within_budget
from beam_dp.core.limits import check_count
from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import GroupState, GroupSteppedSum, NodeNoise, SumSpec
from beam_dp.mechanisms.sums.kary_math import honaker_variances, kary_digits
from beam_dp.mechanisms.sums.tree import MAX_STEP, _check_purpose, _check_step_number, _frozen

__all__ = ["HonakerTreeState", "HonakerTreeSum"]


@dataclass(frozen=True, eq=False)
class HonakerTreeState:
    """State after ``t`` steps: ``clean``/``est`` of shape ``(levels, d)`` (see the module docstring)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    clean: np.ndarray
    est: np.ndarray


class HonakerTreeSum(GroupSteppedSum):
    """k-ary tree with online Honaker estimation and per-level budget shares (module docstring).

    ``arity`` k >= 2, ``levels`` L >= 1, ``level_weights`` (L shares, normalised to sum 1; default
    uniform). ``epsilon_spent`` at ``t`` is the loss of step 1, which lies in the completed nodes
    ``(ℓ, 1)``, ``k^ℓ <= t``, the most of any step: ``Σ w_ℓ ε`` (gamma) or the analytic ε′ of
    ``mu² = Σ w_ℓ/z²`` at ``delta`` (gaussian).
    """

    name = "honaker_tree"
    state_type = HonakerTreeState

    fixed_calibration = "analytic"

    def __init__(self, spec: SumSpec | None = None, /, *, arity: int = 2, levels: int,
                 level_weights: Sequence[float] | None = None, purpose: str = "honaker", **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as
                keywords); the calibration is always exact.
            arity: ``k``, an integer >= 2.
            levels: ``L``, an integer in ``[1, 64]``.
            level_weights: the ``L`` budget shares (finite, >= 0, level 0 positive; normalised to sum 1;
                default uniform).
            purpose: the noise purpose.
        """
        super().__init__(spec, **given)
        arity = check_count("arity", arity, 2)
        levels = check_count("levels", levels, 1, 64)
        weights = np.full(levels, 1.0 / levels) if level_weights is None else np.asarray(level_weights, float)
        if weights.shape != (levels,) or not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights[0] <= 0:
            raise ValueError(f"level_weights must be {levels} finite shares >= 0 with a positive level 0")
        self.arity, self.levels = arity, levels
        self.level_weights = weights / weights.sum()
        self.purpose = _check_purpose(purpose)
        self.guarantee = Guarantee(self.epsilon, self.delta)
        if self.noise_law == "gamma":
            self.level_noise = [
                NodeNoise("gamma", self.sensitivity / (w * self.epsilon), "exact") if w > 0 else None
                for w in self.level_weights
            ]
        else:
            z = analytic_gaussian_sigma(self.epsilon, self.delta, 1.0)
            certify_gaussian(z * self.sensitivity, self.sensitivity, 1, self.epsilon, self.delta)
            self.level_noise = [
                NodeNoise("gaussian", self.sensitivity * z / math.sqrt(w), "analytic") if w > 0 else None
                for w in self.level_weights
            ]
        node_vars = [self.node_variance(n) if n is not None else math.inf for n in self.level_noise]
        self.estimate_vars = honaker_variances(node_vars, self.arity)
        # combination weight of a node's own noisy value (children's sum gets 1 − weight)
        self._own_weight = [
            1.0 if level == 0 else (0.0 if math.isinf(s2) else 1.0 / s2 / (1.0 / s2 + 1.0 / (self.arity * self.estimate_vars[level - 1])))
            for level, s2 in enumerate(node_vars)
        ]
        self._level_loss = [self._node_loss(level) for level in range(self.levels)]
        require_within_budget(self.guarantee, sum(self._level_loss, ElementLoss()), self.name)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _node_loss(self, level: int) -> ElementLoss:
        node = self.level_noise[level]
        if node is None:
            return ElementLoss()
        if node.law == "gamma":
            return ElementLoss.of_noise("gamma", self.sensitivity, node.scale,
                                        pure_epsilon=self.epsilon * float(self.level_weights[level]))
        return ElementLoss.of_noise("gaussian", self.sensitivity, node.scale)

    def node_steps(self, level: int, index: int) -> tuple[int, int]:
        span = self.arity**level
        return (index - 1) * span + 1, index * span

    def nodes_noised_at(self, t: int) -> list[tuple[int, int]]:
        """Nodes ``(ℓ, i)`` completing at ``t`` that carry noise."""
        t = _check_step_number(t)
        out = []
        for level in range(self.levels):
            span = self.arity**level
            if t % span:
                break
            if self.level_noise[level] is not None:
                out.append((level, t // span))
        return out

    def charges_at(self, t: int) -> list[Charge]:
        return [
            Charge(*self.node_steps(level, i), self._level_loss[level], f"{self.purpose}(0, {level}, {i})")
            for level, i in self.nodes_noised_at(t)
        ]

    def noise_var(self, t: int) -> float:
        t = _check_step_number(t)
        return float(kary_digits(t, self.arity, self.levels)[:, 0] @ self.estimate_vars)

    def _worst_loss(self, t: int) -> ElementLoss:
        loss = ElementLoss()
        for level in range(self.levels):
            if self.arity**level > t:
                break
            loss = loss + self._level_loss[level]
        return loss

    # -- the state machine ---------------------------------------------------------------------
    def init_state(self, stream: str) -> HonakerTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        zeros = np.zeros((self.levels, self.dim))
        return HonakerTreeState(stream, 0, _frozen(zeros.copy()), _frozen(zeros))

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        n = len(group.streams)
        clean, est = group.arrays["clean"].copy(), group.arrays["est"].copy()  # (streams, levels, d)
        if clean.shape != (n, self.levels, self.dim) or est.shape != (n, self.levels, self.dim):
            raise ValueError(f"{self.name}: state shape {clean.shape[1:]} does not match {(self.levels, self.dim)}")
        t = group.t + 1
        if t > MAX_STEP:
            raise ValueError(f"step {t} exceeds the supported {MAX_STEP} steps")
        node_clean, node_est = vectors, None
        completed = 0
        for level in range(self.levels):
            span = self.arity**level
            if t % span:
                break
            completed += 1
            if level > 0:  # the open level-ℓ node closes: its children are all complete
                node_clean, children = clean[:, level - 1].copy(), est[:, level - 1].copy()
                clean[:, level - 1] = 0.0
                est[:, level - 1] = 0.0
            law = self.level_noise[level]
            if law is None:
                node_est = children
            else:
                noisy = node_clean + law.draw_group(noise, group.streams, self.purpose, (0, level, t // span), self.dim)
                w = self._own_weight[level]
                node_est = noisy if level == 0 else w * noisy + (1.0 - w) * children
            if level + 1 < self.levels:
                clean[:, level] += node_clean
            est[:, level] += node_est
        estimate = est[:, 0].copy()
        for level in range(1, self.levels):  # level by level: the same rounding for any group size
            estimate += est[:, level]
        new = GroupState(group.streams, t, {"clean": clean, "est": est})
        return new, estimate, self._step_meta(t, completed), self._worst_loss(t)

    def _noise_std(self, t: int) -> float:
        """``sqrt(noise_var(t))``, memoised per step (shared by every stream and group at ``t``)."""
        memo = self.__dict__.setdefault("_std_memo", {})
        hit = memo.get(t)
        if hit is None:
            if len(memo) >= 4096:
                memo.clear()
            hit = memo[t] = math.sqrt(self.noise_var(t))
        return hit

    def _step_meta(self, t: int, completed: int) -> dict[str, Any]:
        """The public facts of step ``t`` (the same for every stream)."""
        return {
            "noise": self.noise_law,
            "arity": self.arity,
            "levels": self.levels,
            "completed_nodes": completed,
            "noise_std": self._noise_std(t),
            "calibration": "exact" if self.noise_law == "gamma" else "analytic",
            "window": None,
        }
