"""Training calls: the certified solver and the uncertified replication SGD.

Objective of every call (paper's convention, λ not λ/2)::

    F(w) = (1/n_norm) Σ_{i∈S} ℓ(w; z_i) + λ ‖w − w_ref‖²

F is μ = 2λ strongly convex and β_F = β + 2λ smooth (β of the model, data independent).

**Certified mode** (default): Nesterov's accelerated gradient for strongly convex functions
(step 1/β_F, momentum (√κ−1)/(√κ+1), κ = β_F/μ), full batch, deterministic, warm-started at
``w_ref``, run until ``‖∇F(ŵ)‖₂ ≤ L/n_norm`` at the returned point. It converges linearly, so the
loop always ends; it never gives up and returns something else (that choice would depend on the
data). A safety cap on iterations raises ``RuntimeError`` (refuse, never release). Then
``‖ŵ(D) − ŵ(D')‖ ≤ L/(λn) + 2·(L/n)/(2λ) = Δ(n_norm)`` for neighbouring member sets. The
mechanisms solve to ``tolerance·L/n`` (default 10⁻³): tighter, so the certificate still holds,
and close to the exact minimiser (the loose L/n test stops after 2–3 iterations when λ is large).

Backends: ``"numpy"`` (default), ``"torch"`` (float64, CUDA when available) or ``"auto"``
(torch if importable). Both run the same iteration and the same stopping test; the two returned
points both satisfy ``‖∇F‖ ≤ L/n``, so they differ by at most ``L/(λ n_norm) = Δ/2`` (strong
convexity), and in practice by ~1e-10 relative. Pin one backend per pipeline: the same noise key
with two backends gives releases that differ by that rounding.

**Replication mode** (``uncertified=True``): the paper's minibatch SGD (batch 256, 500 iterations,
step 1/(γ·i), γ = 10). Not covered by the sensitivity argument; releases say ``certified=False``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from beam_dp.mechanisms.erm.models import LinearModel

__all__ = ["Backend", "SGDConfig", "SolveResult", "certified_solve", "objective_gradient", "resolve_backend", "sgd_solve"]

log = logging.getLogger(__name__)

Backend = Literal["numpy", "torch", "auto"]
MAX_ITERATIONS = 200_000


@dataclass(frozen=True)
class SolveResult:
    """A trained (not yet private) point and its certificate: ``grad_norm = ‖∇F(w)‖₂``."""

    w: np.ndarray
    grad_norm: float
    target: float
    iterations: int
    certified: bool
    backend: str


@dataclass(frozen=True)
class SGDConfig:
    """The paper's uncertified minibatch SGD (replication mode only)."""

    batch_size: int = 256
    iterations: int = 500
    gamma: float = 10.0


def resolve_backend(backend: Backend) -> str:
    """``"auto"`` -> ``"torch"`` when torch is importable, else ``"numpy"``."""
    if backend not in ("numpy", "torch", "auto"):
        raise ValueError(f"backend must be 'numpy', 'torch' or 'auto', got {backend!r}")
    if backend == "numpy":
        return "numpy"
    try:
        import torch  # noqa: F401
    except ImportError:
        if backend == "torch":
            raise ValueError("backend='torch' needs torch installed") from None
        return "numpy"
    return "torch"


def objective_gradient(model: LinearModel, w: np.ndarray, X: np.ndarray, y: np.ndarray, n_norm: int,
                       lam: float, w_ref: np.ndarray) -> np.ndarray:
    """∇F(w) (numpy)."""
    _, g = model.loss_grad(w, X, y)
    return g / n_norm + 2.0 * lam * (w - w_ref)


def _momentum(model: LinearModel, lam: float) -> tuple[float, float]:
    beta_f = model.smoothness + 2.0 * lam
    kappa = beta_f / (2.0 * lam)
    return 1.0 / beta_f, (math.sqrt(kappa) - 1.0) / (math.sqrt(kappa) + 1.0)


def certified_solve(model: LinearModel, X: np.ndarray, y: np.ndarray, n_norm: int, lam: float,
                    w_ref: np.ndarray, backend: Backend = "numpy", tolerance: float = 1.0) -> SolveResult:
    """Minimise F from ``w_ref`` until ``‖∇F‖ ≤ tolerance·L/n_norm`` (see the module docstring).

    ``tolerance ≤ 1`` keeps the certificate; smaller values cost a few more (linearly convergent)
    iterations and bring ŵ closer to the exact minimiser (better utility, same privacy)."""
    if not (0 < tolerance <= 1):
        raise ValueError(f"tolerance must lie in (0, 1] (a fraction of L/n), got {tolerance!r}")
    target = tolerance * model.lipschitz / n_norm
    if resolve_backend(backend) == "torch":
        from beam_dp.mechanisms.erm.solver_torch import torch_certified_solve

        return torch_certified_solve(model, X, y, n_norm, lam, w_ref, target)
    step, theta = _momentum(model, lam)
    x_prev = w_ref.astype(np.float64).copy()
    point = x_prev.copy()
    for it in range(MAX_ITERATIONS):
        g = objective_gradient(model, point, X, y, n_norm, lam, w_ref)
        g_norm = float(np.linalg.norm(g))
        if g_norm <= target:
            return SolveResult(point, g_norm, target, it, True, "numpy")
        x_next = point - step * g
        point = x_next + theta * (x_next - x_prev)
        x_prev = x_next
    raise RuntimeError("certified solver did not reach ‖∇F‖ ≤ L/n; refusing to release")


def sgd_solve(model: LinearModel, X: np.ndarray, y: np.ndarray, n_norm: int, lam: float, w_ref: np.ndarray,
              rng: np.random.Generator, config: SGDConfig) -> SolveResult:
    """The paper's minibatch SGD (UNCERTIFIED: its output has no proven sensitivity bound)."""
    w = w_ref.astype(np.float64).copy()
    n = len(X)
    scale = n / n_norm  # the objective's data term is (1/n_norm)·Σ; a minibatch mean estimates Σ/n
    for i in range(1, config.iterations + 1):
        if n:
            batch = rng.integers(0, n, size=min(config.batch_size, n))
            _, g = model.loss_grad(w, X[batch], y[batch])
            g = g * (scale / len(batch))
        else:
            g = np.zeros_like(w)
        w = w - (g + 2.0 * lam * (w - w_ref)) / (config.gamma * i)
    grad = objective_gradient(model, w, X, y, n_norm, lam, w_ref)
    return SolveResult(w, float(np.linalg.norm(grad)), model.lipschitz / n_norm, config.iterations, False, "sgd")
