"""Square-root Toeplitz factorization counter (``"toeplitz_sqrt"``), Gaussian noise.

``C = B = A^{1/2}``: lower-triangular Toeplitz with ``c_0 = 1``, ``c_j = c_{j−1}(2j−1)/(2j)`` (the
coefficients of ``(1−x)^{−1/2}``; Fichtenberger–Henzinger–Upadhyay 2023, Henzinger–Upadhyay–Upadhyay
2023). The release at ``t`` is ``Σ_{s<=t} x_s + Σ_{j<t} c_j z_{t−j}``.

Guarantee: ``(epsilon, delta)``-DP, event level (replace one contribution, ``Δ₂ = 2R``), for the
releases ``t = 1..horizon`` (steps beyond it are refused: ``Σ_j c_j²`` grows like ``ln t / π``, so
there is no unbounded mode). ``σ = analytic_gaussian_sigma(ε, δ, Δ₂·sqrt(Σ_{j<T} c_j²))``;
``noise_var(t) = σ² Σ_{j<t} c_j²`` (max at ``t = T``: ``z²Δ₂²(Σ_{j<T} c_j²)²``). See
``factorization.py`` for the privacy argument and the ledger.

Memory and time, honestly: ``C`` has no finite recursion, so the noise at ``t`` needs every
``z_1..z_t``. They are not stored in the state (the running clean sum, ``d`` floats, and ``t``): the
``z``'s are regenerated from the key in blocks of ``BLOCK`` steps (key ``(stream, purpose, (b,))``, each
block always the same draw). The correlated noise ``Σ_{j<t} c_j z_{t−j}`` is computed for a whole
*span* of upcoming steps at once, by one FFT convolution of ``z_1..z_end`` with ``c`` (O(t·d·log t) per
span), and kept in a worker-local cache (a pure function of the key, never state; bounded by
``CACHE_BYTES``, recomputed identically after eviction). Spans: the first ``SPAN_STEPS`` steps, then
spans of ``2^m`` steps inside ``[2^m, 2^(m+1))``, capped so that one span of the group stays under
``CACHE_BYTES / 4`` (a power of two, at least ``BLOCK``). Uncapped, a step costs O(d·log t) amortised
and the cache holds about ``t·d`` floats per stream; capped (large groups, large ``d``), O(d +
t·d·log t / span). Spans of different lengths (a stream stepped alone or in a large group) round the
FFT differently: releases agree to float tolerance, not bit for bit. Measured in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import GroupState
from beam_dp.mechanisms.counters.factorization import ToeplitzFactorizationSum
from beam_dp.mechanisms.tree import _frozen

__all__ = ["ToeplitzSqrtState", "ToeplitzSqrtSum", "sqrt_coeffs"]

BLOCK = 256
SPAN_STEPS = 16 * BLOCK  # steps of correlated noise computed per FFT (and cached)
CACHE_BYTES = 256 << 20  # per noise source and mechanism instance


@lru_cache(maxsize=8)
def _sqrt_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    j = np.arange(1, n)
    c = np.concatenate([[1.0], np.cumprod((2.0 * j - 1.0) / (2.0 * j))])
    c.setflags(write=False)
    cum = np.cumsum(c**2)
    cum.setflags(write=False)
    return c, cum


def sqrt_coeffs(n: int) -> np.ndarray:
    """``c_0..c_{n−1}`` of ``A^{1/2}`` (read-only)."""
    return _sqrt_tables(int(n))[0]


@dataclass(frozen=True, eq=False)
class ToeplitzSqrtState:
    """``prefix``: the clean running sum (d,); the noise is regenerated from the key."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    prefix: np.ndarray


class ToeplitzSqrtSum(ToeplitzFactorizationSum):
    """Square-root factorization counter over a known ``horizon`` (module docstring)."""

    name = "toeplitz_sqrt"
    state_type = ToeplitzSqrtState

    def __init__(self, *, horizon: int, purpose: str = "toeplitz", **kwargs) -> None:
        if horizon is None:
            raise ValueError("toeplitz_sqrt needs a horizon: its sensitivity grows without bound")
        super().__init__(horizon=horizon, purpose=purpose, **kwargs)
        self._table_len = 1 << max(self.horizon - 1, 1).bit_length()
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._calibrate()

    def c_coeffs(self, n: int) -> np.ndarray:
        return sqrt_coeffs(max(n, self._table_len))[:n]

    def col_norm_sq(self, t: float) -> float:
        return float(_sqrt_tables(max(int(t), self._table_len))[1][int(t) - 1])

    def row_norm_sq(self, t: int) -> float:  # B = C
        return self.col_norm_sq(t)

    def init_state(self, stream: str) -> ToeplitzSqrtState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return ToeplitzSqrtState(stream, 0, _frozen(np.zeros(self.dim)))

    def noise_history(self, noise: NoiseSource, streams: tuple[str, ...], t: int) -> np.ndarray:
        """``z_1..z_t`` of every stream as a ``(streams, t, d)`` array (regenerated from the key, block by block)."""
        blocks = [
            noise.draw_cells("gaussian", streams, self.purpose, (b,), self.sigma, BLOCK * self.dim).reshape(-1, BLOCK, self.dim)
            for b in range((t - 1) // BLOCK + 1)
        ]
        return np.concatenate(blocks, axis=1)[:, :t]

    def _span_noise(self, noise: NoiseSource, streams: tuple[str, ...], t: int) -> np.ndarray:
        """``Σ_{j<t} c_j z_{t−j}`` of every stream ``(len(streams), d)``, from the cached span holding ``t``."""
        u = t - 1  # spans partition the 0-based steps: [0, SPAN_STEPS), then within each [2^m, 2^(m+1))
        cap = max(BLOCK, 1 << max((CACHE_BYTES // (4 * 8 * self.dim * len(streams))).bit_length() - 1, 0))
        span = SPAN_STEPS if u < SPAN_STEPS else min(1 << (u.bit_length() - 1), cap)
        k = u // span
        per_source = self._cache.setdefault(noise, OrderedDict())
        key = (streams, span, k)
        block = per_source.get(key)
        if block is None:
            lo, hi = k * span, min((k + 1) * span, self.horizon)
            z = self.noise_history(noise, streams, hi)
            n_fft = 1 << (2 * hi - 1).bit_length()
            conv = np.fft.irfft(np.fft.rfft(z, n_fft, axis=1) * np.fft.rfft(self.c_coeffs(hi), n_fft)[None, :, None],
                                n_fft, axis=1)
            block = np.ascontiguousarray(conv[:, lo:hi])
            per_source[key] = block
            while sum(b.nbytes for b in per_source.values()) > CACHE_BYTES and len(per_source) > 1:
                per_source.popitem(last=False)
        else:
            per_source.move_to_end(key)
        return block[:, u - k * span]

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        t = self._next_t(group)
        prefix = group.arrays["prefix"]
        if prefix.shape != (len(group.streams), self.dim):
            raise ValueError(f"{self.name}: state of dimension {prefix.shape[1:]}, expected ({self.dim},)")
        prefix = prefix + vectors
        estimate = prefix + self._span_noise(noise, group.streams, t)
        return GroupState(group.streams, t, {"prefix": prefix}), estimate, self._meta(t), self._worst_loss(t)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_cache", None)  # worker-local (weakly keyed by noise source), rebuilt on demand
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache = weakref.WeakKeyDictionary()
