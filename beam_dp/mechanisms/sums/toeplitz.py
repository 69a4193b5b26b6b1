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
*span* of upcoming steps at once and kept in a worker-local cache (a pure function of the key, never
state; bounded by ``CACHE_BYTES``, recomputed identically after eviction). Spans: the first
``SPAN_STEPS`` steps, then spans of ``2^m`` steps inside ``[2^m, 2^(m+1))``, capped so that one span of
the group stays under ``CACHE_BYTES / 4`` (a power of two, at least ``BLOCK``). A span is a uniformly
partitioned FFT convolution (``_SpanJob``) cut into small units of work (one noise block, one chunk
FFT, one chunk × target product, one inverse), and the next span's units are spread over the steps
of the current one, so no step pays for a whole span (a fresh worker mid-span computes
its span at once, with the same floats). Uncapped, a step costs O(d·log t) amortised and the cache
holds about ``t·d`` floats per stream; capped (large groups, large ``d``), O(d·(t/B + log B)) with
``B`` the partition. Spans of different lengths (a stream stepped alone or in a large group) round
the FFT differently: releases agree to float tolerance, not bit for bit. Measured in
``docs/performance.md``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import GroupState, SumSpec
from beam_dp.mechanisms.sums.factorization import ToeplitzFactorizationSum
from beam_dp.mechanisms.sums.tree import _frozen

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

    def __init__(self, spec: SumSpec | None = None, /, *, horizon: int, purpose: str = "toeplitz", **given: Any) -> None:
        """Args:
            spec: the shared parameters (``SumSpec``, or its fields as keywords; ``noise="gaussian"``).
            horizon: the public last step ``T``, in ``[1, 2**62]`` (required: the sensitivity grows without bound).
            purpose: the noise purpose.
        """
        if horizon is None:
            raise ValueError("toeplitz_sqrt needs a horizon: its sensitivity grows without bound")
        super().__init__(spec, horizon=horizon, purpose=purpose, **given)
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
        return np.concatenate([self.noise_block(noise, streams, b) for b in range((t - 1) // BLOCK + 1)], axis=1)[:, :t]

    def noise_block(self, noise: NoiseSource, streams: tuple[str, ...], b: int) -> np.ndarray:
        """``z`` of the 0-based steps ``[b·BLOCK, (b+1)·BLOCK)``, ``(streams, BLOCK, d)``: the cell ``(stream, purpose, (b,))``."""
        return noise.draw_cells("gaussian", streams, self.purpose, (b,), self.sigma, BLOCK * self.dim).reshape(
            -1, BLOCK, self.dim)

    def _span_of(self, u: int, groups: int) -> tuple[int, int]:
        """``(span, k)``: the span ``[k·span, (k+1)·span)`` holding the 0-based step ``u`` for a group of ``groups``."""
        cap = max(BLOCK, 1 << max((CACHE_BYTES // (4 * 8 * self.dim * groups)).bit_length() - 1, 0))
        span = SPAN_STEPS if u < SPAN_STEPS else min(1 << (u.bit_length() - 1), cap)
        return span, u // span

    def _span_noise(self, noise: NoiseSource, streams: tuple[str, ...], t: int) -> np.ndarray:
        """``Σ_{j<t} c_j z_{t−j}`` of every stream ``(len(streams), d)``, from the cached span holding ``t``; then a
        share of the work of the next span (so that no step pays for a whole span)."""
        u = t - 1  # spans partition the 0-based steps: [0, SPAN_STEPS), then within each [2^m, 2^(m+1))
        span, k = self._span_of(u, len(streams))
        per_source = self._cache.setdefault(noise, OrderedDict())
        block = self._entry(per_source, streams, span, k, noise).finish()
        nxt = (k + 1) * span
        if nxt < self.horizon:  # the next span, paced to be done by its first step
            job = self._entry(per_source, streams, *self._span_of(nxt, len(streams)), noise)
            job.advance(-(-job.remaining // (nxt - u)))
        while sum(e.nbytes for e in per_source.values()) > CACHE_BYTES and len(per_source) > 2:
            per_source.popitem(last=False)
        return block[:, u - k * span]

    def _entry(self, per_source: OrderedDict, streams: tuple[str, ...], span: int, k: int, noise: NoiseSource) -> "_SpanJob":
        key = (streams, span, k)
        job = per_source.get(key)
        if job is None:
            job = per_source[key] = _SpanJob(self, noise, streams, k * span, min((k + 1) * span, self.horizon), span)
        per_source.move_to_end(key)
        return job

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        t = self._next_t(group)
        prefix = group.arrays["prefix"]
        if prefix.shape != (len(group.streams), self.dim):
            raise ValueError(f"{self.name}: state of dimension {prefix.shape[1:]}, expected ({self.dim},)")
        prefix = prefix + vectors
        estimate = prefix + self._span_noise(noise, group.streams, t)
        return GroupState(group.streams, t, {"prefix": prefix}), estimate, self._meta(t), self._worst_loss(t)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_cache", None)  # worker-local (weakly keyed by noise source), rebuilt on demand
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache = weakref.WeakKeyDictionary()


class _SpanJob:
    """The correlated noise ``Σ_{j<=u} c_j z_{u−j}`` of the 0-based steps ``u`` in ``[lo, hi)``, ``(streams, hi − lo, d)``,
    computed in small units of work so that it can be spread over the steps before ``lo``.

    A uniformly partitioned FFT convolution: sources ``z`` in chunks of ``B`` steps (``B = max(BLOCK, span / 64)``),
    targets in blocks of ``B`` steps; the contribution of source chunk ``a`` to target block ``b`` is the middle of
    a circular convolution of length ``2B`` with the ``2B − 1`` coefficients around ``c_{(b−a)B}``, accumulated in
    the frequency domain and inverted once per target block. Units: one noise block drawn, one chunk transformed,
    one (chunk, target) product, one target inverted; each costs O(B·d) per stream, the whole span
    O(hi·d·(span / B + log B)). The units always run in the same order, so the result does not depend on how
    they were paced (a fresh worker computing the span at once gets the same floats).
    """

    def __init__(self, mech: ToeplitzSqrtSum, noise: NoiseSource, streams: tuple[str, ...], lo: int, hi: int, span: int):
        self.B = max(BLOCK, span // 64)
        n_lo, n_tgt = lo // self.B, -(-(hi - lo) // self.B)
        n_src = n_lo + n_tgt
        self.remaining = (n_src * (self.B // BLOCK + 1) + n_lo * n_tgt + n_tgt * (n_tgt + 1) // 2 + n_tgt)
        self.nbytes = 0
        self._result: np.ndarray | None = None
        self._units = self._run(mech, noise, streams, lo, hi, n_lo, n_tgt)

    def advance(self, units: int) -> None:
        """Run up to ``units`` more units of work (``remaining`` paces them; ``finish`` does whatever is left)."""
        for _ in range(min(units, self.remaining)):
            next(self._units, None)
            self.remaining -= 1

    def finish(self) -> np.ndarray:
        """The span's noise, computing what is left of it now."""
        if self._result is None:
            for _ in self._units:
                pass
            self.remaining = 0
        return self._result

    def _run(self, mech, noise, streams, lo, hi, n_lo, n_tgt):
        B, d, n = self.B, mech.dim, len(streams)
        c = np.zeros((n_lo + n_tgt) * B)
        c[:hi] = mech.c_coeffs(hi)  # c_j with j >= hi reach only steps >= hi: never read
        c_hat: dict[int, np.ndarray] = {}
        acc = np.zeros((n_tgt, n, B + 1, d), np.complex128)
        out = np.empty((n, hi - lo, d))
        self.nbytes = acc.nbytes + out.nbytes
        for a in range(n_lo + n_tgt):
            z = np.empty((n, B, d))
            for j in range(B // BLOCK):
                z[:, j * BLOCK:(j + 1) * BLOCK] = mech.noise_block(noise, streams, a * (B // BLOCK) + j)
                yield
            z_hat = np.fft.rfft(z, 2 * B, axis=1)
            yield
            for i in range(max(0, a - n_lo), n_tgt):
                delta = n_lo + i - a
                if delta not in c_hat:  # w_k = c_{(δ−1)B+1+k}, k < 2B − 1 (zero below index 0)
                    first = (delta - 1) * B + 1
                    w = c[max(first, 0):(delta + 1) * B]
                    c_hat[delta] = np.fft.rfft(np.concatenate([np.zeros(max(-first, 0)), w]), 2 * B)
                acc[i] += z_hat * c_hat[delta][None, :, None]
                yield
            if a >= n_lo:  # target block a − n_lo has all its sources
                i = a - n_lo
                width = min(B, hi - lo - i * B)
                out[:, i * B:i * B + width] = np.fft.irfft(acc[i], 2 * B, axis=1)[:, B - 1:B - 1 + width]
                yield
        self._result, self.nbytes = out, out.nbytes
