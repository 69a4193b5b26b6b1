"""Private online convex optimisation with privacy expiration: WDP-COCOP and WDP-COCOL.

Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration", Algorithms 1 and 2.
Both are private *follow the approximate leader* (FTAL): the only private quantity, the running
sum of (clipped) gradients ``g_t = Σ_{τ<=t} clip(∇f_τ(x̂_τ), L)``, comes from the foundation's
:class:`~beam_dp.mechanisms.sums.window_tree.WindowTreeSum`; everything released is post-processing
of the tree's estimates ``ĝ_t`` and public quantities.

Guarantee
---------
*Window DP, event level* (neighbouring streams differ in one record; one record per step):
window ε-DP with Gamma/K-norm node noise (``noise="gamma"``, Option I) or window (ε, δ)-DP with
Gaussian node noise (``noise="gaussian"``, Option II): by default (``calibration="analytic"``) the
smallest sigma passing the exact analytic Gaussian test on the tree's joint sensitivity
``Δ₂√L_W``, or Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" eq. 16 certified by that test (``calibration="paper"``).
A record is protected while fewer than ``B = 2^⌈log₂ W⌉ >= W`` later steps have
been released. **Expired records are effectively published**: from ``B`` steps after a record on,
its clipped gradient enters every later ``ĝ_t`` without noise; deploy only where
old data may become public. ``epsilon_spent`` on each release is the tree's worst per-record spend
so far (at most ε, reached once ``t >= 2^{L_W − 1}``).

Sensitivity: the tree is fed ``v_t = clip(∇f_t(x̂_t), L)``; ``x̂_t`` depends only on earlier
releases, so neighbours differ in one ``v_t`` by at most ``2L``. The tree gets
``Δ₂ = max(2L, L + μD)`` (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" uses ``L + μD``; equal when ``μD >= L``, never below the true
bound). Node scale: Gamma ``c_W = Δ₂(⌈log₂W⌉+1)/ε`` (exact), Gaussian the analytic ``σ_W`` or, with
``calibration="paper"``, ``σ_W² = 8Δ₂²(⌈log₂W⌉+1)² ln²(2/δ)/ε²``.

Steps
-----
Step ``t``: receive record ``z_t = (a_t, b_t)`` (features clipped to ``‖a‖ <= 1``), feed ``v_t``,
get ``ĝ_t``, ``S_t = S_{t−1} + x̂_t`` (public), then

* COCOP: ``x̂_{t+1} = Π_C((S_t − ĝ_t/μ)/t)`` (the exact FTAL minimiser);
* COCOL: ``c_t = ĝ_t + μ((t + C_0)x̂_t − S_t − C_0 x_1)``, ``p̂_t = LLO(x̂_t, r_t, c_t)``,
  ``x̂_{t+1} = (1 − α)x̂_t + α p̂_t`` with the paper's constants (§3.3) unless overridden
  (``meta["paper_constants"] = False`` then).

The release at step ``t`` is ``{"x": x̂_{t+1}}`` (the point played next). ``x_1`` is public.

Groups of streams
-----------------
The step is written once, for a group of streams at the same step ``t`` (``init_group``/``stack``/
``unstack``/``step_group``): records ``A (S, d)``, ``b (S,)``; features clipped row-wise, every
stream's gradient in one array expression (a custom loss's callable is applied row by row), row-wise
clipping to ``L``, one window-tree group step, then every row projected (COCOP) or moved by the
oracle (COCOL) through the set's ``project_rows``/``llo_rows``. The per-stream ``step`` is the group
of one. The window tree keys its noise cells per stream, so a stream's releases do not depend on the
group it is stepped in (equal to float rounding of the array operations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

import numpy as np

from beam_dp.core.clipping import clip_l2
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import FreshGroups, GroupState
from beam_dp.mechanisms.online.convex_sets import ConvexSet, make_convex_set
from beam_dp.mechanisms.sums.window_tree import WindowTreeState, WindowTreeSum

__all__ = ["OnlineGroup", "OnlineLoss", "OnlineRecord", "OnlineState", "WDPCOCOL", "WDPCOCOP", "make_online_learner"]

LossKind = Literal["logistic", "squared", "custom"]


@dataclass(frozen=True)
class OnlineRecord:
    """One record: features ``a`` (d,) and a label ``b`` (float)."""

    a: np.ndarray
    b: float


@dataclass(frozen=True)
class OnlineLoss:
    """A loss family ``f(x; a, b)``, μ-strongly convex and L-Lipschitz on ``C``.

    * ``"logistic"``: ``ln(1 + e^{−b⟨a,x⟩}) + (μ/2)‖x‖²``, ``b ∈ {−1, +1}``, ``L = 1 + μR_C``;
    * ``"squared"``: ``½(⟨a,x⟩ − b)² + (μ/2)‖x‖²``, ``|b| <= 1`` (clipped), ``L = (R_C + 1) + μR_C``;
    * ``"custom"``: ``gradient(x, a, b)`` (and optionally ``value``) with a declared ``lipschitz``;
      gradients are clipped to it, so privacy never depends on the declaration being right.

    Features are clipped to ``‖a‖ <= 1`` for the built-in families (their L assumes it); a custom
    loss sees its records as given unless ``clip_features=True``.
    """

    kind: LossKind = "logistic"
    mu: float = 1.0
    lipschitz: float | None = None
    gradient: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None
    value: Callable[[np.ndarray, np.ndarray, float], float] | None = None
    clip_features: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("logistic", "squared", "custom"):
            raise ValueError(f"loss kind must be 'logistic', 'squared' or 'custom', got {self.kind!r}")
        if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu) and self.mu > 0):
            raise ValueError(f"mu (strong convexity) must be finite and > 0, got {self.mu!r}")
        if self.kind == "custom":
            if self.gradient is None or not callable(self.gradient):
                raise ValueError("a custom loss needs a gradient(x, a, b) callable")
            if not (isinstance(self.lipschitz, (int, float)) and math.isfinite(self.lipschitz) and self.lipschitz > 0):
                raise ValueError("a custom loss needs a declared lipschitz bound > 0")

    def lipschitz_on(self, constraint: ConvexSet) -> float:
        if self.kind == "custom":
            return float(self.lipschitz)
        r = constraint.radius
        if self.kind == "logistic":
            return 1.0 + self.mu * r
        return (r + 1.0) + self.mu * r

    def check_labels(self, b: np.ndarray) -> np.ndarray:
        """The labels ``(n,)`` the loss uses: logistic needs ±1 (``ValueError`` otherwise), squared clips
        to [−1, 1]."""
        if not np.isfinite(b).all():
            raise ValueError("non_finite: label")
        if self.kind == "logistic":
            if not (np.abs(b) == 1.0).all():
                raise ValueError("bad_value: logistic labels must be -1 or +1")
            return b
        if self.kind == "squared":
            return np.clip(b, -1.0, 1.0)
        return b

    def features(self, A: np.ndarray) -> np.ndarray:
        """Features ``(n, d)`` as the loss sees them: rows scaled to L2 norm <= 1 where clipped."""
        if not (self.kind != "custom" if self.clip_features is None else self.clip_features):
            return A
        return clip_l2(A, 1.0)[0] if len(A) else A  # unclipped rows unchanged exactly

    def grad(self, x: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
        """``∇f(x; a, b)`` of one record (the batch of one of ``grad_rows``)."""
        return self.grad_rows(x[None, :], a[None, :], np.array([b], dtype=np.float64))[0]

    def grad_rows(self, X: np.ndarray, A: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``∇f(X[i]; A[i], b[i])`` of every row: one array expression for the built-in families; a
        custom loss's ``gradient`` callable is called once per row."""
        if self.kind == "custom":
            return np.array([self.gradient(x, a, float(bi)) for x, a, bi in zip(X, A, b)], dtype=np.float64).reshape(X.shape)
        inner = np.einsum("ij,ij->i", A, X)
        if self.kind == "logistic":
            m = -b * inner
            live = m > -700  # below, e^{-m} overflows and the logistic factor is 0 to double precision
            coef = np.where(live, -b / (1.0 + np.exp(-np.where(live, m, 0.0))), 0.0)
        else:
            coef = inner - b
        return coef[:, None] * A + self.mu * X

    def loss(self, x: np.ndarray, a: np.ndarray, b: float) -> float:
        if self.kind == "logistic":
            return float(np.logaddexp(0.0, -b * float(a @ x)) + 0.5 * self.mu * float(x @ x))
        if self.kind == "squared":
            return float(0.5 * (float(a @ x) - b) ** 2 + 0.5 * self.mu * float(x @ x))
        if self.value is None:
            raise ValueError("this custom loss has no value callable")
        return float(self.value(x, a, b))


