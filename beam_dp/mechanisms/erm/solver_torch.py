"""The certified solver on torch (float64; CUDA when available): the same iteration and stopping
test as the numpy path in :mod:`beam_dp.mechanisms.erm.solver`. Imported only when torch is used."""

from __future__ import annotations

import numpy as np
import torch

from beam_dp.mechanisms.erm.models import LinearModel
from beam_dp.mechanisms.erm.solver import MAX_ITERATIONS, SolveResult, _momentum

__all__ = ["torch_certified_solve", "torch_device"]


def torch_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
                          w_ref: np.ndarray, target: float) -> SolveResult:
    device = torch_device()
    Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float64, device=device)
    yt = torch.as_tensor(y, device=device)
    if model.kind == "huber":
        yt = yt.to(torch.float64)
    ref = torch.as_tensor(w_ref, dtype=torch.float64, device=device)
    step, theta = _momentum(model, lam)
    x_prev = ref.clone()
    point = ref.clone()
    for it in range(MAX_ITERATIONS):
        g = _data_grad(model, point, Xt, yt) / n_norm + 2.0 * lam * (point - ref)
        g_norm = float(torch.linalg.vector_norm(g))
        if g_norm <= target:
            return SolveResult(point.cpu().numpy(), g_norm, target, it, True, f"torch:{device.type}")
        x_next = point - step * g
        point = x_next + theta * (x_next - x_prev)
        x_prev = x_next
    raise RuntimeError("certified solver did not reach ‖∇F‖ ≤ L/n; refusing to release")
