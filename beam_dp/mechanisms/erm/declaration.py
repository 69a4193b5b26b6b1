"""Which noise each unit block of an ERM mechanism lies in, so that a release declares the worst-hit
element's noise (``beam_dp.core.noise_declaration``) and ``python -m beam_dp.verify`` recomputes its
``epsilon_spent``.

A training call's noise is keyed by ``(sensitivity, scale, sample_p)``: the L2 sensitivity
``Δ(n_norm)`` of the call, its K-norm ``b`` or Gaussian ``σ`` and its Bernoulli sampling probability,
all public functions of the parameters and the schedule. ``keys`` (V, 3) holds the distinct keys a
mechanism has used, ``counts`` (blocks, V) how many calls of each key every unit block lies in. A
release declares the counts of a block with the worst loss: each unsampled key as a term
``(law, Δ, scale, count)``; each sampled K-norm key (``p < 1``, pure ε only) as an account
``erm_sampled_k_norm`` whose function, :func:`beam_dp.core.accounting.erm.sampled_k_norm_loss`,
is the one the mechanism charges each call with.
"""

from __future__ import annotations

import numpy as np

from beam_dp.core.noise_declaration import account, declaration_json

__all__ = ["SAMPLED_K_NORM", "count_charge", "declaration_of", "empty_keys", "keys_from_v1", "padded"]

SAMPLED_K_NORM = "erm_sampled_k_norm"


def empty_keys() -> np.ndarray:
    """No noise key yet: a (0, 3) array of (sensitivity, scale, sample_p)."""
    return np.zeros((0, 3))


def padded(counts: np.ndarray, width: int) -> np.ndarray:
    """``counts`` (..., V) with zero columns up to ``width`` keys (a block counted before later keys)."""
    extra = width - counts.shape[-1]
    return counts if extra == 0 else np.pad(counts, [(0, 0)] * (counts.ndim - 1) + [(0, extra)])


def count_charge(keys: np.ndarray, counts: np.ndarray, key: tuple[float, float, float], lo: int, hi: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Count one call of noise ``key`` on blocks ``lo:hi`` of ``counts`` (in place when the key is
    known); returns ``(keys, counts)``, grown by a column for a new key. Keys are compared exactly:
    a mechanism computes a key's floats by the same arithmetic every time."""
    match = np.flatnonzero((keys == np.asarray(key)).all(axis=1))
    if match.size:
        column = int(match[0])
    else:
        keys, counts, column = np.vstack([keys, [key]]), padded(counts, len(keys) + 1), len(keys)
    counts[lo:hi, column] += 1
    return keys, counts


def declaration_of(law: str, keys: np.ndarray, block_counts: np.ndarray) -> str:
    """The ``noise`` declaration of a block lying ``block_counts[v]`` times in noise ``keys[v]``."""
    block_counts = padded(block_counts, len(keys))
    terms, accounts = [], []
    for (sensitivity, scale, p), count in zip(keys.tolist(), block_counts.tolist()):
        if count == 0:
            continue
        if p < 1.0:
            accounts.append(account(SAMPLED_K_NORM, sensitivity=sensitivity, scale=scale, p=p, count=count))
        else:
            terms.append((law, sensitivity, scale, float(count)))
    return declaration_json(tuple(terms), tuple(accounts))


def _restated(spend: np.ndarray) -> np.ndarray:
    """One key per block restating its recorded loss: ``(√μ², 1, 1)`` for a Gaussian block, ``(ε, 1, 1)``
    for a pure one (a term of that key recomputes exactly the block's loss); NaN for an empty block."""
    spend = np.atleast_2d(spend)
    value = np.where(spend[:, 1] > 0, np.sqrt(np.maximum(spend[:, 1], 0.0)), spend[:, 0])
    return np.where(value > 0, value, np.nan)


def keys_from_v1(fields: dict) -> dict:
    """Migration of an ERM state written before noise keys were counted (``STATE_VERSION`` 1): every
    block's recorded loss ``spend`` (and a sliding window's ``departed``) is restated as calls of one key
    per distinct loss, so a restored stream's releases declare exactly the loss its state recorded."""
    spend = np.asarray(fields["spend"], dtype=np.float64).reshape(-1, 2)
    departed = np.asarray(fields["departed"], dtype=np.float64).reshape(1, 2) if "departed" in fields else None
    values = _restated(spend if departed is None else np.vstack([spend, departed]))
    distinct = np.unique(values[~np.isnan(values)])
    keys = np.column_stack([distinct, np.ones_like(distinct), np.ones_like(distinct)]) if distinct.size else empty_keys()
    counts = (values[:, None] == distinct[None, :]).astype(np.int64)
    fields = dict(fields, keys=keys, counts=counts[: len(spend)])
    if departed is not None:
        fields["departed_counts"] = counts[len(spend)]
    return fields
