"""Keyed, reproducible noise and the samplers every mechanism draws from.

``NoiseSource(key)`` derives an independent counter-based generator (numpy ``Philox``) for each
``(stream, purpose, index...)`` from a secret key with a keyed BLAKE2b hash. ``for_domain(domain)``
derives the source of one *noise domain* (one transform instance of one job): every draw a transform
makes is keyed by ``(key, domain, stream, purpose, index)``, so two transforms never share noise. The same node always
gets the same noise, so a bundle retry or a replay re-emits identical releases instead of fresh,
averageable noise (Chan, Shi & Song, "Private and Continual Release of Statistics"). The key is a secret: it is never shown by
``repr``, never pickled (so it cannot end up in a Beam pipeline graph) and never logged.

Samplers (module functions take a ``numpy.random.Generator``; the ``NoiseSource`` methods take a
node key):

* ``laplace``          density ∝ exp(-|x|/scale) per coordinate (pure eps under an L1 bound);
* ``gaussian``         N(0, sigma^2 I) (calibrate with ``beam_dp.core.calibration``);
* ``k_norm``           density ∝ exp(-||x||_2 / scale): radius ~ Gamma(d, scale), uniform direction
                       (pure eps under an L2 bound: a query of L2 sensitivity D costs D/scale);
* ``discrete_laplace`` P(x) ∝ exp(-|x|/scale) on the integers;
* ``discrete_gaussian`` P(x) ∝ exp(-x^2/(2 sigma^2)) on the integers (Canonne–Kamath–Steinke 2020).

Floating-point attacks on samplers (Mironov 2012) are out of scope for this version.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import struct
import threading
from typing import Callable

import numpy as np

__all__ = [
    "KEY_ENV_VAR",
    "NoiseSource",
    "discrete_gaussian",
    "discrete_laplace",
    "gaussian",
    "k_norm",
    "laplace",
    "load_key",
]

log = logging.getLogger(__name__)

KEY_ENV_VAR = "BEAM_DP_NOISE_KEY"
_MIN_KEY_BYTES = 16
_PERSON = b"beam_dp-noise-v1"
# Version tag of the domain-key derivation (BLAKE2b personalisation, at most 16 bytes): bump it if the
# derivation ever changes, so that old and new releases can never share noise by accident.
_DOMAIN_PERSON = b"beam_dp-domain-1"


def _check_scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def laplace(rng: np.random.Generator, scale: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """I.i.d. Laplace(0, scale) draws."""
    _check_scale("scale", scale)
    return rng.laplace(0.0, scale, size)


def gaussian(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """I.i.d. N(0, sigma^2) draws."""
    _check_scale("sigma", sigma)
    return rng.normal(0.0, sigma, size)


def k_norm(rng: np.random.Generator, scale: float, dim: int, n: int | None = None) -> np.ndarray:
    """K-norm ("Gamma") noise for the L2 ball: density ∝ exp(-||x||_2/scale) in R^dim.

    Returns shape ``(dim,)`` or ``(n, dim)``. Each coordinate has variance ``(dim + 1) scale^2``.
    """
    _check_scale("scale", scale)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    rows = 1 if n is None else n
    direction = rng.standard_normal((rows, dim))
    norms = np.linalg.norm(direction, axis=1, keepdims=True)
    radius = rng.gamma(shape=dim, scale=scale, size=(rows, 1))
    out = direction / norms * radius
    return out[0] if n is None else out


def discrete_laplace(rng: np.random.Generator, scale: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Integer draws with P(x) ∝ exp(-|x|/scale): the difference of two geometric variables."""
    _check_scale("scale", scale)
    p = -math.expm1(-1.0 / scale)  # success probability 1 - e^{-1/scale}
    diff = np.asarray(rng.geometric(p, size) - rng.geometric(p, size)).astype(np.int64)
    return diff if size is not None else diff[()]  # size=None: a scalar (np.int64), as discrete_gaussian


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Integer draws with P(x) ∝ exp(-x^2/(2 sigma^2)) (rejection from discrete Laplace, CKS 2020 Alg. 3).

    Vectorised: each round proposes for all still-rejected positions at once.
    """
    _check_scale("sigma", sigma)
    shape = () if size is None else (size,) if isinstance(size, int) else tuple(size)
    n = int(np.prod(shape)) if shape else 1
    t = math.floor(sigma) + 1
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        y = discrete_laplace(rng, t, pending.size)
        accept_prob = np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2.0 * sigma**2))
        ok = rng.random(pending.size) < accept_prob
        out[pending[ok]] = y[ok]
        pending = pending[~ok]
    return out.reshape(shape) if shape else out[0]


def _read_local(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def load_key(
    env_var: str | None = KEY_ENV_VAR,
    key_file: str | os.PathLike | None = None,
    read: Callable[[str], bytes] | None = None,
) -> bytes | None:
    """Read a secret key from a file (raw bytes, or hex text) or from an env var (hex text).

    ``read(key_file) -> bytes`` fetches the file (default: a local file; the Beam side passes a
    reader for any Beam filesystem or a secret store, so this module stays engine-free). The file
    wins over the env var. Returns ``None`` when neither is set. Never logs the key.
    """
    raw: bytes | None = None
    if key_file:
        raw = (read or _read_local)(key_file)
    elif env_var and os.environ.get(env_var):
        raw = os.environ[env_var].encode()
    if raw is None:
        return None
    text = raw.strip()
    try:
        if len(text) >= 2 * _MIN_KEY_BYTES and len(text) % 2 == 0:
            return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        pass
    if not key_file:
        raise ValueError(f"the env var {env_var} must hold at least {2 * _MIN_KEY_BYTES} hex characters")
    return raw


class NoiseSource:
    """Secret key -> an independent Philox generator per ``(stream, purpose, index...)``.

    A node's noise is a pure function of its key, so drawing "again" returns the same vector.
    """

    def __init__(self, key: bytes):
        if not isinstance(key, (bytes, bytearray)) or len(key) < _MIN_KEY_BYTES:
            raise ValueError(f"the noise key must be at least {_MIN_KEY_BYTES} bytes")
        key = bytes(key)
        self._key = key if len(key) <= 64 else hashlib.blake2b(key, digest_size=64).digest()
        self._local = threading.local()

    @classmethod
    def from_config(
        cls, env_var: str | None = KEY_ENV_VAR, key_file: str | None = None, read: Callable[[str], bytes] | None = None
    ) -> "NoiseSource":
        """Load the key (file read by ``read``, then env var); without one, draw a random key and say so."""
        key = load_key(env_var, key_file, read)
        if key is None:
            log.warning(
                "beam_dp: no noise key configured (env var %s or a key file); using a random key. "
                "This run's releases are not reproducible and a retry may not reproduce them.",
                env_var,
            )
            key = os.urandom(32)
        return cls(key)

    def for_domain(self, domain: str) -> "NoiseSource":
        """The noise source of one noise domain (one transform instance of one job).

        Its key is ``BLAKE2b(domain, key=self's key)``: sources of different domains are independent
        (pseudo-random under the secret key) and a domain's draws are the same on every replay.
        """
        if not isinstance(domain, str) or not domain:
            raise ValueError(f"a noise domain must be a non-empty string, got {domain!r}")
        try:
            message = domain.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a noise domain must be encodable as UTF-8") from None
        return NoiseSource(hashlib.blake2b(message, key=self._key, digest_size=32, person=_DOMAIN_PERSON).digest())

    def __repr__(self) -> str:
        return "NoiseSource(<secret key>)"

    def __reduce__(self):
        raise TypeError("NoiseSource holds a secret key and must not be pickled; build it on the worker")

    def _node_key(self, stream: str, purpose: str, index: tuple[int, ...]) -> bytes:
        stream_b, purpose_b = stream.encode(), purpose.encode()
        message = (
            struct.pack("<I", len(stream_b)) + stream_b + struct.pack("<I", len(purpose_b)) + purpose_b
            + struct.pack(f"<{len(index)}q", *(int(i) for i in index))
        )
        return hashlib.blake2b(message, key=self._key, digest_size=16, person=_PERSON).digest()

    def generator(self, stream: str, purpose: str, *index: int) -> np.random.Generator:
        """A fresh generator for one node (its own object; safe to keep)."""
        key = int.from_bytes(self._node_key(stream, purpose, index), "little")
        return np.random.Generator(np.random.Philox(key=key))

    def _positioned(self, stream: str, purpose: str, index: tuple[int, ...]) -> np.random.Generator:
        """The node's generator at counter 0, reusing one per-thread Philox (5× cheaper than a new one).

        Yields exactly the draws of ``generator(stream, purpose, *index)``; valid until the next call.
        """
        digest = self._node_key(stream, purpose, index)
        local = self._local
        if not hasattr(local, "philox"):
            local.philox = np.random.Philox(key=0)
            local.generator = np.random.Generator(local.philox)
        local.philox.state = {
            "bit_generator": "Philox",
            "state": {"counter": np.zeros(4, np.uint64), "key": np.frombuffer(digest, dtype="<u8").astype(np.uint64)},
            "buffer": np.zeros(4, np.uint64),
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return local.generator

    def laplace(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, size: int) -> np.ndarray:
        return laplace(self._positioned(stream, purpose, index), scale, size)

    def gaussian(self, stream: str, purpose: str, index: tuple[int, ...], sigma: float, size: int) -> np.ndarray:
        return gaussian(self._positioned(stream, purpose, index), sigma, size)

    def k_norm(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, dim: int) -> np.ndarray:
        return k_norm(self._positioned(stream, purpose, index), scale, dim)

    def discrete_laplace(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, size: int) -> np.ndarray:
        return discrete_laplace(self._positioned(stream, purpose, index), scale, size)

    def discrete_gaussian(self, stream: str, purpose: str, index: tuple[int, ...], sigma: float, size: int) -> np.ndarray:
        return discrete_gaussian(self._positioned(stream, purpose, index), sigma, size)
