"""Vectorised keyed noise: Philox-4x64-10 evaluated on arrays of counters, and exact samplers on it.

A *cell* is one noise draw ``(stream, purpose, index)`` of one noise source. Its random words are the
blocks ``b = 0, 1, ...`` of ``Philox4x64-10(key = K(stream, purpose, index[:-3], len(index)),
counter = (b + 1, i₋₃, i₋₂, i₋₁))`` (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
1, 2, 3", SC 2011, §3 and §4.1): ``K`` is a 128-bit keyed BLAKE2b of the cell's family under the
source's secret key (personalisation :data:`CELL_PERSON`, the version of this derivation), and the
last three index integers (zero-padded in front) sit in the counter. A cell's draw therefore depends
only on its own key and coordinates: drawing 1 or 10,000 cells per call, in any order or grouping, on
any worker, gives the same numbers (so retries and replays stay identical). Many cells are computed
by :func:`philox4x64` on numpy arrays; a handful by numpy's own ``Philox`` (the same function, in C).

Family keys are cached per source (a stream's key is hashed once, not once per step); everything
else is numpy on arrays of ``(cells, blocks)`` words.

Samplers (all exact in real arithmetic; floating-point attacks, Mironov 2012, are out of scope):
uniforms on the open interval ``(0, 1)`` from the top 53 bits of each word; Gaussian by Box–Muller;
Laplace by inversion; K-norm as a Gaussian direction times a ``Gamma(d, scale)`` radius (a sum of
``d`` exponentials, exact for integer ``d``); discrete Laplace as the difference of two geometric
variables (inversion); discrete Gaussian by rejection from discrete Laplace (Canonne–Kamath–Steinke
2020, Algorithm 3), one fixed block of words per round, so rejections are grouping-invariant too.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "CELL_PERSON",
    "CellKeys",
    "LAWS",
    "philox4x64",
    "sample_uniforms",
]

# BLAKE2b personalisation (<= 16 bytes) of the cell-key derivation: the version of the derivation.
# Bump it whenever the derivation or the word layout of a sampler changes.
CELL_PERSON = b"beam_dp-cells-v2"
_COUNTER_INDEX = 3  # index integers carried in the counter; earlier ones go into the family key
_MASK32 = np.uint64(0xFFFFFFFF)
_U32 = np.uint64(32)
_MULT = np.array([[0xD2E7470EE14C6C93], [0xCA5A826395121157]], dtype=np.uint64)  # Philox M4x64_0, M4x64_1
_MULT_LO, _MULT_HI = _MULT & _MASK32, _MULT >> _U32
_WEYL = np.array([[0x9E3779B97F4A7C15], [0xBB67AE8584CAA73B]], dtype=np.uint64)  # key bumps W64_0, W64_1
_SMALL_BATCH = 4  # at most this many cells: numpy's C Philox per cell (the same words, less overhead)
_LONG_CELL = 2048  # words per cell from which the C Philox per cell wins at any cell count (~4x at 10^5 words)
_TWO_PI = 2.0 * math.pi
_CHUNK = 1 << 15  # counters per pass of philox4x64: a round's temporaries (~4 MiB) stay in cache (4-7x faster)


def philox4x64(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox-4x64-10 (Random123, as numpy's ``Philox``) on arrays: ``counter (..., 4)`` and ``key (..., 2)``
    uint64, broadcast against each other. The 64x64->128-bit products are done on 32-bit limbs, in place,
    :data:`_CHUNK` counters at a time."""
    ctr = np.asarray(counter, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    shape = np.broadcast_shapes(ctr.shape[:-1], k.shape[:-1])
    x = np.broadcast_to(ctr, shape + (4,)).reshape(-1, 4)
    keys_all = np.broadcast_to(k, shape + (2,)).reshape(-1, 2)
    out = np.empty((len(x), 4), dtype=np.uint64)
    for start in range(0, len(x), _CHUNK):
        stop = min(len(x), start + _CHUNK)
        _philox_rounds(x[start:stop], keys_all[start:stop], out[start:stop])
    return out.reshape(shape + (4,))


def _philox_rounds(x: np.ndarray, key: np.ndarray, out: np.ndarray) -> None:
    """The ten rounds on ``x (n, 4)`` counters and ``key (n, 2)`` keys, into ``out (n, 4)`` (one chunk)."""
    keys = key.T.copy()  # (k0, k1) rows
    mult, other = x[:, 0::2].T.copy(), x[:, 1::2].T.copy()  # (v0, v2): the words multiplied; (v1, v3)
    a_lo, a_hi, low, lh, hl, mid, high = (np.empty_like(mult) for _ in range(7))
    for r in range(10):
        if r:
            keys += _WEYL
        np.bitwise_and(mult, _MASK32, out=a_lo)
        np.right_shift(mult, _U32, out=a_hi)
        np.multiply(mult, _MULT, out=low)  # the low 64 bits of the product (uint64 multiplication wraps)
        np.multiply(a_lo, _MULT_HI, out=lh)
        np.multiply(a_hi, _MULT_LO, out=hl)
        np.multiply(a_lo, _MULT_LO, out=mid)
        np.right_shift(mid, _U32, out=mid)
        np.multiply(a_hi, _MULT_HI, out=high)
        for part in (lh, hl):  # high += part >> 32; mid += part & mask (a_lo is scratch now)
            np.right_shift(part, _U32, out=a_lo)
            high += a_lo
            np.bitwise_and(part, _MASK32, out=part)
            mid += part
        np.right_shift(mid, _U32, out=mid)
        high += mid
        # new (v0, v2) = (hi1 ^ v1 ^ k0, hi0 ^ v3 ^ k1); new (v1, v3) = (lo1, lo0)
        np.bitwise_xor(high[::-1], other, out=mult)
        mult ^= keys
        other[0], other[1] = low[1], low[0]
    out[:, 0::2] = mult.T
    out[:, 1::2] = other.T


class CellKeys:
    """The 128-bit Philox key of each cell family ``(stream, purpose, index[:-3], len(index))`` under
    one secret key, cached (bounded) so a stream's family is hashed once per source, not per step."""

    MAX_CACHED = 1 << 17
    MAX_CACHED_ROW_CELLS = 1 << 20  # keys of cell lists (groups, or groups drawn several steps ahead): 16 MiB

    def __init__(self, secret: bytes):
        self._secret = secret
        self._cache: dict[tuple, np.ndarray] = {}
        self._rows_cache: dict[tuple, np.ndarray] = {}
        self._rows_cached = 0  # cells held by _rows_cache
        self._local = threading.local()  # one reusable numpy Philox per thread (small batches)

    def family(self, stream: str, purpose: str, prefix: tuple[int, ...], length: int) -> np.ndarray:
        cache_key = (stream, purpose, prefix, length)
        words = self._cache.get(cache_key)
        if words is None:
            stream_b, purpose_b = stream.encode(), purpose.encode()
            message = (
                struct.pack("<I", len(stream_b)) + stream_b + struct.pack("<I", len(purpose_b)) + purpose_b
                + struct.pack(f"<I{len(prefix)}q", length, *prefix)
            )
            digest = hashlib.blake2b(message, key=self._secret, digest_size=16, person=CELL_PERSON).digest()
            words = np.frombuffer(digest, dtype="<u8").astype(np.uint64)
            if len(self._cache) >= self.MAX_CACHED:
                self._cache.clear()
            self._cache[cache_key] = words
        return words

    def _row_keys(self, streams: tuple[str, ...], purpose: str, length: int) -> np.ndarray:
        """The family keys of a list of cells' streams (a group's streams, or them repeated for several
        steps), cached as one array (at most ``MAX_CACHED_ROW_CELLS`` cells in all): a group drawing at
        every step stacks them once."""
        cache_key = (streams, purpose, length)
        keys = self._rows_cache.get(cache_key)
        if keys is None:  # each distinct stream's family once (a list drawn ahead repeats a group's streams)
            first = {s: i for i, s in enumerate(dict.fromkeys(streams))}
            where = np.fromiter(map(first.__getitem__, streams), np.int64, len(streams))
            keys = np.stack([self.family(s, purpose, (), length) for s in first])[where]
            keys.setflags(write=False)
            if self._rows_cached + len(keys) > self.MAX_CACHED_ROW_CELLS:
                self._rows_cache.clear()
                self._rows_cached = 0
            if len(keys) <= self.MAX_CACHED_ROW_CELLS:
                self._rows_cache[cache_key] = keys
                self._rows_cached += len(keys)
        return keys

    def cells(self, streams: Sequence[str], purpose: str, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(keys (n, 2), counter words (n, 3))`` uint64 of ``n`` cells; ``index`` is ``(n, k)`` int64."""
        n, k = index.shape
        tail = min(k, _COUNTER_INDEX)
        heads = np.zeros((n, _COUNTER_INDEX), dtype=np.uint64)
        heads[:, _COUNTER_INDEX - tail:] = index[:, k - tail:].view(np.uint64)
        if n == 0:
            return np.zeros((0, 2), np.uint64), heads
        if k <= _COUNTER_INDEX and n == 1:
            keys = self.family(streams[0], purpose, (), k)[None]
        elif k <= _COUNTER_INDEX:
            keys = self._row_keys(tuple(streams), purpose, k)
        else:
            prefixes = index[:, : k - tail].tolist()
            keys = np.stack([self.family(s, purpose, tuple(p), k) for s, p in zip(streams, prefixes)])
        return keys, heads

    def words(self, keys: np.ndarray, heads: np.ndarray, count: int, first_block: int = 0) -> np.ndarray:
        """Each cell's random words ``4·first_block .. 4·first_block + count − 1``: ``(n, count)`` uint64.

        Block ``b`` of a cell is ``Philox4x64-10(counter = (b + 1, i₋₃, i₋₂, i₋₁), key)``: exactly what
        numpy's ``Philox`` set to counter ``(b, i₋₃, i₋₂, i₋₁)`` returns next, which small batches use.
        """
        n = len(keys)
        if n <= _SMALL_BATCH or count >= _LONG_CELL:
            philox = getattr(self._local, "philox", None)
            if philox is None:
                philox = self._local.philox = np.random.Philox(key=0)
            out = np.empty((n, count), dtype=np.uint64)
            for i in range(n):
                counter = np.concatenate([np.array([first_block], dtype=np.uint64), heads[i]])
                philox.state = {
                    "bit_generator": "Philox", "state": {"counter": counter, "key": keys[i]},
                    "buffer": np.zeros(4, np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0,
                }
                out[i] = philox.random_raw(count)
            return out
        blocks = -(-count // 4)
        counter = np.empty((n, blocks, 4), dtype=np.uint64)
        counter[:, :, 0] = np.arange(first_block + 1, first_block + blocks + 1, dtype=np.uint64)[None, :]
        counter[:, :, 1:] = heads[:, None, :]
        return philox4x64(counter, keys[:, None, :]).reshape(n, 4 * blocks)[:, :count]

    def uniforms(self, keys: np.ndarray, heads: np.ndarray, count: int, first_block: int = 0) -> np.ndarray:
        """``words`` as uniforms on the open interval ``(0, 1)`` (top 53 bits, centred in their cell)."""
        return ((self.words(keys, heads, count, first_block) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


# -- exact samplers on uniforms ----------------------------------------------------------------------
def _normals(u: np.ndarray, size: int) -> np.ndarray:
    """Box–Muller: ``2·ceil(size/2)`` uniforms per row -> ``size`` standard normals per row."""
    half = -(-size // 2)
    radius = np.sqrt(-2.0 * np.log(u[:, :half]))
    angle = _TWO_PI * u[:, half: 2 * half]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)[:, :size]


def _geometric(u: np.ndarray, scale: float) -> np.ndarray:
    """``G`` on ``{0, 1, ...}`` with ``P(G >= k) = e^{-k/scale}``, by inversion."""
    return np.floor(-scale * np.log(u)).astype(np.int64)


def _gaussian(u: np.ndarray, sigma: float, size: int) -> np.ndarray:
    return sigma * _normals(u, size)


def _laplace(u: np.ndarray, scale: float, size: int) -> np.ndarray:
    centred = u[:, :size] - 0.5
    return -scale * np.sign(centred) * np.log1p(-2.0 * np.abs(centred))


def _k_norm(u: np.ndarray, scale: float, dim: int) -> np.ndarray:
    direction = _normals(u, dim)
    norms = np.linalg.norm(direction, axis=1, keepdims=True)
    start = 2 * (-(-dim // 2))
    radius = -scale * np.log(u[:, start: start + dim]).sum(axis=1, keepdims=True)  # Gamma(dim, scale)
    return direction / norms * radius


def _discrete_laplace(u: np.ndarray, scale: float, size: int) -> np.ndarray:
    return _geometric(u[:, :size], scale) - _geometric(u[:, size: 2 * size], scale)


_COUNTS: dict[str, Callable[[int], int]] = {
    "gaussian": lambda size: 2 * (-(-size // 2)),
    "laplace": lambda size: size,
    "k_norm": lambda dim: 2 * (-(-dim // 2)) + dim,
    "discrete_laplace": lambda size: 2 * size,
}
_SAMPLERS = {"gaussian": _gaussian, "laplace": _laplace, "k_norm": _k_norm, "discrete_laplace": _discrete_laplace}
LAWS = (*_SAMPLERS, "discrete_gaussian")


def sample_uniforms(law: str, uniforms: Callable[[int, int], np.ndarray], scale: float, size: int) -> np.ndarray:
    """Draws ``(n, size)`` of ``law`` for ``n`` cells; ``uniforms(count, first_block)`` returns each
    cell's uniforms ``(n, count)`` starting at word ``4·first_block``."""
    if law != "discrete_gaussian":
        return _SAMPLERS[law](uniforms(_COUNTS[law](size), 0), scale, size)
    # rejection from discrete Laplace(t), t = floor(sigma) + 1: round r uses the cell's blocks
    # [r·B, (r+1)·B) (B blocks hold 3·size words), so what a position draws never depends on the others
    sigma, t = scale, math.floor(scale) + 1
    per_round = -(-3 * size // 4)
    out: np.ndarray | None = None
    pending: np.ndarray | None = None
    r = 0
    while out is None or pending is None or pending.any():
        u = uniforms(3 * size, r * per_round)
        y = _discrete_laplace(u, t, size)
        accept = u[:, 2 * size: 3 * size] < np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2.0 * sigma**2))
        if out is None:
            out, pending = np.zeros(y.shape, dtype=np.int64), np.ones(y.shape, dtype=bool)
        take = pending & accept
        out[take] = y[take]
        pending &= ~accept
        r += 1
    return out
