"""Keyed, reproducible noise and the samplers every mechanism draws from.

``NoiseSource(key)`` draws the noise of each *cell* ``(stream, purpose, index...)`` from a secret
key: a keyed BLAKE2b hash of the cell's family and a counter-based generator (Philox-4x64-10) whose
counter holds the cell's index (:mod:`beam_dp.core.keyed_noise`, derivation version
``CELL_PERSON``). ``draw_cells`` draws many cells in one vectorised call, with exactly the numbers
one-cell calls give. ``for_domain(domain, binding)`` derives the source of one *noise domain* (one
transform instance of one job) under one calibration (``binding``, the hash of every public parameter
that sets the noise: :mod:`beam_dp.core.noise_binding`): every draw a transform makes is keyed by
``(key, domain, binding, stream, purpose, index)``, so two transforms never share noise and a changed
parameter draws independent noise. The same cell always gets the same noise, so a bundle
retry or a replay re-emits identical releases instead of fresh, averageable noise (Chan, Shi & Song,
"Private and Continual Release of Statistics"). ``generator(stream, purpose, *index)`` gives a numpy ``Generator`` per node
for non-noise randomness (sampling, permutations). The key is a secret: it is never shown by
``repr``, never pickled (so it cannot end up in a Beam pipeline graph) and never logged.

Samplers (exact in real arithmetic, one implementation on uniforms shared by both entry points: module
functions take a ``numpy.random.Generator``, the ``NoiseSource`` methods take a cell):

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
from collections.abc import Callable, Sequence

import numpy as np

from beam_dp.core.keyed_noise import LAWS, CellKeys, sample_uniforms

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
_PERSON = b"beam_dp-noise-v1"  # generator() keys (sampling, permutations); noise cells: keyed_noise
# Version tags of the domain-key derivation (BLAKE2b personalisations, at most 16 bytes): bump on any
# change, so that old and new releases can never share noise by accident. Version 2 binds the
# calibration; version 1 (the domain alone) is kept for noise drawn before the binding.
_DOMAIN_PERSON = b"beam_dp-domain-2"
_LEGACY_DOMAIN_PERSON = b"beam_dp-domain-1"


def _check_scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _open_uniforms(rng: np.random.Generator, rows: int) -> Callable[[int, int], np.ndarray]:
    """Uniforms on ``(0, 1)`` from a ``Generator``, shaped as ``rows`` cells (see ``sample_uniforms``;
    ``first_block`` is not needed: each call continues the generator's sequence)."""
    return lambda count, first_block: (rng.integers(0, 1 << 53, (rows, count)) + 0.5) * 2.0**-53


def _draw(rng: np.random.Generator, law: str, scale: float, size: int | tuple[int, ...] | None) -> np.ndarray:
    shape = () if size is None else (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    n = int(np.prod(shape)) if shape else 1
    out = sample_uniforms(law, _open_uniforms(rng, 1), scale, n)[0]
    return out.reshape(shape) if shape else out[0]


def laplace(rng: np.random.Generator, scale: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """I.i.d. Laplace(0, scale) draws."""
    _check_scale("scale", scale)
    return _draw(rng, "laplace", scale, size)


def gaussian(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """I.i.d. N(0, sigma^2) draws."""
    _check_scale("sigma", sigma)
    return _draw(rng, "gaussian", sigma, size)


def k_norm(rng: np.random.Generator, scale: float, dim: int, n: int | None = None) -> np.ndarray:
    """K-norm ("Gamma") noise for the L2 ball: density ∝ exp(-||x||_2/scale) in R^dim.

    Returns shape ``(dim,)`` or ``(n, dim)``. Each coordinate has variance ``(dim + 1) scale^2``.
    """
    _check_scale("scale", scale)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    out = sample_uniforms("k_norm", _open_uniforms(rng, 1 if n is None else n), scale, dim)
    return out[0] if n is None else out


def discrete_laplace(rng: np.random.Generator, scale: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Integer draws with P(x) ∝ exp(-|x|/scale): the difference of two geometric variables."""
    _check_scale("scale", scale)
    return _draw(rng, "discrete_laplace", scale, size)


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Integer draws with P(x) ∝ exp(-x^2/(2 sigma^2)) (rejection from discrete Laplace, CKS 2020 Alg. 3)."""
    _check_scale("sigma", sigma)
    return _draw(rng, "discrete_gaussian", sigma, size)


def _read_local(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


#: a key read from a file, a secret or an env var: at least 256 bits
_MIN_LOADED_KEY_BYTES = 32
KEY_FORMAT = (f"a noise key is hex text of at least {2 * _MIN_LOADED_KEY_BYTES} hex digits or at least "
              f"{_MIN_LOADED_KEY_BYTES} raw bytes")


def _is_text(raw: bytes) -> bool:
    """Printable UTF-8 text (whitespace allowed): what a password, base64 or a typo looks like, and what
    random key bytes are not (32 random bytes are printable ASCII with probability below 1e-13)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\t\n\r" for c in text)


def _key_bytes(raw: bytes, where: str, raw_allowed: bool) -> bytes:
    """The key a file, secret or env var holds, or a ``ValueError`` saying why it cannot be one (never
    showing it): hex text (whitespace and line breaks ignored, upper or lower case) of at least 64
    digits, or (``raw_allowed``) at least 32 bytes that do not read as text."""
    raw = bytes(raw)
    compact = b"".join(raw.split())
    rule = KEY_FORMAT if raw_allowed else f"it must hold at least {2 * _MIN_LOADED_KEY_BYTES} hex digits"
    if not compact:
        raise ValueError(f"the noise key in {where} is empty: {rule}")
    if all(c in b"0123456789abcdefABCDEF" for c in compact):
        if len(compact) % 2 or len(compact) < 2 * _MIN_LOADED_KEY_BYTES:
            raise ValueError(f"the noise key in {where} has {len(compact)} hex digits: {rule}")
        return bytes.fromhex(compact.decode("ascii"))
    if not raw_allowed:
        raise ValueError(f"the noise key in {where} is not hex text: {rule}")
    if _is_text(raw):
        raise ValueError(f"the noise key in {where} is text but not hex (a password or base64 is not a key): "
                         f"{KEY_FORMAT}")
    if len(raw) < _MIN_LOADED_KEY_BYTES:
        raise ValueError(f"the noise key in {where} has {len(raw)} raw bytes: {KEY_FORMAT}")
    return raw


def load_key(
    env_var: str | None = KEY_ENV_VAR,
    key_file: str | os.PathLike | None = None,
    read: Callable[[str], bytes] | None = None,
) -> bytes | None:
    """Read a secret key from a file (hex text or raw bytes) or from an env var (hex text).

    A key file (or a secret's payload) holds hex text of at least 64 hex digits (whitespace and line
    breaks ignored) or at least 32 raw bytes; a file that reads as printable text must be hex, so a
    password, base64 or a short hex string is refused rather than used as raw bytes (:data:`KEY_FORMAT`).
    ``read(key_file) -> bytes`` fetches the file (default: a local file; the Beam side passes a reader
    for any Beam filesystem or a secret store, so this module stays engine-free). The file wins over
    the env var. Returns ``None`` when neither is set; raises ``ValueError`` for a key that cannot be
    used or a local file that cannot be read. Never shows or logs the key.
    """
    if key_file:
        try:
            raw = read(os.fspath(key_file)) if read is not None else _read_local(key_file)
        except OSError as exc:
            if read is not None:
                raise
            raise ValueError(f"cannot read the noise key file {key_file}: {exc.strerror or type(exc).__name__}") \
                from None
        return _key_bytes(raw, os.fspath(key_file), raw_allowed=True)
    if env_var and os.environ.get(env_var):
        return _key_bytes(os.environ[env_var].encode(), f"the env var {env_var}", raw_allowed=False)
    return None


class NoiseSource:
    """Secret key -> the noise of every cell ``(stream, purpose, index...)``, keyed and reproducible.

    A cell's noise is a pure function of the key and its coordinates, so drawing "again" returns the
    same vector, alone or in a batch of cells (``draw_cells``).
    """

    def __init__(self, key: bytes):
        if not isinstance(key, (bytes, bytearray)) or len(key) < _MIN_KEY_BYTES:
            raise ValueError(f"the noise key must be at least {_MIN_KEY_BYTES} bytes")
        key = bytes(key)
        self._key = key if len(key) <= 64 else hashlib.blake2b(key, digest_size=64).digest()
        self._cells = CellKeys(self._key)

    @classmethod
    def from_config(
        cls, env_var: str | None = KEY_ENV_VAR, key_file: str | None = None, read: Callable[[str], bytes] | None = None
    ) -> "NoiseSource":
        """Load the key (file read by ``read``, else the env var; formats: :func:`load_key`). A key file,
        or an env var other than the default :data:`KEY_ENV_VAR`, is a *named* source: missing or unusable
        it is a ``ValueError``. Only when no source is named and the default env var is unset is a random
        key drawn, and said (its releases are not reproducible)."""
        key = load_key(env_var, key_file, read)
        if key is None and env_var and env_var != KEY_ENV_VAR:
            raise ValueError(f"the noise key env var {env_var} is not set")
        if key is None:
            log.warning(
                "beam_dp: no noise key configured (env var %s or a key file); using a random key. "
                "This run's releases are not reproducible and a retry may not reproduce them.",
                env_var,
            )
            key = os.urandom(32)
        return cls(key)

    def for_domain(self, domain: str, binding: str | None = None) -> "NoiseSource":
        """The noise source of one noise domain (one transform instance of one job) under one calibration.

        Its key is ``BLAKE2b(len(domain) || domain || binding, key=self's key)`` (personalisation
        ``beam_dp-domain-2``), ``binding`` being ``calibration_binding(params)``: sources of different
        domains, or of one domain under different parameters, are independent (pseudo-random under the
        secret key), and a domain's draws are the same on every identical replay. ``binding=None`` is
        the legacy derivation (``BLAKE2b(domain)``, personalisation ``beam_dp-domain-1``), which ignores
        the parameters: only for reading back noise drawn before the binding, never for a new release.
        """
        if not isinstance(domain, str) or not domain:
            raise ValueError(f"a noise domain must be a non-empty string, got {domain!r}")
        try:
            message = domain.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a noise domain must be encodable as UTF-8") from None
        if binding is None:
            person = _LEGACY_DOMAIN_PERSON
        elif isinstance(binding, str) and binding.isascii() and binding:
            message, person = struct.pack("<I", len(message)) + message + binding.encode("ascii"), _DOMAIN_PERSON
        else:
            raise ValueError(f"a noise binding must be a non-empty ASCII string or None, got {binding!r}")
        return NoiseSource(hashlib.blake2b(message, key=self._key, digest_size=32, person=person).digest())

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
        """A fresh numpy generator for one node (sampling, permutations, optimisers; its own object).

        Noise the mechanisms add goes through the keyed samplers below (``draw_cells``), not this.
        """
        key = int.from_bytes(self._node_key(stream, purpose, index), "little")
        return np.random.Generator(np.random.Philox(key=key))

    def draw_cells(self, law: str, streams: Sequence[str], purpose: str, index: Sequence[int] | np.ndarray,
                   scale: float, size: int) -> np.ndarray:
        """The draws ``(n, size)`` of ``n`` cells ``(streams[i], purpose, index[i])`` of one ``law``.

        ``law`` is one of ``laplace``, ``gaussian``, ``k_norm`` (``size`` = its dimension),
        ``discrete_laplace``, ``discrete_gaussian`` (int64); ``index`` is one tuple shared by all cells
        or an ``(n, k)`` integer array. Row ``i`` equals ``getattr(self, law)(streams[i], purpose,
        index[i], scale, size)`` whatever the other cells are. A subclass that overrides the one-cell
        sampler (a test double) is honoured cell by cell.
        """
        if law not in LAWS:
            raise ValueError(f"law must be one of {LAWS}, got {law!r}")
        _check_scale("scale", scale)
        idx = np.asarray(index, dtype=np.int64)
        if idx.ndim == 1:
            idx = np.broadcast_to(idx, (len(streams), idx.size))
        if idx.ndim != 2 or idx.shape[0] != len(streams):
            raise ValueError(f"index must be one tuple or one row per stream, got shape {np.shape(index)}")
        one_cell = getattr(type(self), law)
        if one_cell is not getattr(NoiseSource, law):
            rows = [one_cell(self, s, purpose, tuple(int(i) for i in row), scale, size) for s, row in zip(streams, idx)]
            return np.stack(rows) if rows else np.zeros((0, size))
        return self._sample(law, streams, purpose, idx, scale, size)

    def _sample(self, law: str, streams: Sequence[str], purpose: str, index: np.ndarray, scale: float, size: int) -> np.ndarray:
        keys, heads = self._cells.cells(streams, purpose, np.ascontiguousarray(index))
        return sample_uniforms(law, lambda count, first: self._cells.uniforms(keys, heads, count, first), scale, size)

    def _one(self, law: str, stream: str, purpose: str, index: tuple[int, ...], scale: float, size: int) -> np.ndarray:
        _check_scale("scale", scale)
        return self._sample(law, (stream,), purpose, np.asarray([index], dtype=np.int64).reshape(1, -1), scale, size)[0]

    def laplace(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, size: int) -> np.ndarray:
        return self._one("laplace", stream, purpose, index, scale, size)

    def gaussian(self, stream: str, purpose: str, index: tuple[int, ...], sigma: float, size: int) -> np.ndarray:
        return self._one("gaussian", stream, purpose, index, sigma, size)

    def k_norm(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, dim: int) -> np.ndarray:
        return self._one("k_norm", stream, purpose, index, scale, dim)

    def discrete_laplace(self, stream: str, purpose: str, index: tuple[int, ...], scale: float, size: int) -> np.ndarray:
        return self._one("discrete_laplace", stream, purpose, index, scale, size)

    def discrete_gaussian(self, stream: str, purpose: str, index: tuple[int, ...], sigma: float, size: int) -> np.ndarray:
        return self._one("discrete_gaussian", stream, purpose, index, sigma, size)
