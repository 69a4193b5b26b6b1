"""Grid-snapped continual sums: exact arithmetic on the data, data-independent noise.

Floating-point noise addition leaks (Mironov, CCS 2012): ``fl(x + n)`` has low-order bits and a set
of reachable outputs that depend on ``x``. :class:`SnappedSum` wraps any *linear* continual-sum
mechanism (every counter, the trees, the window tree: a release is the exact prefix sum plus a noise
term that is a function of the key alone) and releases on a grid ``g = 2^k``:

1. each step's clipped sum ``x_t`` is rounded to the grid, ``x̄_t = g·rint(x_t/g)``, and accumulated
   **as an integer number of grid units** (int64: exact);
2. the noise term is computed by running the wrapped mechanism on **all-zero steps** (its release is
   then the noise alone: it never sees the data) and rounded to the grid, ``n̄_t = g·rint(n_t/g)``;
3. the release is ``(S̄_t + n̄_t)`` in grid units times ``g``: an exact integer sum (int64, or Python
   integers where int64 could overflow) and a power-of-two scaling, exact below ``2^53`` units and
   the nearest float beyond. That last rounding is a function of the exact grid value alone
   (post-processing), so no step is ever refused and the release schedule never depends on the data.

Guarantee. ``S̄_t + n̄_t = round_g(S̄_t + n_t)``, so each release is post-processing of the wrapped
mechanism run on the rounded steps ``x̄``. A replace-one neighbour moves at most two steps; rounding
moves each by at most ``√d·g/2`` more, so a node moves by at most ``2R + 2√d·g = 2R'`` with
``R' = R + √d·g``. The wrapped mechanism is therefore **built and calibrated for clip bound R'**
(the guarantee is adjusted: same ε, δ, slightly more noise) while contributions are clipped at ``R``.
When every step sum is already on the grid (counts with ``g ≤ 1``: ``inputs_on_grid=True``) rounding
is the identity and ``R' = R``.

What this buys in floating point: the released value is a data-dependent grid point plus grid noise
whose law does not depend on the data, added exactly; the low bits and the set of reachable outputs
no longer depend on the data. What it does not: the *computed* noise law is numpy's floating-point
approximation of the ideal one (e.g. its tails are truncated near 2^−53 probability), so the proved
(ε, δ) holds for the ideal law and the real one differs from it by a data-independent approximation
error that is not bounded formally here (docs/reliability.md §6).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from beam_dp.core.grid import add_units, from_grid_units, power_of_two_at_least, to_grid_units
from beam_dp.core.guarantee import Charge
from beam_dp.core.noise import NoiseSource
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import ContinualSumMechanism

__all__ = ["SnappedState", "SnappedSum"]


@dataclass(frozen=True)
class SnappedState:
    """``units``: the exact prefix sum of the rounded steps in grid units (int64, or an object array of
    Python integers beyond 2^62 units; the only data);
    ``inner``: the wrapped mechanism's state on all-zero steps (noise only)."""

    stream: str
    units: np.ndarray
    inner: Any

    @property
    def t(self) -> int:
        return int(self.inner.t)


@dataclass(frozen=True)
class _SnappedWire:
    """Byte encoding of :class:`SnappedState` (the wrapped state as its own encoding)."""

    STATE_VERSION = 1
    stream: str
    units: np.ndarray
    inner: np.ndarray  # uint8 bytes of the wrapped mechanism's encode_state


class SnappedSum(ContinualSumMechanism[SnappedState]):
    """A linear continual sum released on the grid ``g`` with exact arithmetic (see the module docstring).

    ``make_inner(clip_bound)`` builds the wrapped mechanism for a given clip bound; it is called with
    ``R' = R + √d·g`` (or ``R`` when ``inputs_on_grid``). The guarantee is the wrapped mechanism's,
    valid for contributions clipped at ``R``; ``epsilon_spent`` is its spend. Releases carry
    ``meta["granularity"] = g`` and ``meta["snapped_clip_bound"] = R'``.
    """

    noise_laws = ("gamma", "gaussian", "discrete_laplace")

    def __init__(self, make_inner: Callable[[float], ContinualSumMechanism], *, clip_bound: float,
                 granularity: float, inputs_on_grid: bool = False) -> None:
        self.granularity = power_of_two_at_least(granularity)
        probe = make_inner(clip_bound)
        enlarged = clip_bound if inputs_on_grid else clip_bound + math.sqrt(probe.dim) * self.granularity
        self.inner = probe if enlarged == clip_bound else make_inner(enlarged)
        super().__init__(dataclasses.replace(self.inner.spec, clip_bound=clip_bound))
        self.inputs_on_grid = bool(inputs_on_grid)
        self.name = self.inner.name
        self.guarantee = self.inner.guarantee
        self.state_type = SnappedState

    def __repr__(self) -> str:
        return f"SnappedSum({self.inner!r}, granularity={self.granularity:g}, clip_bound={self.clip_bound:g})"

    def init_state(self, stream: str) -> SnappedState:
        return SnappedState(stream, np.zeros(self.dim, np.int64), self.inner.init_state(stream))

    def _to_units(self, vector: np.ndarray) -> np.ndarray:
        units = to_grid_units(vector, self.granularity)
        if self.inputs_on_grid and not np.array_equal(from_grid_units(units, self.granularity), vector):
            raise ValueError("inputs_on_grid: a step sum is not a multiple of the granularity")
        return units

    def _advance(self, state: SnappedState, vector: np.ndarray, noise: NoiseSource):
        # The wrapped mechanism sees zeros only: its release is the noise term, computed without the data.
        inner_state, noise_value, meta, loss = self.inner._advance(state.inner, np.zeros(self.dim), noise)
        units = add_units(state.units, self._to_units(vector))
        value = from_grid_units(add_units(units, to_grid_units(noise_value, self.granularity)), self.granularity)
        meta = {**meta, "granularity": self.granularity, "snapped_clip_bound": self.inner.clip_bound,
                "noise_std": math.sqrt(self.noise_var(inner_state.t))}
        return SnappedState(state.stream, units, inner_state), value, meta, loss

    def noise_var(self, t: int) -> float:
        """The wrapped noise variance plus ``g²/12`` (rounding a noise much wider than the grid)."""
        return self.inner.noise_var(t) + self.granularity**2 / 12.0

    def charges_at(self, t: int) -> list[Charge]:
        return self.inner.charges_at(t)

    def encode_state(self, state: SnappedState) -> bytes:
        inner = np.frombuffer(self.inner.encode_state(state.inner), dtype=np.uint8)
        units = state.units if state.units.dtype == np.int64 else tuple(int(u) for u in state.units)
        return encode_state(_SnappedWire(state.stream, units, inner))

    def decode_state(self, data: bytes) -> SnappedState:
        wire = decode_state(_SnappedWire, data)
        # int64 units, or (beyond 2^62 units) a tuple of exact Python integers
        units = np.array(wire.units, dtype=object) if isinstance(wire.units, tuple) else np.asarray(wire.units)
        if units.dtype not in (np.int64, object) or units.shape != (self.dim,):
            raise ValueError(f"snapped state units must be {self.dim} integers")
        if units.dtype == object and not all(isinstance(u, int) for u in units):
            raise ValueError("snapped state units must be integers")
        return SnappedState(wire.stream, units, self.inner.decode_state(wire.inner.tobytes()))
