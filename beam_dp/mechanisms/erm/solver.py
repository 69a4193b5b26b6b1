"""Training calls: the certified solver and the uncertified replication SGD.

Objective of every call (paper's convention, λ not λ/2)::

    F(w) = (1/n_norm) Σ_{i∈S} ℓ(w; z_i) + λ ‖w − w_ref‖²

F is μ = 2λ strongly convex and β_F = β + 2λ smooth (β of the model, data independent).

**Certified mode** (default): Nesterov's accelerated gradient for strongly convex functions
(step 1/β_F, momentum θ = (√κ−1)/(√κ+1), κ = β_F/μ), full batch, deterministic, warm-started at
``w_ref``, stopped at the first point with ``‖∇F(ŵ)‖₂ ≤ target = τ·L/n_norm`` (τ = ``tolerance``,
10⁻³ in the mechanisms).

**The certificate and the sensitivity it gives.** Changing one member's value moves ∇F by at most
2L/n_norm everywhere, so the exact minimisers of neighbouring member sets differ by at most
``(2L/n)/μ = L/(λn)``. A point with ``‖∇F(ŵ)‖ ≤ g`` lies within ``g/μ`` of the exact minimiser
(strong convexity). The computed test ``‖∇F‖ ≤ τL/n`` is made in float64; the true gradient norm
is at most ``(τ + ρ)·L/n`` with ``ρ`` the rounding headroom, ``ρ = max(τ, 4·n²·2⁻⁵³)`` (the mean of
m ≤ n per-example gradients of norm ≤ L, summed in any order, errs by at most (m − 1)·2⁻⁵³·Σ‖∇ℓ‖/n
≤ n²·2⁻⁵³·L/n; the factor 4 covers forming each gradient, the regulariser term and the norm).
With ``s = τ + ρ`` (:func:`certified_slack`), ``‖ŵ(D) − ŵ(D')‖ ≤ L/(λn) + 2·s·(L/n)/(2λ) =
(1 + s)·L/(λn) =: Δ(n_norm)``, the L2 sensitivity the mechanisms calibrate to (``s = 2·10⁻³`` for
n ≤ 1.5·10⁶ at τ = 10⁻³: Δ ≈ 1.002·L/(λn), half the spec's 2L/(λn), whose ``s = 1`` spends the
whole 2× slack on a solver stopped at L/n). A point that fails the test is refused
(:class:`CertificateError`), never released at this calibration.

**No data-dependent refusal: the iteration cap is a public function** (:func:`iteration_cap`).
With x_1 = y_1 = w_ref, y_{s+1} = x_s − ∇F(x_s)/β_F, x_{s+1} = (1+θ)y_{s+1} − θy_s (the loop
below), Bubeck 2015, Thm 3.18 gives F(y_t) − F* ≤ (μ+β_F)/2·D₀²·e^{−(t−1)/√κ} with
D₀ = ‖w_ref − w*‖ ≤ ‖∇F(w_ref)‖/μ =: G₀/μ (strong convexity). Hence
‖y_t − w*‖ ≤ √(1+κ)·D₀·e^{−(t−1)/(2√κ)}, ‖x_s − w*‖ ≤ (1+2θ)·√(1+κ)·D₀·e^{−(s−2)/(2√κ)} and
(β_F-smoothness, θ < 1) ``‖∇F(x_s)‖ ≤ 3κ√(1+κ)·G₀·e^{−(s−2)/(2√κ)}``. Every member row is clipped
(‖∇ℓ‖ ≤ L), so G₀ = ‖(1/n_norm)Σ∇ℓ(w_ref)‖ ≤ L·m/n_norm for the m rows of the call (m ≤ n_norm:
the block, or a sample of it); with target = tolerance·L/n_norm the test passes by loop iteration
``K = ⌈1 + 2√κ·ln(3κ√(1+κ)·m/tolerance)⌉``, a function of the public β, λ, tolerance and the row
count (public under the count-step relation; a sample's size is drawn from the noise key). The
loop runs at most K + 1 gradient evaluations and always returns. The solver runs to the cap of
``tolerance/2``: there the exact gradient is at most half the target, so the computed test passes
unless rounding exceeds ``τL/(2n)`` (it is bounded by ``4n²·2⁻⁵³·L/n``, below that for n ≤ 10⁶ at
τ = 10⁻³), and whether a model is released does not depend on the data; should the float64 test
still fail at the cap, the mechanism refuses the call (:class:`CertificateError`) rather than
release a point its sensitivity does not cover. ``SolveResult.grad_norm`` stays inside the
solver, no release carries it. K grows like √κ·ln(m/tolerance): e.g. κ = 10⁶, m = 2⁴⁰,
tolerance = 10⁻³ gives K ≈ 1.2·10⁵.

Backends: ``"numpy"`` (default), ``"torch"`` (float64, CUDA when available) or ``"auto"``
(torch if importable). Both run the same iteration and the same stopping test; the two returned
points both satisfy ``‖∇F‖ ≤ τL/n``, so they differ by at most ``τL/(λ n_norm)`` (strong
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

from beam_dp.mechanisms.erm.iteration import SolveResult, momentum
from beam_dp.mechanisms.erm.models import LinearModel

__all__ = ["Backend", "CertificateError", "SGDConfig", "certified_slack", "certified_solve",
           "iteration_cap", "objective_gradient", "resolve_backend", "sgd_solve"]

log = logging.getLogger(__name__)

Backend = Literal["numpy", "torch", "auto"]


#: float64 unit roundoff and the factor of the rounding headroom (module docstring)
_ROUNDOFF = 2.0**-53
_ROUNDING_FACTOR = 4.0


class CertificateError(ValueError):
    """A certified call whose returned point fails its stopping test ``‖∇F‖ ≤ τ·L/n_norm``: the call
    is refused (its sensitivity would not cover the point). Exact arithmetic excludes it."""


def certified_slack(tolerance: float, n_norm: int) -> float:
    """``s`` with ``‖ŵ − w*‖ ≤ s·L/(2λ n_norm)`` for a point that passed the float64 test
    ``‖∇F‖ ≤ tolerance·L/n_norm``: ``tolerance + max(tolerance, 4·n_norm²·2⁻⁵³)`` (the target plus
    the rounding headroom of the computed gradient; module docstring). The call's sensitivity is
    ``(1 + s)·L/(λ n_norm)`` (``LinearModel.sensitivity``). A public function of the tolerance and
    the public normaliser."""
    if not (0 < tolerance <= 1) or n_norm < 1:
        raise ValueError(f"certified_slack needs 0 < tolerance <= 1 and n_norm >= 1, got ({tolerance!r}, {n_norm!r})")
    return tolerance + max(tolerance, _ROUNDING_FACTOR * float(n_norm) ** 2 * _ROUNDOFF)


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


def iteration_cap(model: LinearModel, lam: float, rows: int, tolerance: float = 1.0) -> int:
    """The public number K of accelerated-gradient iterations after which ``‖∇F‖ ≤ tolerance·L/n_norm``
    holds for every dataset of ``rows`` clipped rows (any n_norm ≥ rows; proof in the module
    docstring): ``⌈1 + 2√κ·ln(3κ√(1+κ)·rows/tolerance)⌉``, κ = (β + 2λ)/(2λ). Depends only on the
    model's public constants, λ, the tolerance and the row count; 0 when there are no rows
    (∇F(w_ref) = 0)."""
    if rows <= 0:
        return 0
    kappa = (model.smoothness + 2.0 * lam) / (2.0 * lam)
    log_ratio = math.log(3.0 * kappa * math.sqrt(1.0 + kappa)) + math.log(rows) - math.log(tolerance)
    return max(1, math.ceil(1.0 + 2.0 * math.sqrt(kappa) * log_ratio))


def certified_solve(model: LinearModel, X: np.ndarray, y: np.ndarray, n_norm: int, lam: float,
                    w_ref: np.ndarray, backend: Backend = "numpy", tolerance: float = 1.0,
                    device: str = "cpu") -> SolveResult:
    """Minimise F from ``w_ref`` until ``‖∇F‖ ≤ tolerance·L/n_norm``, at most :func:`iteration_cap`
    iterations (see the module docstring); always returns, never refuses. ``device``: the torch
    backend's device (``beam_dp.mechanisms.torch_device``); the same iteration, test and cap there.

    ``tolerance ≤ 1`` keeps the certificate; smaller values cost a few more (linearly convergent)
    iterations and bring ŵ closer to the exact minimiser (better utility, same privacy)."""
    if not (0 < tolerance <= 1):
        raise ValueError(f"tolerance must lie in (0, 1] (a fraction of L/n), got {tolerance!r}")
    target = tolerance * model.lipschitz / n_norm
    cap = iteration_cap(model, lam, len(X), tolerance / 2)  # exact ‖∇F‖ ≤ target/2: rounding cannot fail the test
    if resolve_backend(backend) == "torch":
        from beam_dp.mechanisms.erm.solver_torch import torch_certified_solve

        return torch_certified_solve(model, X, y, n_norm, lam, w_ref, target, cap, device)
    step, theta = momentum(model, lam)
    x_prev = w_ref.astype(np.float64).copy()
    point = x_prev.copy()
    for it in range(cap + 1):
        g = objective_gradient(model, point, X, y, n_norm, lam, w_ref)
        g_norm = float(np.linalg.norm(g))
        if g_norm <= target or it == cap:
            break
        x_next = point - step * g
        point = x_next + theta * (x_next - x_prev)
        x_prev = x_next
    return SolveResult(point, g_norm, target, it, True, "numpy")


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
