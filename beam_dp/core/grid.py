"""Exact grid arithmetic for snapped releases (floating-point defence, docs/reliability.md §6).

A grid ``g = 2^k`` makes ``x/g`` and ``units·g`` exact in float64, and integer units add exactly, so a
release ``(rint(x/g) + rint(ν/g))·g`` is a data-dependent grid point plus grid noise whose computation
never mixes the data's low-order bits into the noise (Mironov 2012). Nothing is ever refused: units
are int64 while they cannot overflow and Python integers beyond (exact at any size), and the release
is the float nearest the exact grid value, a deterministic function of it (post-processing). So
whether a step releases never depends on the data, whatever the granularity.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np

__all__ = ["EXACT_UNITS", "add_units", "from_grid_units", "power_of_two_at_least", "snap_sum", "to_grid_units"]

EXACT_UNITS = 2**52  # below this many units, units·g is exact in float64
_FAST_LIMIT = 2.0**62


def power_of_two_at_least(granularity: float) -> float:
    """The grid actually used: the smallest power of two ``>= granularity`` (Mironov's Λ)."""
    if not (isinstance(granularity, (int, float, np.floating)) and not isinstance(granularity, bool)
            and math.isfinite(granularity) and granularity > 0):
        raise ValueError(f"granularity must be a finite number > 0, got {granularity!r}")
    grid = math.ldexp(1.0, math.frexp(float(granularity))[1])
    return grid / 2.0 if grid / 2.0 >= granularity else grid


def _fits_int64(scaled: np.ndarray) -> bool:
    """Every value finite and below 2^62 in magnitude (so a sum of two stays below 2^63)."""
    return bool(np.all(np.abs(scaled) < _FAST_LIMIT))


def _exact_units(x: float, grid: float) -> int:
    return round(Fraction(x) / Fraction(grid))  # exact; ties to even, as numpy's rint


def to_grid_units(values: np.ndarray, grid: float) -> np.ndarray:
    """``rint(values/grid)``, exactly: int64 when every value is below 2^62 units, else an object
    array of Python integers (exact at any size). Values must be finite."""
    arr = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.rint(arr / grid)
    if _fits_int64(scaled):
        return scaled.astype(np.int64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("cannot put a non-finite value on the grid")
    flat = [_exact_units(float(x), grid) for x in arr.ravel()]
    return np.array(flat, dtype=object).reshape(arr.shape)


def add_units(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` in grid units, exactly: int64 while it cannot overflow, Python integers beyond."""
    if a.dtype == np.int64 and b.dtype == np.int64 and _fits_int64(a) and _fits_int64(b):
        return a + b
    return np.asarray(a, dtype=object) + np.asarray(b, dtype=object)


def from_grid_units(units: np.ndarray, grid: float) -> np.ndarray:
    """``units·grid`` as float64: exact below 2^53 units; beyond, the float nearest the exact value
    (saturated at ±the largest float). A deterministic function of the exact integer, so rounding here
    is post-processing: it never depends on anything but the released grid value."""
    if units.dtype == np.int64 and bool(np.all(np.abs(units) <= EXACT_UNITS)):
        return units * grid
    exact_grid = Fraction(grid)
    return np.array([_nearest_float(Fraction(int(u)) * exact_grid) for u in np.ravel(units)],
                    dtype=np.float64).reshape(np.shape(units))


def _nearest_float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.copysign(sys.float_info.max, value)


def snap_sum(value: np.ndarray, noise: np.ndarray, grid: float) -> np.ndarray:
    """``(rint(value/g) + rint(noise/g))·g``: the grid-rounded value plus grid noise, added exactly."""
    return from_grid_units(add_units(to_grid_units(value, grid), to_grid_units(noise, grid)), grid)
