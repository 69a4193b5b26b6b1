"""Clipping: bound each contribution before it touches mechanism state.

All functions take one vector ``(d,)`` or a block of rows ``(n, d)`` and return
``(clipped, was_clipped)`` where ``was_clipped`` is a boolean per row. Inputs must be finite;
non-finite values raise ``ValueError`` (adapters route them to the dead-letter output first).

Norms never overflow or underflow: a row whose sum of squares (L2) or of absolute values (L1) leaves
the normal float64 range is divided by its largest ``|coordinate|`` first, so every finite row above
the bound comes out at norm ``bound`` (up to rounding), e.g. ``[1e308, 0.5]`` and ``[-1.8e308]``. Rows
inside the range take the direct formula (``row · bound/‖row‖``), unchanged.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["clip_box", "clip_l1", "clip_l2", "clip_factors_torch", "l2_norms"]


def _rows(values: np.ndarray) -> tuple[np.ndarray, bool]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim not in (1, 2):
        raise ValueError(f"expected a vector (d,) or a block (n, d), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("cannot clip non-finite values (NaN or inf)")
    return (arr[None, :], True) if arr.ndim == 1 else (arr, False)


def _check_bound(bound: float) -> None:
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"clipping bound must be a finite number > 0, got {bound!r}")


# Sums of squares in [_TINY, _HUGE] are exact to rounding; outside it (overflow to inf, or squares lost
# to underflow) the row is rescaled by its largest |coordinate| before the norm is taken.
_TINY = 2.0**-900
_HUGE = float(np.finfo(np.float64).max)


def _norms(rows: np.ndarray, ord_: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(norms, idx, peak, unit)``: each row's norm (``inf`` only where the true norm exceeds the float64
    range), the rows ``idx`` computed by rescaling, their ``peak = max |x|`` and ``unit = ‖x/peak‖`` (in
    ``[1, d]``; 0 for a zero row)."""
    if ord_ == 2:
        raw = np.einsum("ij,ij->i", rows, rows)
        need = np.flatnonzero(~((raw >= _TINY) & (raw <= _HUGE)))
        norms = np.sqrt(raw)
    else:
        norms = np.abs(rows).sum(axis=1)
        need = np.flatnonzero(~(norms <= _HUGE))
    if not need.size:
        return norms, need, np.zeros(0), np.zeros(0)
    sub = rows[need]
    peak = np.abs(sub).max(axis=1) if sub.shape[1] else np.zeros(len(need))
    scaled = sub / np.where(peak > 0, peak, 1.0)[:, None]
    unit = np.sqrt(np.einsum("ij,ij->i", scaled, scaled)) if ord_ == 2 else np.abs(scaled).sum(axis=1)
    with np.errstate(over="ignore"):
        norms[need] = peak * unit
    return norms, need, peak, unit


def l2_norms(values: np.ndarray) -> np.ndarray:
    """L2 norm of each row of ``(n, d)`` (or of a vector, shape ``(1,)``), float64, computed without
    intermediate overflow or underflow; ``inf`` only where the true norm exceeds the float64 range."""
    rows, _ = _rows(values)
    with np.errstate(over="ignore", under="ignore"):
        return _norms(rows, 2)[0]


def _norm_clip(values: np.ndarray, bound: float, ord_: int) -> tuple[np.ndarray, np.ndarray]:
    _check_bound(bound)
    rows, single = _rows(values)
    with np.errstate(over="ignore", under="ignore"):
        norms, need, peak, unit = _norms(rows, ord_)
    clipped = norms > bound
    factor = np.where(clipped, bound / np.where(clipped, norms, 1.0), 1.0)
    out = rows * factor[:, None]
    big = clipped[need]
    if big.any():  # rescaled rows above the bound: (x/peak)·(bound/‖x/peak‖), no overflow or underflow
        i = need[big]
        out[i] = (rows[i] / peak[big][:, None]) * (bound / unit[big])[:, None]
    return (out[0], clipped[:1]) if single else (out, clipped)


def clip_l2(values: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Scale each row to L2 norm at most ``bound``."""
    return _norm_clip(values, bound, 2)


def clip_l1(values: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Scale each row to L1 norm at most ``bound``."""
    return _norm_clip(values, bound, 1)


def clip_box(values: np.ndarray, lower: float | np.ndarray, upper: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clamp each coordinate into ``[lower, upper]``."""
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)) or np.any(lo > hi):
        raise ValueError("box bounds must be finite with lower <= upper")
    rows, single = _rows(values)
    out = np.clip(rows, lo, hi)
    clipped = np.any(out != rows, axis=1)
    return (out[0], clipped[:1]) if single else (out, clipped)


def clip_factors_torch(pieces: list, bound: float):
    """Per-row factors ``min(1, bound/‖g_i‖)`` (a torch tensor ``(n,)``) for rows split column-wise
    into ``pieces`` (torch tensors ``(n, k_j)``), ``‖g_i‖`` over all pieces. A row whose norm leaves the
    dtype's normal range is rescaled by its largest ``|coordinate|`` first (no overflow to a zero
    factor); other rows get ``bound/‖g_i‖`` directly. Branch-free (no device synchronisation)."""
    import torch

    _check_bound(bound)
    info = torch.finfo(pieces[0].dtype)
    norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p, dim=1) for p in pieces]), dim=0)
    peak = torch.stack([p.abs().amax(dim=1) if p.shape[1] else p.new_zeros(p.shape[0]) for p in pieces]).amax(dim=0)
    safe = torch.where(peak > 0, peak, torch.ones_like(peak))
    unit = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p / safe[:, None], dim=1)
                                                 for p in pieces]), dim=0)
    direct = torch.isfinite(norms) & (norms >= math.sqrt(info.tiny) * 2.0**30)
    return torch.clamp(torch.where(direct, bound / norms, (bound / unit) / safe), max=1.0)
