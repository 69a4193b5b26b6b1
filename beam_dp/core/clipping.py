"""Clipping: bound each contribution before it touches mechanism state.

All functions take one vector ``(d,)`` or a block of rows ``(n, d)`` and return
``(clipped, was_clipped)`` where ``was_clipped`` is a boolean per row. Inputs must be finite;
non-finite values raise ``ValueError`` (adapters route them to the dead-letter output first).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["clip_box", "clip_l1", "clip_l2"]


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


def _norm_clip(values: np.ndarray, bound: float, ord_: int) -> tuple[np.ndarray, np.ndarray]:
    _check_bound(bound)
    rows, single = _rows(values)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows)) if ord_ == 2 else np.abs(rows).sum(axis=1)
    clipped = norms > bound
    factor = np.where(clipped, bound / np.where(clipped, norms, 1.0), 1.0)
    out = rows * factor[:, None]
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
