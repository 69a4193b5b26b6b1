"""Private incremental regression: PRIVINCERM, PRIVINCREG₁, PRIVINCREG₂ and NOISYPROJGRAD.

Kasiviswanathan, Nissim & Jin, "Private Incremental Regression": Mechanism 1, Algorithms 2 and 3, Appendix C;
At every step ``t`` the mechanisms release
``θ_t ∈ C`` approximately minimising the least-squares loss ``L(θ; Γ_t) = Σ_{i<=t}(y_i − ⟨x_i, θ⟩)²``.

Neighbours and normalisation
----------------------------
Event level: neighbouring streams differ in one record ``(x, y)`` (replace-one). Every record is
normalised before it touches state: ``x ← x/max(1, ‖x‖)``, ``y ← clip(y, −1, 1)``. A step
may hold several records (event-time steps or blocks); the trees sum them.

* :class:`PrivIncReg1` — two Gaussian tree mechanisms (foundation :func:`make_tree_sum`, purposes
  ``"tree-q"`` and ``"tree-Q"``, so they never share noise) over ``x·y ∈ R^d`` and ``x xᵀ`` flattened
  row-major to ``R^{d²}``; both have ``Δ₂ = 2`` (Frobenius for the matrix) and budget
  ``(ε/2, δ/2)``: **(ε, δ)-DP forever**. The private gradient ``g_t(θ) = 2(Q̂_t θ − q̂_t)`` is
  post-processing; ``θ_t = NOISYPROJGRAD`` with the paper's ``α_t``, ``L_t``, ``r_t`` (capped at
  ``r_max``) and a warm start.
* :class:`PrivIncReg2` — the same on Gaussian-projected inputs ``w = Φx̃ ∈ R^m`` (``‖w‖ = ‖x‖``),
  solved over ``ΦC`` and lifted back to ``C`` by the Minkowski functional (L1/L2 balls).
  **(ε, δ)-DP forever**; Φ is public (fixed seed, data-independent).
* :class:`PrivIncERM` — reruns an (ε′, δ′)-DP batch solver every ``τ`` steps on all records so
  far; ``ε′ = ε/(2√(2l ln(2/δ)))``, ``δ′ = δ/(2l)``, ``l = ⌈T/τ⌉`` (advanced composition, Kasiviswanathan, Nissim & Jin, "Private Incremental Regression"
  Thm A.4 with ``δ* = δ/2``): **(ε, δ)-DP over the horizon T**. Default solver: noisy projected
  gradient descent (zCDP), whose composition is reported exactly (jointly Gaussian).

``epsilon_spent``/``delta_spent`` on each release is the worst per-record loss so far (never above
the guarantee). Releases are ``{"theta": θ_t}`` every ``release_every`` steps (post-processing;
skipping releases saves solver time only).

Groups of streams (PRIVINCREG₁)
-------------------------------
The PRIVINCREG step is written once, for a group of streams at the same step ``t``
(``init_group``/``stack``/``unstack``/``step_group``): the records of all streams ``(n, d)`` with
the stream of each row; both trees clip and sum them per stream (``clip_and_sum_groups``) and take
one group step; ``r_t``/``η_t`` depend on ``t`` only (public), so NOISYPROJGRAD runs on every
stream's row at once (gradients by one batched matrix product, the set's ``project_rows``). The
per-stream ``step`` is the group of one. The trees key their noise per stream, so a stream's
releases do not depend on its group (equal to float rounding of the array operations).
PRIVINCREG₂ shares this code but steps one stream at a time: its projection and lift are one
inner solve per point and its releases carry a per-stream ``meta["lift_fallback"]``, which the
group's shared meta cannot hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

import numpy as np

from beam_dp.core.accounting.regression import advanced_composition
from beam_dp.core.calibration import certify_gaussian
from beam_dp.core.clipping import clip_l2
from beam_dp.core.guarantee import ElementLoss, Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import account, combined_declaration, declaration_json
from beam_dp.core.release import Release
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import FreshGroups, GroupState, _frozen_copy
from beam_dp.mechanisms.online.convex_sets import (
    ConvexSet,
    L1Ball,
    L2Ball,
    gaussian_width_sparse,
    gaussian_width_unit_l2,
    make_convex_set,
)
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.mechanisms.torch_device import check_device

__all__ = [
    "NoisyGradientDescent",
    "PrivIncERM",
    "PrivIncReg1",
    "PrivIncReg2",
    "RegGroup",
    "RegState",
    "RegressionBlock",
    "make_incremental_regression",
    "noisy_proj_grad",
    "normalise_records",
    "tau_schedule",
]


# ---------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RegressionBlock:
    """The records of one step: features ``X`` (n, d) and labels ``y`` (n,), already validated."""

    X: np.ndarray
    y: np.ndarray


def normalise_records(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``x ← x/max(1, ‖x‖)``, ``y ← clip(y, −1, 1)``; returns ``(X, y, #x clipped, #y clipped)``."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if X.shape[0] == 0:
        return X, y, 0, 0
    Xc, xc = clip_l2(X, 1.0)
    yc = np.clip(y, -1.0, 1.0)
    return Xc, yc, int(xc.sum()), int((yc != y).sum())


def noisy_proj_grad(
    grad: Callable[[np.ndarray], np.ndarray],
    project: Callable[[np.ndarray, Any], tuple[np.ndarray, Any]],
    r: int,
    eta: float,
    start: np.ndarray,
    start_aux: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """NOISYPROJGRAD (Kasiviswanathan, Nissim & Jin, "Private Incremental Regression" App. C): ``θ_{k+1} = Π(θ_k − η g(θ_k))`` for ``k = 1..r``; returns the
    average of ``θ_1..θ_r`` (the last iterate is not averaged) and the average of the projection's
    auxiliary outputs (PRIVINCREG₂'s preimages; ``None`` if unused). ``start`` may be a point or a
    ``(streams, m)`` array of points sharing ``r`` and ``η`` (``grad``/``project`` then act row-wise).

    ``project(v, aux) -> (point, aux)`` gets the current aux as a warm start. Guarantee (Prop. C.1
    with the safe constants of): if ``‖g − ∇f‖ <= α`` on C, f convex and L-Lipschitz on C,
    ``η = R_C/(√r (α + L))``: ``f(θ̄) − f* <= 2.5 R_C (L + α)/√r + 2α R_C``.
    """
    theta, aux = start, start_aux
    total = np.zeros_like(start)
    total_aux = None if aux is None else np.zeros_like(aux)
    for _ in range(int(r)):
        total += theta
        if total_aux is not None:
            total_aux += aux
        theta, aux = project(theta - eta * grad(theta), aux)
    mean_aux = None if total_aux is None else total_aux / r
    return total / r, mean_aux


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class _RegressionBase:
    """Record validation, block merging, state encoding and release cadence shared by the family."""

    name = "incremental_regression"
    dim: int
    constraint: ConvexSet
    guarantee: Guarantee
    release_every: int

    def _setup_common(self, dim: Any, constraint: Any, release_every: Any) -> None:
        self.dim = _check_int("dim", dim)
        self.constraint = make_convex_set(constraint, self.dim)
        if not self.constraint.has_projection:
            raise ValueError(f"{self.name} needs a projection onto the constraint set; {self.constraint.kind} has none")
        self.release_every = _check_int("release_every", release_every)

    def record(self, x: Any, y: Any) -> tuple[np.ndarray, float]:
        """Validate one record; ``ValueError`` text starts with a dead-letter reason
        (``wrong_shape``, ``non_finite``, ``bad_value``). ``|y| > 1`` is clipped, not rejected."""
        arr = np.asarray(x, dtype=np.float64)
        if arr.shape != (self.dim,):
            raise ValueError(f"wrong_shape: expected features of shape ({self.dim},), got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("non_finite: features")
        try:
            label = float(y)
        except (TypeError, ValueError):
            raise ValueError("bad_value: label is not a number") from None
        if not math.isfinite(label):
            raise ValueError("non_finite: label")
        return arr, label

    def records(self, X: Any, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Validate ``n`` records at once: features ``(n, d)`` and labels ``(n,)``, refused with the
        ``ValueError`` reasons of :meth:`record` if any row is bad."""
        arr = np.asarray(X, dtype=np.float64)
        if arr.shape != (n, self.dim):
            raise ValueError(f"wrong_shape: expected features of shape {(n, self.dim)}, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("non_finite: features")
        try:
            labels = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("bad_value: label is not a number") from None
        if labels.shape != (n,):
            raise ValueError(f"wrong_shape: expected labels of shape ({n},), got {labels.shape}")
        if not np.all(np.isfinite(labels)):
            raise ValueError("non_finite: label")
        return arr, labels

    def merge_blocks(self, items: list) -> RegressionBlock:
        """The records buffered for one step, in arrival order."""
        if not items:
            return RegressionBlock(np.zeros((0, self.dim)), np.zeros(0))
        X = np.stack([np.asarray(x, dtype=np.float64) for x, _ in items])
        y = np.array([float(v) for _, v in items])
        return RegressionBlock(X, y)

    @staticmethod
    def block_count(item: Any) -> int:
        return 1

    def _block(self, block: Any) -> tuple[np.ndarray, np.ndarray]:
        """Validated, normalised ``(X, y)`` of a step (``None`` = empty step)."""
        if block is None:
            return np.zeros((0, self.dim)), np.zeros(0)
        if isinstance(block, tuple) and len(block) == 2 and np.ndim(block[1]) == 0:
            block = self.merge_blocks([block])
        elif isinstance(block, list):
            block = self.merge_blocks(block)
        if not isinstance(block, RegressionBlock):
            raise ValueError("a regression step needs a RegressionBlock, a (x, y) record or a list of them")
        return self._records(block.X, block.y)

    def _records(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        """Validated, normalised records ``X (n, d)``, ``y (n,)`` (``ValueError`` if malformed or non-finite)."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if X.ndim != 2 or X.shape[1] != self.dim or X.shape[0] != y.shape[0]:
            raise ValueError(f"expected X of shape (n, {self.dim}) and y of shape (n,), got {X.shape}, {y.shape}")
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
            raise ValueError("non-finite records must be dead-lettered before they reach the mechanism")
        X, y, _, _ = normalise_records(X, y)
        return X, y

    def run(self, stream: str, blocks: Sequence[Any], noise: NoiseSource) -> list[Release]:
        """Convenience: feed ``blocks`` (one per step) from a fresh state."""
        state = self.init_state(stream)  # type: ignore[attr-defined]
        out: list[Release] = []
        for block in blocks:
            state, releases = self.step(state, block, noise)  # type: ignore[attr-defined]
            out.extend(releases)
        return out


# ---------------------------------------------------------------------------------------------
# PRIVINCREG₁ and PRIVINCREG₂
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RegState:
    """State of PRIVINCREG₁/₂ after ``t`` steps. ``theta``/``aux``: last release (and its preimage,
    PRIVINCREG₂) for the warm start; ``q_hat``/``Q_hat``: the trees' latest *noisy* sums (safe to
    keep); ``tree_q``/``tree_Q``: the trees' encoded states (raw sums; never released)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    theta: np.ndarray
    aux: np.ndarray
    q_hat: np.ndarray
    Q_hat: np.ndarray
    tree_q: Any
    tree_Q: Any


@dataclass(frozen=True, eq=False)
class RegGroup:
    """States of a group of streams, all after ``t`` steps: the :class:`RegState` arrays stacked on a
    leading stream axis (``theta``/``aux`` ``(streams, ·)``, ``q_hat (streams, m)``, ``Q_hat
    (streams, m²)``, row ``i`` is stream ``i``'s) and the trees' group states (raw: never released)."""

    streams: tuple[str, ...]
    t: int
    theta: np.ndarray
    aux: np.ndarray
    q_hat: np.ndarray
    Q_hat: np.ndarray
    tree_q: GroupState
    tree_Q: GroupState


class PrivIncReg1(FreshGroups, _RegressionBase):
    """PRIVINCREG₁ (Kasiviswanathan, Nissim & Jin, "Private Incremental Regression", Algorithm 2): tree-maintained private gradient + NOISYPROJGRAD.

    Guarantee: (ε, δ)-DP, event level (replace one record), forever (``horizon=None``: hybrid trees)
    or up to ``horizon`` (plain trees, steps beyond it refused). Each tree is Gaussian at
    ``(ε/2, δ/2)`` with ``Δ₂ = 2`` (``sigma_tree_004`` certified by the analytic Gaussian test, or the
    exact sigma with ``calibration="analytic"``); ``epsilon_spent``/``delta_spent`` add the two trees'
    spends (basic composition).

    Per step: ``u = √(2 ln(2/β))``, ``s² = noise_var(t)`` of each tree,
    ``α_t = 2R_C s_Q(2√d + u) + 2 s_q(√d + u)`` (w.p. ``1 − β`` the gradient error on C is below it),
    ``L_t = 2t(R_C + 1)``, ``r_t = min(r_max, ⌈(1 + L_t/α_t)²⌉)``, ``η_t = R_C/(√r_t(α_t + L_t))``,
    ``θ_t = NOISYPROJGRAD(C, g_t, r_t, η_t, θ_{t−1})`` (first start ``Π_C(0)``). Meta carries
    ``alpha_t, r_t, r_capped, m, m_capped``.

    ``backend="torch"`` runs both trees and the gradient ``Q̂θ`` on ``device`` ("cpu" default, "cuda",
    "auto"; :mod:`beam_dp.mechanisms.online.regression_torch`): the same noise cells and guarantee, releases
    equal to numpy's up to float64 rounding; for ``d`` in the thousands on a GPU. Pin one backend per job.
    """

    name = "privincreg1"

    def __init__(
        self,
        *,
        dim: int,
        constraint: Any = "l2_ball",
        epsilon: float,
        delta: float,
        horizon: int | None = None,
        unbounded: Literal["hybrid", "doubling"] = "hybrid",
        calibration: Literal["paper", "analytic"] = "paper",
        beta: float = 0.05,
        r_max: int = 1000,
        symmetrize: bool = False,
        release_every: int = 1,
        backend: Literal["numpy", "torch"] = "numpy",
        device: str = "cpu",
    ) -> None:
        self._setup_common(dim, constraint, release_every)
        eps = _check_positive("epsilon", epsilon)
        if backend not in ("numpy", "torch"):
            raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")
        self.backend, self.device = backend, check_device(device)
        if not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise ValueError(f"PRIVINCREG needs 0 < delta < 1 (Gaussian trees), got {delta!r}")
        if not (isinstance(beta, (int, float)) and 0 < beta < 1):
            raise ValueError(f"beta must lie in (0, 1), got {beta!r}")
        self.beta = float(beta)
        self.r_max = _check_int("r_max", r_max)
        self.symmetrize = bool(symmetrize)
        self.horizon = horizon
        self.guarantee = Guarantee(eps, float(delta))
        self._setup_space()
        common = dict(horizon=horizon, unbounded=unbounded, epsilon=eps / 2.0, delta=float(delta) / 2.0,
                      sensitivity=2.0, noise="gaussian", calibration=calibration)
        #: the trees' public parameters, in every release's meta for the verifier's recompute
        self.tree_meta = {"horizon": horizon, "unbounded": unbounded, "calibration": calibration}
        self.tree_q = make_tree_sum(dim=self.m, purpose="tree-q", **common)
        self.tree_Q = make_tree_sum(dim=self.m * self.m, purpose="tree-Q", **common)
        if backend == "torch":
            from beam_dp.mechanisms.online.regression_torch import DeviceTree

            self.tree_q, self.tree_Q = DeviceTree(self.tree_q, device), DeviceTree(self.tree_Q, device)
        self._u = math.sqrt(2.0 * math.log(2.0 / self.beta))

    # -- the solve space (PRIVINCREG₁: C itself) --------------------------------------------
    def _setup_space(self) -> None:
        self.m = self.dim
        self.m_capped = False
        self.space_radius = float(self.constraint.radius)

    def _features(self, X: np.ndarray) -> np.ndarray:
        return X

    def _start(self) -> tuple[np.ndarray, np.ndarray]:
        theta = self.constraint.start_point()
        return theta, theta.copy()

    def _project_rows(self, V: np.ndarray, aux: Any) -> tuple[np.ndarray, Any]:
        """``Π_C`` of every row of ``V (streams, m)`` (and the aux NOISYPROJGRAD averages)."""
        points = self.constraint.project_rows(V)
        return points, points

    def _finish_rows(self, points: np.ndarray, aux: np.ndarray) -> tuple[np.ndarray, dict]:
        """The released ``θ`` of every row and the step's extra meta."""
        return points, {}

    # -- state --------------------------------------------------------------------------------
    def init_state(self, stream: str) -> RegState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        theta, aux = self._start()
        return RegState(stream, 0, theta, aux, np.zeros(self.m), np.zeros(self.m * self.m),
                        self.tree_q.init_state(stream), self.tree_Q.init_state(stream))

    def encode_state(self, state: RegState) -> bytes:
        wire = RegState(state.stream, state.t, state.theta, state.aux, state.q_hat, state.Q_hat,
                        np.frombuffer(self.tree_q.encode_state(state.tree_q), dtype=np.uint8),
                        np.frombuffer(self.tree_Q.encode_state(state.tree_Q), dtype=np.uint8))
        return encode_state(wire)

    def decode_state(self, data: bytes) -> RegState:
        w = decode_state(RegState, data)
        return RegState(w.stream, w.t, w.theta, w.aux, w.q_hat, w.Q_hat,
                        self.tree_q.decode_state(w.tree_q.tobytes()), self.tree_Q.decode_state(w.tree_Q.tobytes()))

    def _gradient(self, rq: Any, rQ: Any) -> Callable[[np.ndarray], np.ndarray]:
        """The private gradient ``θ ↦ 2(Q̂θ − q̂)`` of every stream's row (post-processing of the trees)."""
        if self.backend == "torch":
            from beam_dp.mechanisms.online.regression_torch import device_gradient

            return device_gradient(rq, rQ, self.m, self.symmetrize)
        Q, q_hat = rQ.values.reshape(-1, self.m, self.m), rq.values
        if self.symmetrize:
            Q = 0.5 * (Q + Q.transpose(0, 2, 1))
        return lambda th: 2.0 * (np.matmul(Q, th[:, :, None])[:, :, 0] - q_hat)

    # -- accuracy schedule (public: depends on t and the trees' noise variances only) --------------
    def schedule(self, t: int) -> dict:
        """``alpha_t, L_t, r_t, eta_t`` at step ``t``."""
        m, R = self.m, self.space_radius
        s_q = math.sqrt(self.tree_q.noise_var(t))
        s_Q = math.sqrt(self.tree_Q.noise_var(t))
        alpha = 2.0 * R * s_Q * (2.0 * math.sqrt(m) + self._u) + 2.0 * s_q * (math.sqrt(m) + self._u)
        lip = 2.0 * t * (R + 1.0)
        wanted = math.ceil((1.0 + lip / alpha) ** 2) if alpha > 0 else self.r_max
        r = min(self.r_max, wanted)
        eta = R / (math.sqrt(r) * (alpha + lip))
        return {"alpha_t": alpha, "L_t": lip, "r_t": int(r), "r_capped": bool(wanted > self.r_max), "eta_t": eta}

    # -- groups of streams -------------------------------------------------------------------
    def stack(self, states: Sequence[RegState]) -> RegGroup:
        """One group from per-stream states that are all at the same step."""
        for state in states:
            if not isinstance(state, RegState):
                raise TypeError(f"{self.name} expects a RegState, got {type(state).__name__}")
        if any(state.tree_q.stream != state.stream or state.tree_Q.stream != state.stream for state in states):
            raise ValueError("a regression state's tree belongs to another stream")
        tree_q = self.tree_q.stack([state.tree_q for state in states])  # refuses an empty list and mixed steps
        tree_Q = self.tree_Q.stack([state.tree_Q for state in states])
        if any(state.t != tree_q.t for state in states):
            raise ValueError("a regression state's step differs from its trees' step")
        names = ("theta", "aux", "q_hat", "Q_hat")
        if len(states) == 1:  # the per-stream path: views, no copies
            arrays = [np.asarray(getattr(states[0], name))[None] for name in names]
        else:
            arrays = [np.stack([getattr(state, name) for state in states]) for name in names]
        return RegGroup(tree_q.streams, tree_q.t, *arrays, tree_q, tree_Q)

    def unstack(self, group: RegGroup) -> list[RegState]:
        """The per-stream states of a group (read-only copies of the group's rows)."""
        trees_q, trees_Q = self.tree_q.unstack(group.tree_q), self.tree_Q.unstack(group.tree_Q)
        return [
            RegState(s, group.t, _frozen_copy(group.theta[i]), _frozen_copy(group.aux[i]), _frozen_copy(group.q_hat[i]),
                     _frozen_copy(group.Q_hat[i]), trees_q[i], trees_Q[i])
            for i, s in enumerate(group.streams)
        ]

    def step_group(
        self, group: RegGroup, X: Any, y: Any, stream_of_row: Any, noise: NoiseSource
    ) -> tuple[RegGroup, ReleaseBatch | None]:
        """Feed step ``t + 1`` of every stream of the group: records ``X (n, d)``, ``y (n,)``, record ``k``
        belonging to stream ``stream_of_row[k]`` (an index into ``group.streams``; a stream without
        rows has an empty step). Malformed or non-finite input is refused (``ValueError``, as
        :meth:`step`) and changes nothing. Returns the new group and the releases each stream's
        :meth:`step` makes (``None`` when ``t + 1`` is not a release step)."""
        X, y = self._records(X, y)
        rows = np.asarray(stream_of_row)
        if rows.shape != y.shape:
            raise ValueError(f"expected stream_of_row of shape {y.shape}, got {rows.shape}")
        if rows.size and (not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 or rows.max() >= len(group.streams)):
            raise ValueError(f"stream_of_row must hold stream indices in [0, {len(group.streams)})")
        return self._advance_group(group, X, y, rows.astype(np.intp), noise)

    # -- the mechanism --------------------------------------------------------------------------
    def step(self, state: RegState, block: Any, noise: NoiseSource) -> tuple[RegState, list[Release]]:
        """One step of one stream: the group of one of :meth:`step_group`."""
        X, y = self._block(block)
        group, batch = self._advance_group(self.stack([state]), X, y, np.zeros(y.shape[0], dtype=np.intp), noise)
        return self.unstack(group)[0], [] if batch is None else batch.rows()

    def _advance_group(
        self, group: RegGroup, X: np.ndarray, y: np.ndarray, rows: np.ndarray, noise: NoiseSource
    ) -> tuple[RegGroup, ReleaseBatch | None]:
        """The step on validated, normalised records ``rows`` ⟶ stream (see the module docstring)."""
        S, m = len(group.streams), self.m
        if group.q_hat.shape != (S, m) or group.Q_hat.shape != (S, m * m) or group.theta.shape != (S, m):
            raise ValueError(f"regression state does not match: theta {group.theta.shape}, q_hat {group.q_hat.shape}, "
                             f"Q_hat {group.Q_hat.shape} for {S} streams of m = {m}")
        W = self._features(X)
        n = W.shape[0]
        # per stream: Σ clip(w·y) and Σ clip(w wᵀ) over its records (each of norm <= 1 <= R already)
        sums_q, counts_q, _ = self.tree_q.clip_and_sum_groups(W * y[:, None], rows, S)
        sums_Q, counts_Q, _ = self.tree_Q.clip_and_sum_groups((W[:, :, None] * W[:, None, :]).reshape(n, m * m), rows, S)
        tree_q, rq = self.tree_q.step_group(group.tree_q, sums_q, counts_q, noise)
        tree_Q, rQ = self.tree_Q.step_group(group.tree_Q, sums_Q, counts_Q, noise)
        t = group.t + 1
        q_hat, Q_hat = rq.values, rQ.values
        if t % self.release_every:
            return RegGroup(group.streams, t, group.theta, group.aux, q_hat, Q_hat, tree_q, tree_Q), None
        sched = self.schedule(t)
        points, aux = noisy_proj_grad(self._gradient(rq, rQ), self._project_rows, sched["r_t"], sched["eta_t"],
                                      group.theta, group.aux)
        theta, extra = self._finish_rows(points, aux)
        meta = {
            "alpha_t": sched["alpha_t"], "L_t": sched["L_t"], "r_t": sched["r_t"], "r_capped": sched["r_capped"],
            "m": self.m, "m_capped": self.m_capped, "noise": "gaussian",
            "sigma_q": math.sqrt(self.tree_q.noise_var(t)), "sigma_Q": math.sqrt(self.tree_Q.noise_var(t)),
            "constraint": self.constraint.kind, **self.tree_meta, **extra,
        }
        batch = ReleaseBatch(
            group.streams, t, self.name, theta,
            min(self.guarantee.epsilon, rq.epsilon_spent + rQ.epsilon_spent),
            min(self.guarantee.delta, rq.delta_spent + rQ.delta_spent), meta, value_name="theta",
            noise=combined_declaration(rq.noise, rQ.noise),
        )
        return RegGroup(group.streams, t, points, aux, q_hat, Q_hat, tree_q, tree_Q), batch


def gaussian_width(domain: Any, dim: int) -> float:
    """Width of a declared input domain or constraint: ``"l2_ball"`` (unit ball),
    ``("sparse", k)`` (k-sparse, norm <= 1) or any constraint spec / ``ConvexSet``."""
    if domain == "l2_ball":
        return gaussian_width_unit_l2(dim)
    if isinstance(domain, tuple) and len(domain) == 2 and domain[0] == "sparse":
        return gaussian_width_sparse(dim, domain[1])
    return make_convex_set(domain, dim).gaussian_width()


class PrivIncReg2(PrivIncReg1):
    """PRIVINCREG₂ (Kasiviswanathan, Nissim & Jin, "Private Incremental Regression", Algorithm 3): PRIVINCREG₁ on Gaussian-projected inputs, lifted back.

    Guarantee: as :class:`PrivIncReg1` ((ε, δ)-DP, event level; trees in dimensions ``m`` and
    ``m²`` with ``Δ₂ = 2`` since ``‖Φx̃‖ = ‖x‖ <= 1``). ``Φ ∈ R^{m×d}`` has i.i.d. ``N(0, 1/m)`` entries
    from the public seed ``phi_seed`` (privacy does not need it secret; utility needs it
    data-independent).

    ``m``: ``W = w(X) + w(C)``, ``γ = (W/T)^{1/3}``, ``m = ⌈c_m max(W², ln(T/β))/γ²⌉``; if that
    is ``>= d`` or ``> m_max`` it is capped at ``min(d − 1, m_max)`` and ``meta["m_capped"]`` is set.
    ``m`` may be given; use :func:`make_incremental_regression` to fall back to PRIVINCREG₁ when
    ``m >= d``. Constraint: L1 or L2 ball (the lift needs their Minkowski functional). Releases carry
    ``meta["lift_fallback"]`` when the lift was numerically outside C and the averaged preimage
    ``ū ∈ C`` was released instead.
    """

    name = "privincreg2"

    def __init__(
        self,
        *,
        dim: int,
        constraint: Any = "l2_ball",
        m: int | None = None,
        input_domain: Any = "l2_ball",
        c_m: float = 1.0,
        m_max: int = 4096,
        phi_seed: int = 0,
        horizon: int | None = None,
        beta: float = 0.05,
        **kwargs: Any,
    ) -> None:
        self._m_request = m
        self._input_domain = input_domain
        self._c_m = _check_positive("c_m", c_m)
        self._m_max = _check_int("m_max", m_max)
        self._phi_seed = _check_int("phi_seed", phi_seed, 0)
        self._horizon_for_m = horizon
        self._beta_for_m = beta
        super().__init__(dim=dim, constraint=constraint, horizon=horizon, beta=beta, **kwargs)

    def _setup_space(self) -> None:
        C, d = self.constraint, self.dim
        if not isinstance(C, (L1Ball, L2Ball)):
            raise ValueError("PRIVINCREG2 lifts by the Minkowski functional of an L1 or L2 ball; got " + C.kind)
        if d < 2:
            raise ValueError("PRIVINCREG2 needs d >= 2 (m < d)")
        self.m_capped = False
        if self._m_request is None:
            T = self._horizon_for_m
            if T is None:
                raise ValueError("PRIVINCREG2 needs horizon T to choose m (or pass m explicitly)")
            self.width = gaussian_width(self._input_domain, d) + C.gaussian_width()
            gamma = (self.width / T) ** (1.0 / 3.0)
            m = math.ceil(self._c_m * max(self.width**2, math.log(T / self._beta_for_m)) / gamma**2)
            if m >= d or m > self._m_max:
                m, self.m_capped = min(d - 1, self._m_max), True
        else:
            m = _check_int("m", self._m_request)
            if m >= d:
                raise ValueError("m >= d: no reduction; use make_incremental_regression(...) to fall back to PRIVINCREG1")
        self.m = int(m)
        rng = np.random.default_rng(self._phi_seed)
        self.phi = rng.standard_normal((self.m, d)) / math.sqrt(self.m)
        self.phi.setflags(write=False)
        U, S, Vt = np.linalg.svd(self.phi, full_matrices=False)
        if S.min() <= 1e-12 * S.max():
            raise ValueError("the projection matrix is numerically rank-deficient; change phi_seed")
        self._U, self._S, self._Vt = U, S, Vt
        if isinstance(C, L1Ball):
            self.space_radius = C.R * float(np.linalg.norm(self.phi, axis=0).max())
        else:
            self.space_radius = C.R * float(S.max())
        self._fista_step = 1.0 / float(S.max()) ** 2

    def _features(self, X: np.ndarray) -> np.ndarray:
        """``w = Φx̃`` with ``x̃ = (‖x‖/‖Φx‖)x`` (``0`` if ``x = 0`` or ``Φx = 0``), so ``‖w‖ = ‖x‖``."""
        if X.shape[0] == 0:
            return np.zeros((0, self.m))
        P = X @ self.phi.T
        nx = np.linalg.norm(X, axis=1)
        npx = np.linalg.norm(P, axis=1)
        ok = (nx > 0) & (npx > 0)
        scale = np.where(ok, nx / np.where(ok, npx, 1.0), 0.0)
        return P * scale[:, None]

    def _start(self) -> tuple[np.ndarray, np.ndarray]:
        u = self.constraint.start_point()
        return self.phi @ u, u

    def project_space(self, v: np.ndarray, warm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``Π_{ΦC}(v) = Φu*``, ``u* = argmin_{u∈C} ‖Φu − v‖²``; returns ``(Φu*, u*)``."""
        C = self.constraint
        if isinstance(C, L2Ball):
            w = self._U.T @ v
            S = self._S
            z = w / S
            if np.linalg.norm(z) > C.R:
                lo, hi = 0.0, float(S.max() * np.abs(w).max() / C.R)  # ‖z(hi)‖ <= R at this λ
                for _ in range(200):
                    lam = 0.5 * (lo + hi)
                    if np.linalg.norm(S * w / (S**2 + lam)) > C.R:
                        lo = lam
                    else:
                        hi = lam
                    if hi - lo <= 1e-12 * hi:
                        break
                z = S * w / (S**2 + hi)
            u = self._Vt.T @ z
            return self._U @ (S * z), u
        # L1 ball: FISTA on u with projection onto R·B₁
        u = C.project(np.zeros(self.dim) if warm is None else warm)
        y, tk = u.copy(), 1.0
        for _ in range(5000):
            new = C.project(y - self._fista_step * (self.phi.T @ (self.phi @ y - v)))
            tk_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * tk * tk))
            y = new + ((tk - 1.0) / tk_next) * (new - u)
            change = float(np.linalg.norm(new - u))
            u, tk = new, tk_next
            if change <= 1e-10 * max(1.0, float(np.linalg.norm(u))):
                break
        return self.phi @ u, u

    def _project_rows(self, V: np.ndarray, aux: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`project_space` of every row, warm-started from its preimage (one inner solve per row)."""
        pairs = [self.project_space(v, warm) for v, warm in zip(V, aux)]
        return np.stack([p for p, _ in pairs]), np.stack([u for _, u in pairs])

    def lift(self, vartheta: np.ndarray) -> np.ndarray | None:
        """``argmin ‖θ‖_C s.t. Φθ = ϑ`` (LP for L1, pseudo-inverse for L2); ``None`` if the LP fails."""
        if isinstance(self.constraint, L2Ball):
            return self._Vt.T @ ((self._U.T @ vartheta) / self._S)
        from scipy.optimize import linprog  # on first use: scipy.optimize costs ~0.3 s of start-up

        d = self.dim
        res = linprog(np.ones(2 * d), A_eq=np.hstack([self.phi, -self.phi]), b_eq=vartheta,
                      bounds=[(0, None)] * (2 * d), method="highs")
        if not res.success:
            return None
        return res.x[:d] - res.x[d:]

    def step_group(
        self, group: RegGroup, X: Any, y: Any, stream_of_row: Any, noise: NoiseSource
    ) -> tuple[RegGroup, ReleaseBatch | None]:
        """:meth:`PrivIncReg1.step_group` for a group of one stream only: a release's
        ``meta["lift_fallback"]`` is the stream's own, and a group's meta is shared."""
        if len(group.streams) != 1:
            raise ValueError("PRIVINCREG2 steps one stream at a time (its lift meta is per stream)")
        return super().step_group(group, X, y, stream_of_row, noise)

    def _finish_rows(self, points: np.ndarray, aux: np.ndarray) -> tuple[np.ndarray, dict]:
        """Lift the group's one row (:meth:`step_group` refuses larger groups); falls back to the
        averaged preimage ``ū ∈ C`` when the lift is numerically outside ``C``."""
        (point,), (u,) = points, aux
        theta = self.lift(point)
        if theta is None or self.constraint.gauge(theta) > 1.0 + 1e-9:
            return u[None, :], {"lift_fallback": True}
        return theta[None, :], {"lift_fallback": False}


# ---------------------------------------------------------------------------------------------
# PRIVINCERM
# ---------------------------------------------------------------------------------------------
def tau_schedule(
    case: Literal["convex", "strongly_convex", "gaussian_width"],
    *,
    horizon: int,
    dim: int,
    epsilon: float,
    lipschitz: float = 1.0,
    radius: float = 1.0,
    nu: float | None = None,
    width: float | None = None,
    curvature: float | None = None,
) -> int:
    """τ of Kasiviswanathan, Nissim & Jin, "Private Incremental Regression" Theorem 3.1, clamped to ``[1, T]``.

    ``convex``: ``⌈(Td)^{1/3}/ε^{2/3}⌉``; ``strongly_convex``: ``⌈√(dL)/(ν^{1/2} ε R_C^{1/2})⌉``;
    ``gaussian_width``: ``⌈√(T w(C)) C_j^{1/4}/((L R_C)^{1/4} ε^{1/2})⌉``.
    """
    T = _check_int("horizon", horizon)
    if case == "convex":
        tau = (T * dim) ** (1.0 / 3.0) / epsilon ** (2.0 / 3.0)
    elif case == "strongly_convex":
        if nu is None:
            raise ValueError("the strongly convex schedule needs nu")
        tau = math.sqrt(dim * lipschitz) / (math.sqrt(nu) * epsilon * math.sqrt(radius))
    elif case == "gaussian_width":
        if width is None or curvature is None:
            raise ValueError("the Gaussian-width schedule needs width=w(C) and curvature=C_j")
        tau = math.sqrt(T * width) * curvature**0.25 / ((lipschitz * radius) ** 0.25 * math.sqrt(epsilon))
    else:
        raise ValueError(f"unknown tau schedule {case!r}")
    return int(min(T, max(1, math.ceil(tau))))


class NoisyGradientDescent:
    """Default PRIVINCERM batch solver: full-batch noisy projected gradient descent.

    ``(ε′, δ′)``-DP for least squares on normalised records: ``ρ′ = (√(ln(1/δ′) + ε′) − √ln(1/δ′))²``,
    ``σ = 2L√(K/(2ρ′))``; each of the ``K`` iterations adds ``N(0, σ² I_d)`` to a sum of gradients
    clipped to ``L`` (sensitivity ``2L``), so the call is ``ρ′``-zCDP, hence ``(ε′, δ′)``-DP; the
    sigma is also certified by the analytic Gaussian test. Noise is keyed by
    ``(stream, "erm-solver", (call, k))``.
    """

    def __init__(self, constraint: ConvexSet, lipschitz: float, iterations: int = 200) -> None:
        self.constraint = constraint
        self.lipschitz = _check_positive("lipschitz", lipschitz)
        self.iterations = _check_int("iterations", iterations)

    @staticmethod
    def rho(epsilon: float, delta: float) -> float:
        a = math.log(1.0 / delta)
        return (math.sqrt(a + epsilon) - math.sqrt(a)) ** 2

    def sigma(self, epsilon: float, delta: float) -> float:
        return 2.0 * self.lipschitz * math.sqrt(self.iterations / (2.0 * self.rho(epsilon, delta)))

    def loss(self, calls: int, epsilon: float, delta: float) -> ElementLoss:
        """The exact loss of ``calls`` calls at ``(ε′, δ′)``: ``calls·K`` Gaussian sums of sensitivity
        ``2L`` at ``σ`` (GDP ``μ = 2L√(calls·K)/σ``), declared as such."""
        return ElementLoss.of_noise("gaussian", 2.0 * self.lipschitz, self.sigma(epsilon, delta),
                                    calls * self.iterations)

    def certify(self, epsilon: float, delta: float) -> None:
        certify_gaussian(self.sigma(epsilon, delta), 2.0 * self.lipschitz, self.iterations, epsilon, delta)

    def __call__(self, X, y, theta0, epsilon, delta, noise: NoiseSource, stream: str, call: int) -> np.ndarray:
        C, L, K = self.constraint, self.lipschitz, self.iterations
        sigma = self.sigma(epsilon, delta)
        n, d = X.shape
        eta = 2.0 * C.radius / ((n * L + sigma * math.sqrt(d)) * math.sqrt(K))
        theta = theta0.copy()
        total = np.zeros(d)
        for k in range(K):
            total += theta
            grads, _ = clip_l2(2.0 * (X @ theta - y)[:, None] * X, L) if n else (np.zeros((0, d)), None)
            G = grads.sum(axis=0) + noise.gaussian(stream, "erm-solver", (call, k), sigma, d)
            theta = C.project(theta - eta * G)
        return total / K


@dataclass(frozen=True, eq=False)
class ERMState:
    """PRIVINCERM state: every normalised record so far (raw; never released), the last release
    ``theta`` and the number of solver calls made."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    X: np.ndarray
    y: np.ndarray
    theta: np.ndarray
    calls: int


class PrivIncERM(_RegressionBase):
    """PRIVINCERM (Kasiviswanathan, Nissim & Jin, "Private Incremental Regression", Mechanism 1): rerun a private batch ERM every ``τ`` steps.

    Guarantee: (ε, δ)-DP, event level, for a stream of at most ``horizon`` steps (more are refused).
    ``l = ⌈T/τ⌉`` calls at ``ε′ = ε/(2√(2l ln(2/δ)))``, ``δ′ = δ/(2l)``; the constructor requires
    ``ε′ <= 1`` and ``ε <= 2 ln(2/δ)`` (the conditions of the composition theorem).
    ``epsilon_spent`` after ``k`` calls: Thm A.4 ``(ε′√(2k ln(2/δ)) + 2kε′², kδ′ + δ/2)`` for any
    solver; for the default solver the exact composition of its ``kK`` Gaussian iterations
    (μ = 2L√(kK)/σ, analytic conversion at δ) when smaller. Before the first call: ``θ_0``, spend 0.

    ``tau`` is given, or chosen by ``schedule`` (see :func:`tau_schedule`). Loss: least squares on
    normalised records, ``L = 2(R_C + 1)``. ``solver(X, y, θ0, ε′, δ′, noise, stream, call)`` must be
    (ε′, δ′)-DP; it defaults to :class:`NoisyGradientDescent`. Memory grows with ``t`` (baseline).
    """

    name = "privincerm"

    def __init__(
        self,
        *,
        dim: int,
        constraint: Any = "l2_ball",
        epsilon: float,
        delta: float,
        horizon: int,
        tau: int | None = None,
        schedule: Literal["convex", "strongly_convex", "gaussian_width"] = "convex",
        nu: float | None = None,
        solver: Callable[..., np.ndarray] | None = None,
        iterations: int = 200,
        theta0: Sequence[float] | np.ndarray | None = None,
        release_every: int = 1,
    ) -> None:
        self._setup_common(dim, constraint, release_every)
        eps = _check_positive("epsilon", epsilon)
        if not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise ValueError(f"PRIVINCERM needs 0 < delta < 1, got {delta!r}")
        self.horizon = _check_int("horizon", horizon)
        self.guarantee = Guarantee(eps, float(delta))
        C = self.constraint
        self.lipschitz = 2.0 * (C.radius + 1.0)
        if tau is None:
            curvature = C.radius**2
            width = C.gaussian_width() if schedule == "gaussian_width" else None
            tau = tau_schedule(schedule, horizon=self.horizon, dim=self.dim, epsilon=eps, lipschitz=self.lipschitz,
                               radius=C.radius, nu=nu, width=width, curvature=curvature)
        self.tau = _check_int("tau", tau)
        self.calls_total = math.ceil(self.horizon / self.tau)
        calls = self.calls_total
        if eps > 2.0 * math.log(2.0 / delta):
            raise ValueError(f"epsilon={eps} exceeds 2 ln(2/delta): the composition theorem used does not apply")
        self.epsilon_call = eps / (2.0 * math.sqrt(2.0 * calls * math.log(2.0 / delta)))
        self.delta_call = delta / (2.0 * calls)
        if self.epsilon_call > 1.0:
            raise ValueError(f"per-call epsilon' = {self.epsilon_call:.4g} > 1: the composition theorem needs <= 1")
        self.default_solver = solver is None
        self.solver = NoisyGradientDescent(C, self.lipschitz, iterations) if solver is None else solver
        if self.default_solver:
            self.solver.certify(self.epsilon_call, self.delta_call)
        start = C.start_point() if theta0 is None else np.asarray(theta0, dtype=np.float64)
        if start.shape != (self.dim,) or not C.contains(start, 1e-9):
            raise ValueError("theta0 must be a point of the constraint set")
        self.theta0 = start

    def spend(self, calls: int) -> tuple[float, float]:
        """Worst per-record ``(epsilon, delta)`` after ``calls`` solver calls."""
        return self.declared_spend(calls)[:2]

    def declared_spend(self, calls: int) -> tuple[float, float, str]:
        """:meth:`spend` and its noise declaration: the Thm A.4 account (``"advanced_composition"``, also
        for ``calls = 0``), or the default solver's Gaussian iterations where their exact spend is smaller."""
        a4 = dict(k=calls, epsilon=self.epsilon_call, delta=self.delta_call, delta_star=self.guarantee.delta / 2.0)
        eps_a4, delta_a4 = advanced_composition(**a4)
        if self.default_solver and calls:
            exact = self.solver.loss(calls, self.epsilon_call, self.delta_call)
            eps_exact, delta_exact = exact.spend(self.guarantee.delta)
            if eps_exact < eps_a4:
                return eps_exact, delta_exact, exact.declaration()
        return eps_a4, delta_a4, declaration_json((), (account("advanced_composition", **a4),))

    def init_state(self, stream: str) -> ERMState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return ERMState(stream, 0, np.zeros((0, self.dim)), np.zeros(0), self.theta0.copy(), 0)

    def encode_state(self, state: ERMState) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> ERMState:
        return decode_state(ERMState, data)

    def step(self, state: ERMState, block: Any, noise: NoiseSource) -> tuple[ERMState, list[Release]]:
        t = state.t + 1
        if t > self.horizon:
            raise ValueError(f"step {t} is beyond the horizon T={self.horizon} of PRIVINCERM")
        Xb, yb = self._block(block)
        X = np.concatenate([state.X, Xb]) if Xb.shape[0] else state.X
        y = np.concatenate([state.y, yb]) if yb.shape[0] else state.y
        theta, calls = state.theta, state.calls
        if t % self.tau == 0:
            theta = np.asarray(
                self.solver(X, y, self.theta0, self.epsilon_call, self.delta_call, noise, state.stream, calls),
                dtype=np.float64,
            )
            calls += 1
        new = ERMState(state.stream, t, X, y, theta, calls)
        if t % self.release_every:
            return new, []
        eps, delta, declared = self.declared_spend(calls)
        meta = {"tau": self.tau, "calls": calls, "epsilon_call": self.epsilon_call, "delta_call": self.delta_call,
                "horizon": self.horizon, "constraint": self.constraint.kind}
        if self.default_solver:
            meta.update(lipschitz=self.lipschitz, iterations=self.solver.iterations)
        release = Release(stream=state.stream, step=t, mechanism=self.name, value={"theta": theta},
                          epsilon_spent=eps, delta_spent=delta, meta=meta, noise=declared)
        return new, [release]


def make_incremental_regression(algorithm: Literal["privincreg1", "privincreg2", "privincerm"], **kwargs: Any):
    """The regression mechanism named ``algorithm``; PRIVINCREG₂ with an explicit ``m >= dim`` falls
    back to PRIVINCREG₁ (no reduction)."""
    if algorithm == "privincreg1":
        return PrivIncReg1(**kwargs)
    if algorithm == "privincreg2":
        m = kwargs.get("m")
        if m is not None and m >= kwargs.get("dim", 0):
            for key in ("m", "input_domain", "c_m", "m_max", "phi_seed"):
                kwargs.pop(key, None)
            return PrivIncReg1(**kwargs)
        return PrivIncReg2(**kwargs)
    if algorithm == "privincerm":
        return PrivIncERM(**kwargs)
    raise ValueError(f"algorithm must be 'privincreg1', 'privincreg2' or 'privincerm', got {algorithm!r}")
