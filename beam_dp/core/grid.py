"""Exact grid arithmetic for snapped releases (floating-point defence, docs/reliability.md §6).

A grid ``g = 2^k`` makes ``x/g`` and ``units·g`` exact in float64, and integer units add exactly, so a
release ``(rint(x/g) + rint(ν/g))·g`` is a data-dependent grid point plus grid noise whose computation
never mixes the data's low-order bits into the noise (Mironov 2012). Values are refused beyond
``2^52`` units, where float64 stops representing every integer.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EXACT_UNITS", "from_grid_units", "power_of_two_at_least", "snap_sum", "to_grid_units"]

EXACT_UNITS = 2**52


def power_of_two_at_least(granularity: float) -> float:
    """The grid actually used: the smallest power of two ``>= granularity`` (Mironov's Λ)."""
    if not (isinstance(granularity, (int, float, np.floating)) and not isinstance(granularity, bool)
            and math.isfinite(granularity) and granularity > 0):
        raise ValueError(f"granularity must be a finite number > 0, got {granularity!r}")
    grid = math.ldexp(1.0, math.frexp(float(granularity))[1])
    return grid / 2.0 if grid / 2.0 >= granularity else grid


def _check_range(units: np.ndarray, grid: float) -> None:
    if np.abs(units).max(initial=0) >= EXACT_UNITS:
        raise ValueError(f"a snapped value exceeds 2^52 grid units of {grid:g}: float64 would no longer "
                         "be exact; use a coarser granularity")


def to_grid_units(values: np.ndarray, grid: float) -> np.ndarray:
    """``rint(values/grid)`` as int64 (exact for a power-of-two grid)."""
    units = np.rint(np.asarray(values, dtype=np.float64) / grid)
    _check_range(units, grid)
    return units.astype(np.int64)


def from_grid_units(units: np.ndarray, grid: float) -> np.ndarray:
    """``units·grid`` as float64 (exact below 2^52 units)."""
    _check_range(units, grid)
    return np.asarray(units, dtype=np.int64) * grid


def snap_sum(value: np.ndarray, noise: np.ndarray, grid: float) -> np.ndarray:
    """``(rint(value/g) + rint(noise/g))·g``: the grid-rounded value plus grid noise, added exactly."""
    return from_grid_units(to_grid_units(value, grid) + to_grid_units(noise, grid), grid)