@dataclass(frozen=True, eq=False)
class OnlineState:
    """State after ``t`` steps: ``x`` = x̂_{t+1} (next point, public), ``S`` = Σ_{τ<=t} x̂_τ (public),
    ``tree`` = the window tree's state (raw gradient prefix sums: never released)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    x: np.ndarray
    S: np.ndarray
    tree: WindowTreeState


@dataclass(frozen=True, eq=False)
class OnlineGroup:
    """States of a group of streams, all after ``t`` steps: ``x`` and ``S`` ``(streams, d)`` (public,
    row ``i`` is stream ``i``'s) and ``tree``, the window tree's group state (raw: never released)."""

    streams: tuple[str, ...]
    t: int
    x: np.ndarray
    S: np.ndarray
    tree: GroupState


@dataclass(frozen=True, eq=False)
class _OnlineWire:
    """Byte form of :class:`OnlineState` (the tree state nested as its own encoding)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    x: np.ndarray
    S: np.ndarray
    tree: np.ndarray


class _PrivateFTAL(FreshGroups):
    """Shared machinery of WDP-COCOP/COCOL (see the module docstring)."""

    name = "private_ftal"
    state_type = OnlineState

    def __init__(
        self,
        *,
        dim: int,
        constraint: Any,
        loss: OnlineLoss | str = "logistic",
        mu: float | None = None,
        epsilon: float,
        delta: float = 0.0,
        noise: Literal["gamma", "gaussian"] = "gamma",
        window: int,
        calibration: Literal["paper", "analytic"] = "analytic",
        x1: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        self.constraint = make_convex_set(constraint, dim)
        self.dim = self.constraint.dim
        if isinstance(loss, str):
            loss = OnlineLoss(kind=loss, mu=1.0 if mu is None else mu)  # type: ignore[arg-type]
        elif mu is not None and mu != loss.mu:
            raise ValueError("give mu either in the OnlineLoss or as mu=, not both differently")
        if not isinstance(loss, OnlineLoss):
            raise ValueError(f"loss must be an OnlineLoss or a family name, got {loss!r}")
        self.loss = loss
        self.mu = float(loss.mu)
        self.lipschitz = self.loss.lipschitz_on(self.constraint)
        self.diameter = float(self.constraint.diameter)
        self.sensitivity = max(2.0 * self.lipschitz, self.lipschitz + self.mu * self.diameter)
        self.tree = WindowTreeSum(
            dim=self.dim, epsilon=epsilon, delta=delta, sensitivity=self.sensitivity, noise=noise,
            calibration=calibration, window=window,
        )
        self.guarantee = self.tree.guarantee
        start = self.constraint.start_point() if x1 is None else np.asarray(x1, dtype=np.float64)
        if start.shape != (self.dim,) or not np.all(np.isfinite(start)) or not self.constraint.contains(start, 1e-9):
            raise ValueError("x1 must be a finite point of the constraint set")
        self.x1 = start
        self.x1.setflags(write=False)

    # -- the Mechanism protocol --------------------------------------------------------------
    def init_state(self, stream: str) -> OnlineState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return OnlineState(stream, 0, self.x1.copy(), np.zeros(self.dim), self.tree.init_state(stream))

    def encode_state(self, state: OnlineState) -> bytes:
        tree = np.frombuffer(self.tree.encode_state(state.tree), dtype=np.uint8)
        return encode_state(_OnlineWire(state.stream, state.t, state.x, state.S, tree))

    def decode_state(self, data: bytes) -> OnlineState:
        wire = decode_state(_OnlineWire, data)
        return OnlineState(wire.stream, wire.t, wire.x, wire.S, self.tree.decode_state(wire.tree.tobytes()))

    def merge_blocks(self, items: list) -> OnlineRecord:
        """One record per step: a step is exactly one buffered record."""
        if len(items) != 1:
            raise ValueError(f"online learners take exactly one record per step, got {len(items)}")
        return items[0]

    @staticmethod
    def block_count(item: Any) -> int:
        return 1

    def record(self, a: Any, b: Any) -> OnlineRecord:
        """Validate and normalise one record (``ValueError`` whose text starts with a dead-letter
        reason: ``wrong_shape``, ``non_finite``, ``bad_value``)."""
        A, labels = self._one_record(a, b)
        return OnlineRecord(A[0], float(labels[0]))

    def _one_record(self, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`record` as the arrays of a group of one: features ``(1, d)`` and labels ``(1,)``."""
        A = self._feature_rows(a, (self.dim,))
        try:
            label = float(b)
        except (TypeError, ValueError):
            raise ValueError("bad_value: label is not a number") from None
        return A, self.loss.check_labels(np.array([label]))

    def records(self, A: Any, b: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Validate and normalise the records of ``n`` streams: features ``(n, d)`` and labels ``(n,)``,
        refused with the ``ValueError`` reasons of :meth:`record` if any row is bad."""
        rows = self._feature_rows(A, (n, self.dim))
        try:
            labels = np.asarray(b, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("bad_value: label is not a number") from None
        if labels.shape != (n,):
            raise ValueError(f"wrong_shape: expected labels of shape ({n},), got {labels.shape}")
        return rows, self.loss.check_labels(labels)

    def _feature_rows(self, a: Any, shape: tuple[int, ...]) -> np.ndarray:
        arr = np.asarray(a, dtype=np.float64)
        if arr.shape != shape:
            raise ValueError(f"wrong_shape: expected features of shape {shape}, got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError("non_finite: features")
        return self.loss.features(arr.reshape(-1, self.dim))

    # -- groups of streams -------------------------------------------------------------------
    def stack(self, states: Sequence[OnlineState]) -> OnlineGroup:
        """One group from per-stream states that are all at the same step."""
        for state in states:
            if not isinstance(state, OnlineState):
                raise TypeError(f"{self.name} expects an OnlineState, got {type(state).__name__}")
        if any(state.tree.stream != state.stream for state in states):
            raise ValueError("a learner state's window tree belongs to another stream")
        tree = self.tree.stack([state.tree for state in states])  # refuses an empty list and mixed steps
        if len(states) == 1:  # the per-stream path: views, no copies
            x, S = states[0].x[None, :], states[0].S[None, :]
        else:
            x, S = np.stack([state.x for state in states]), np.stack([state.S for state in states])
        return OnlineGroup(tree.streams, tree.t, x, S, tree)

    def unstack(self, group: OnlineGroup) -> list[OnlineState]:
        """The per-stream states of a group (read-only rows of the group's arrays: steps never write
        into an array a state holds)."""
        trees = self.tree.unstack(group.tree)
        return [OnlineState(s, group.t, _row(group.x, i), _row(group.S, i), trees[i]) for i, s in enumerate(group.streams)]

    def step_group(self, group: OnlineGroup, A: Any, b: Any, noise: NoiseSource) -> tuple[OnlineGroup, ReleaseBatch]:
        """Feed step ``t + 1`` of every stream of the group: one record per stream, features ``A (S, d)``
        and labels ``b (S,)`` (row ``i`` is stream ``i``'s). A bad row refuses the whole step
        (``ValueError`` with :meth:`record`'s reasons, or "non-finite gradient" from a custom loss)
        and changes nothing. The batch's rows are the releases each stream's :meth:`step` makes."""
        rows, labels = self.records(A, b, len(group.streams))
        return self._advance_group(group, rows, labels, noise)

    def step(self, state: OnlineState, block: Any, noise: NoiseSource) -> tuple[OnlineState, list[Release]]:
        """One step of one stream: the group of one of :meth:`step_group`."""
        if isinstance(block, OnlineRecord):
            A, b = self._one_record(block.a, block.b)  # never trust an unnormalised record
        elif isinstance(block, tuple) and len(block) == 2:
            A, b = self._one_record(*block)
        else:
            raise ValueError("an online step needs one record (features, label)")
        group, batch = self._advance_group(self.stack([state]), A, b, noise)
        return self.unstack(group)[0], batch.rows()

    def _advance_group(
        self, group: OnlineGroup, A: np.ndarray, b: np.ndarray, noise: NoiseSource
    ) -> tuple[OnlineGroup, ReleaseBatch]:
        """The step on validated, normalised records (see the module docstring)."""
        if group.x.shape != (len(group.streams), self.dim) or group.S.shape != group.x.shape:
            raise ValueError(f"learner state does not match: x {group.x.shape}, S {group.S.shape} for "
                             f"{len(group.streams)} streams of dim {self.dim}")
        grads = self.loss.grad_rows(group.x, A, b)
        # A custom loss may overflow on a finite record: that row contributes the public zero vector
        # (norm 0 <= L, so the 2L replace-one bound is unchanged) instead of refusing the step, which
        # would make whether the group releases depend on the data.
        grads = np.where(np.isfinite(grads).all(axis=1)[:, None], grads, 0.0)
        # one contribution per stream of norm <= L <= Δ₂/2 (the tree's R): a clipped sum of count 1
        v, _ = clip_l2(grads, self.lipschitz)
        tree, tree_batch = self.tree.step_group(group.tree, v, np.ones(len(group.streams)), noise)
        t = group.t + 1
        S = group.S + group.x
        x_next, extra = self._update_rows(t, group.x, S, tree_batch.values)
        meta = {
            "window": self.tree.block,
            "window_requested": self.tree.window,
            "noise": self.tree.node_noise.law,
            "scale": self.tree.node_noise.scale,
            "calibration": self.tree.node_noise.calibration,
            "noisy_nodes": tree_batch.meta["noisy_nodes"],
            "sensitivity": self.sensitivity,
            "lipschitz": self.lipschitz,
            "mu": self.mu,
            "constraint": self.constraint.kind,
            **extra,
        }
        batch = ReleaseBatch(group.streams, t, self.name, x_next, tree_batch.epsilon_spent, tree_batch.delta_spent,
                             meta, value_name="x", noise=tree_batch.noise)  # post-processing of the tree
        return OnlineGroup(group.streams, t, batch.values, S, tree), batch

    def run(self, stream: str, records: Sequence[Any], noise: NoiseSource) -> list[Release]:
        """Convenience: feed ``records`` (``(a, b)`` pairs or ``OnlineRecord``s) from a fresh state."""
        state = self.init_state(stream)
        out = []
        for rec in records:
            state, releases = self.step(state, rec, noise)
            out.extend(releases)
        return out

    def _update_rows(self, t: int, X: np.ndarray, S: np.ndarray, ghat: np.ndarray) -> tuple[np.ndarray, dict]:
        """``x̂_{t+1}`` of every stream ``(streams, d)`` from its ``x̂_t``, ``S_t`` and ``ĝ_t`` rows, and the
        step's public meta (the same for every stream)."""
        raise NotImplementedError


class WDPCOCOP(_PrivateFTAL):
    """WDP-COCOP (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration", Algorithm 1): private FTAL with projection onto ``C``.

    Guarantee and spend: see the module docstring (window ε-DP / (ε, δ)-DP over the last
    ``B = 2^⌈log₂W⌉`` steps, event level, one record per step; expired records are published).
    Cost per step: one window-tree step ``O(d log W)`` plus one projection.
    """

    name = "wdp_cocop"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.constraint.has_projection:
            raise ValueError(f"WDP-COCOP needs a projection onto the constraint set; {self.constraint.kind} has none")

    def _update_rows(self, t, X, S, ghat):
        return self.constraint.project_rows((S - ghat / self.mu) / t), {}


class WDPCOCOL(_PrivateFTAL):
    """WDP-COCOL (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration", Algorithm 2): projection-free private FTAL with one local linear oracle
    call per step on a polytope ``P`` (simplex, L1 ball, box, vertex/halfspace polytope).

    Constants (``ρ = c_P√d`` from the set, ``ℓ_W = max(1, ⌈log₂W⌉)``, ``β`` only
    shapes step sizes): ``α = 1/(5ρ²)``, ``C_0 = (25ρ²)²``,
    ``C_W = 2α d ℓ_W^{1.5} ln(d/β)/((1−α)ε)`` (Gamma) or ``2α √d ℓ_W^{1.5} ln(1/β)/((1−α)ε)``
    (Gaussian), ``C_1 = 26ρ²(L + μD)(1 + C_W)``, ``η_t = C_1²/(μ(t + C_0))``,
    ``r_t = √(4η_t/(μ(t + C_0)) + 2(L + μD)/(μ(t + C_0)))``. ``alpha``/``C0`` may be overridden
    (privacy-neutral); releases then carry ``meta["paper_constants"] = False``.
    Same guarantee as WDP-COCOP; every ``x̂_{t+1}`` is a convex combination of points of ``P``.
    """

    name = "wdp_cocol"

    def __init__(self, *, beta: float = 0.05, alpha: float | None = None, C0: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        C = self.constraint
        if not C.has_llo:
            raise ValueError(f"WDP-COCOL needs a polytope with a local linear oracle; {C.kind} has none")
        if not (isinstance(beta, (int, float)) and 0 < beta < 1):
            raise ValueError(f"beta must lie in (0, 1), got {beta!r}")
        rho2 = C.rho**2
        d = self.dim
        self.beta = float(beta)
        self.paper_constants = alpha is None and C0 is None
        self.alpha = 1.0 / (5.0 * rho2) if alpha is None else float(alpha)
        self.C0 = (25.0 * rho2) ** 2 if C0 is None else float(C0)
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
        if not (math.isfinite(self.C0) and self.C0 >= 0):
            raise ValueError(f"C0 must be finite and >= 0, got {C0!r}")
        ell = max(1, (self.tree.window - 1).bit_length())  # max(1, ⌈log₂ W⌉)
        eps = self.guarantee.epsilon
        a = 1.0 / (5.0 * rho2)  # C_W and C_1 use the paper's α even if the step α is overridden
        if self.tree.node_noise.law == "gamma":
            self.CW = 2.0 * a * d * ell**1.5 * math.log(d / self.beta) / ((1.0 - a) * eps)
        else:
            self.CW = 2.0 * a * math.sqrt(d) * ell**1.5 * math.log(1.0 / self.beta) / ((1.0 - a) * eps)
        self.G = self.lipschitz + self.mu * self.diameter
        self.C1 = 26.0 * rho2 * self.G * (1.0 + self.CW)

    def schedule(self, t: int) -> tuple[float, float]:
        """``(η_t, r_t)``"""
        denom = self.mu * (t + self.C0)
        eta = self.C1**2 / denom
        return eta, math.sqrt(4.0 * eta / denom + 2.0 * self.G / denom)

    def _update_rows(self, t, X, S, ghat):
        eta, r = self.schedule(t)
        c = ghat + self.mu * ((t + self.C0) * X - S - self.C0 * self.x1)
        p = self.constraint.llo_rows(X, r, c)
        x_next = (1.0 - self.alpha) * X + self.alpha * p
        return x_next, {"eta_t": eta, "r_t": r, "alpha": self.alpha, "C0": self.C0,
                        "paper_constants": self.paper_constants}


def _row(arr: np.ndarray, i: int) -> np.ndarray:
    """Read-only view of row ``i`` (a state's array; steps make new arrays, never write rows)."""
    out = arr[i]
    out.flags.writeable = False
    return out


def make_online_learner(algorithm: Literal["cocop", "cocol"], **kwargs: Any) -> _PrivateFTAL:
    """``WDPCOCOP`` (``"cocop"``) or ``WDPCOCOL`` (``"cocol"``) from keyword parameters."""
    if algorithm == "cocop":
        kwargs.pop("beta", None)
        return WDPCOCOP(**kwargs)
    if algorithm == "cocol":
        return WDPCOCOL(**kwargs)
    raise ValueError(f"algorithm must be 'cocop' or 'cocol', got {algorithm!r}")
