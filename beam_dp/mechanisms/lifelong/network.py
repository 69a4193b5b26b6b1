"""The network f(x) = G(a(x, θ_1), θ_2) as pure functions of a parameter dict (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning").

Parameters (names are stable; they are the keys of the released weights):

* ``enc.W`` (d, β), ``enc.b`` (β): the input layer ``h = clip(x W + b, −1, 1)`` (θ_1);
* ``g{i}.W``, ``g{i}.b``: G's hidden layers (ReLU, the last one clipped to [−1, 1]);
* ``head.W`` (n_π + 1, K): scores ``z = [h_π, 1] head.W`` (the constant unit is the output bias).

With ``batch_stats=True`` G starts with a normalisation by the current batch's mean and variance
(L2DP-ML); the DP-SGD learners use ``batch_stats=False`` because batch statistics would couple
the examples of a batch and break per-example clipping.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["THETA_1", "Layout", "classifier", "encode", "flatten", "init_params", "layout_of", "predict", "to_numpy",
           "to_torch", "unflatten"]

THETA_1 = ("enc.W", "enc.b")
_BN_EPS = 1e-5
_MIN_EVAL_BATCH = 32


def init_params(rng: np.random.Generator, input_dim: int, hidden: int, g_layers: tuple[int, ...], n_classes: int,
                enc_bound: float | None = None) -> dict[str, np.ndarray]:
    """Data-independent initial weights: Glorot-uniform (``enc.W`` uniform in ±``enc_bound`` if given), zero biases."""
    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=(fan_in, fan_out))

    params = {"enc.W": glorot(input_dim, hidden) if enc_bound is None
              else rng.uniform(-enc_bound, enc_bound, size=(input_dim, hidden)),
              "enc.b": np.zeros(hidden)}
    width = hidden
    for i, out in enumerate(g_layers):
        params[f"g{i}.W"] = glorot(width, out)
        params[f"g{i}.b"] = np.zeros(out)
        width = out
    params["head.W"] = glorot(width + 1, n_classes)
    return params


def to_torch(arrays: dict[str, np.ndarray], device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v), dtype=dtype, device=device).clone() for k, v in arrays.items()}


def to_numpy(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in tensors.items()}


Layout = tuple[tuple[str, tuple[int, ...], int, int], ...]


def layout_of(arrays: dict) -> Layout:
    """``(name, shape, start, stop)`` of each named array in one flat vector, in the dict's order."""
    out, offset = [], 0
    for name, value in arrays.items():
        shape = tuple(int(s) for s in value.shape)
        size = int(np.prod(shape)) if shape else 1
        out.append((name, shape, offset, offset + size))
        offset += size
    return tuple(out)


def flatten(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One flat vector of the named tensors, in the dict's order (the layout of :func:`layout_of`)."""
    return torch.cat([v.reshape(-1) for v in tensors.values()])


def unflatten(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Named views into ``flat`` (no copies: an in-place update of ``flat`` updates them)."""
    return {name: flat[lo:hi].view(shape) for name, shape, lo, hi in layout}


def _batch_norm(h: torch.Tensor) -> torch.Tensor:
    return (h - h.mean(dim=0, keepdim=True)) / torch.sqrt(h.var(dim=0, unbiased=False, keepdim=True) + _BN_EPS)


def encode(p: dict[str, torch.Tensor], x: torch.Tensor, batch_norm: bool = False) -> torch.Tensor:
    """Hidden layer of θ_1: ``clip(x W + b, −1, 1)``; with ``batch_norm`` the pre-activation is first
    normalised by the batch's statistics (the predecessor code's option)."""
    pre = x @ p["enc.W"] + p["enc.b"]
    return torch.clamp(_batch_norm(pre) if batch_norm else pre, -1.0, 1.0)


def classifier(p: dict[str, torch.Tensor], h: torch.Tensor, n_layers: int,
               batch_stats: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """G on hidden values ``h`` (n, β): returns ``([h_π, 1], z)``."""
    if batch_stats:
        h = _batch_norm(h)
    for i in range(n_layers):
        h = h @ p[f"g{i}.W"] + p[f"g{i}.b"]
        h = torch.clamp(h, -1.0, 1.0) if i == n_layers - 1 else torch.relu(h)
    aug = torch.cat([h, torch.ones_like(h[:, :1])], dim=1)
    return aug, aug @ p["head.W"]


@torch.no_grad()
def predict(p: dict[str, torch.Tensor], x: np.ndarray, n_layers: int, batch_stats: bool, batch: int,
            encoder_norm: bool = False) -> np.ndarray:
    """Class predictions on clean inputs, in batches (a short last batch joins the previous one)."""
    n = x.shape[0]
    edges = list(range(0, n, batch)) + [n]
    if len(edges) > 2 and edges[-1] - edges[-2] < _MIN_EVAL_BATCH:
        edges.pop(-2)
    weight = p["enc.W"]
    xt = torch.as_tensor(np.clip(x, -1.0, 1.0), dtype=weight.dtype, device=weight.device)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        _, z = classifier(p, encode(p, xt[lo:hi], encoder_norm), n_layers, batch_stats)
        out.append(z.argmax(dim=1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
