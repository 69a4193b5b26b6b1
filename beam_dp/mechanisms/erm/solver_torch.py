"""The certified solver on torch: the same iteration and stopping test as the numpy path in
:mod:`beam_dp.mechanisms.erm.solver`, in float64, on an explicitly chosen device. Imported only when
torch is used.

Device: ``device="cpu"`` (default), ``"cuda"`` (refused when CUDA is absent) or ``"auto"`` (CUDA when
present, else CPU), decided by :func:`beam_dp.mechanisms.torch_device.resolve_device` on the worker.

Determinism. Every operation is float64 and deterministic on both device types: dense matrix
products and reductions (cuBLAS returns the same bits on every run on GPUs of the same architecture
and SM count), ``softmax``/``clamp`` (elementwise) and one ``index_put`` with unique indices (no
atomics). So a retried release on the same device type reproduces bit for bit; the tests run the
solve under ``torch.use_deterministic_algorithms(True)``, which raises on any op without a
deterministic kernel. The stopping test reads ``‖∇F‖`` once per iteration on the host.

CPU vs CUDA. Both stop at ``‖∇F‖ ≤ target``, so by 2λ-strong convexity their points differ by at most
``2·target/(2λ)`` whatever the rounding; with the same iteration count they differ by the float64
reassociation of the products only: per iteration ``O(n·f·u)`` relative (``u = 2⁻⁵³``), amplified by
at most ``(1 + θ)`` per step of the contracting momentum iteration (see :func:`device_tolerance`).
"""

from __future__ import annotations

import numpy as np
import torch

from beam_dp.mechanisms.erm.iteration import SolveResult, momentum
from beam_dp.mechanisms.erm.models import LinearModel
from beam_dp.mechanisms.torch_device import resolve_device

__all__ = ["device_tolerance", "torch_certified_solve"]


def device_tolerance(iterations: int, rows: int, dim: int) -> float:
    """Relative tolerance of two devices' points after ``iterations`` steps of the same iteration on
    ``rows × dim`` data: ``16 · iterations · (rows + dim) · 2⁻⁵³``. Each step's products reassociate sums
    of ``rows + dim`` float64 terms (relative error ≤ (rows + dim)·2⁻⁵³); the bound lets those errors add
    up over the steps without amplification (the iteration contracts towards the minimiser) and covers
    the momentum's transient growth by the factor 16. A working bound, not a theorem: the CUDA test
    checks it; the proven fallback is ``target/λ`` (both points certified, 2λ-strong convexity)."""
    return 16.0 * max(iterations, 1) * (rows + dim) * 2.0**-53


def _data_grad(model: LinearModel, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum over rows of the per-example gradient (mirrors ``model.loss_grad``)."""
    if model.kind == "softmax":
        scores = X @ W.reshape(model.n_outputs, -1).T
        P = torch.softmax(scores, dim=1)
        P[torch.arange(len(y), device=X.device), y] -= 1.0
        return (P.T @ X).reshape(-1)
    if model.kind == "huber":
        r = X @ W - y
        return X.T @ torch.clamp(r, -model.huber, model.huber)
    raise ValueError(f"no torch gradient for model kind {model.kind!r}")


def torch_certified_solve(model: LinearModel, X: np.ndarray, y: np.ndarray, n_norm: int, lam: float,
                          w_ref: np.ndarray, target: float, cap: int, device: str | torch.device = "cpu") -> SolveResult:
    """Minimise F from ``w_ref`` until ``‖∇F‖₂ ≤ target`` or ``cap`` iterations (the public
    ``solver.iteration_cap``, which reaches the target for every allowed dataset) on ``device`` (float64;
    see the module docstring); always returns. The data move to the device once; the result comes back
    as a float64 numpy point."""
    dev = resolve_device(device)
    Xt = torch.as_tensor(np.ascontiguousarray(X, dtype=np.float64), device=dev)
    yt = torch.as_tensor(np.asarray(y), device=dev)
    yt = yt.to(torch.float64) if model.kind == "huber" else yt.to(torch.int64)
    ref = torch.as_tensor(np.asarray(w_ref, dtype=np.float64), device=dev)
    step, theta = momentum(model, lam)
    x_prev = ref.clone()
    point = ref.clone()
    for it in range(cap + 1):
        g = _data_grad(model, point, Xt, yt) / n_norm + 2.0 * lam * (point - ref)
        g_norm = float(torch.linalg.vector_norm(g))
        if g_norm <= target or it == cap:
            break
        x_next = point - step * g
        point = x_next + theta * (x_next - x_prev)
        x_prev = x_next
    return SolveResult(point.cpu().numpy(), g_norm, target, it, True, f"torch:{dev.type}")
