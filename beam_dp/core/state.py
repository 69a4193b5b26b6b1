"""Stable, versioned byte encoding of mechanism state (used by Beam coders and snapshot/restore).

A state is a frozen dataclass whose fields are ints, floats, bools, strings, None, numpy arrays,
and tuples/lists/str-keyed dicts of those. The encoding is
``b"BDPS" | u16 format | u32 header length | JSON header | array buffers``; floats are stored
exactly (``float.hex``), arrays as raw little-endian bytes with dtype and shape in the header.
The header names the state class and its ``STATE_VERSION``; decoding checks both. A class's
module path is read through :data:`FORMER_MODULES`, so a state written before a module moved still
decodes (a move adds its old path there; the state tests decode the shipped fixtures of old outputs).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, TypeVar

import numpy as np

__all__ = ["decode_fields", "decode_state", "encode_state"]

_MAGIC = b"BDPS"
_FORMAT = 1
S = TypeVar("S")


def _pack(value: Any, buffers: list[bytes]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return {"i": str(int(value))}
    if isinstance(value, (float, np.floating)):
        return {"f": float(value).hex()}
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        if dtype.hasobject:
            raise TypeError("object arrays cannot be encoded in mechanism state")
        buffers.append(arr.astype(dtype, copy=False).tobytes())
        # value.shape, not arr.shape: ascontiguousarray turns a 0-d array into shape (1,)
        return {"a": len(buffers) - 1, "dtype": dtype.str, "shape": list(value.shape)}
    if isinstance(value, (tuple, list)):
        return {"t" if isinstance(value, tuple) else "l": [_pack(v, buffers) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("state dicts must have string keys")
        # sorted: equal dicts built in a different insertion order give the same buffer order and bytes
        return {"d": {k: _pack(value[k], buffers) for k in sorted(value)}}
    raise TypeError(f"cannot encode {type(value).__name__} in mechanism state")


def _unpack(node: Any, buffers: list[bytes]) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if "i" in node:
        return int(node["i"])
    if "f" in node:
        return float.fromhex(node["f"])
    if "a" in node:
        arr = np.frombuffer(buffers[node["a"]], dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
        return arr
    if "t" in node:
        return tuple(_unpack(v, buffers) for v in node["t"])
    if "l" in node:
        return [_unpack(v, buffers) for v in node["l"]]
    return {k: _unpack(v, buffers) for k, v in node["d"].items()}


#: Modules of earlier releases and where their contents live now: a state written under the old path
#: decodes, and a noise binding names an object by its old path (so a move keeps the noise).
FORMER_MODULES = {
    "beam_dp.mechanisms.tree": "beam_dp.mechanisms.sums.tree",
    "beam_dp.mechanisms.window_tree": "beam_dp.mechanisms.sums.window_tree",
    "beam_dp.mechanisms.snapping": "beam_dp.mechanisms.sums.snapping",
    "beam_dp.mechanisms.counters.blt": "beam_dp.mechanisms.sums.blt",
    "beam_dp.mechanisms.counters.honaker": "beam_dp.mechanisms.sums.honaker",
    "beam_dp.mechanisms.counters.toeplitz": "beam_dp.mechanisms.sums.toeplitz",
    "beam_dp.mechanisms.pmwg": "beam_dp.mechanisms.growing_db.pmwg",
    "beam_dp.mechanisms.schedulers": "beam_dp.mechanisms.growing_db.schedulers",
    "beam_dp.mechanisms.online": "beam_dp.mechanisms.online.learners",
    "beam_dp.mechanisms.regression": "beam_dp.mechanisms.online.regression",
    "beam_dp.mechanisms.regression_torch": "beam_dp.mechanisms.online.regression_torch",
    "beam_dp.mechanisms.convex_sets": "beam_dp.mechanisms.online.convex_sets",
    "beam_dp.mechanisms.universe": "beam_dp.mechanisms.growing_db.universe",
    "beam_dp.mechanisms.counters.blt_math": "beam_dp.mechanisms.sums.blt_math",
    "beam_dp.mechanisms.counters.factorization": "beam_dp.mechanisms.sums.factorization",
    "beam_dp.mechanisms.counters.factory": "beam_dp.mechanisms.sums.factory",
    "beam_dp.mechanisms.counters.fitted_params": "beam_dp.mechanisms.sums.fitted_params",
    "beam_dp.mechanisms.counters.pure": "beam_dp.mechanisms.sums.pure",
}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _current_name(class_name: str) -> str:
    """``class_name`` with a former module path replaced by the module that holds the class now."""
    module, _, name = class_name.rpartition(".")
    return f"{FORMER_MODULES[module]}.{name}" if module in FORMER_MODULES else class_name


def encode_state(state: Any) -> bytes:
    """Encode a dataclass state to bytes (deterministic: same state -> same bytes)."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError("mechanism state must be a dataclass instance")
    buffers: list[bytes] = []
    fields = {f.name: _pack(getattr(state, f.name), buffers) for f in dataclasses.fields(state)}
    header = {
        "class": _class_name(type(state)),
        "version": int(getattr(type(state), "STATE_VERSION", 1)),
        "fields": fields,
        "sizes": [len(b) for b in buffers],
    }
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return _MAGIC + struct.pack("<HI", _FORMAT, len(head)) + head + b"".join(buffers)


def decode_state(cls: type[S], data: bytes) -> S:
    """Decode bytes written by :func:`encode_state` into an instance of ``cls``; an encoding of an
    earlier version ``v`` is lifted by ``cls.STATE_MIGRATIONS[v]`` (fields -> fields of ``v + 1``) first.

    Raises ``ValueError`` for anything that is not a complete, well-formed encoding of ``cls``.
    """
    class_name, version, fields = decode_fields(data)
    if _current_name(class_name) != _class_name(cls):
        raise ValueError(f"state is a {class_name}, not a {_class_name(cls)}")
    expected = int(getattr(cls, "STATE_VERSION", 1))
    migrations = getattr(cls, "STATE_MIGRATIONS", {})
    while version < expected and version in migrations:  # lift an earlier version: v -> v + 1 -> ...
        fields, version = migrations[version](fields), version + 1
    if version != expected:
        raise ValueError(f"state version {version} cannot be read by version {expected}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"corrupt beam_dp state encoding: {exc}") from exc


def decode_fields(data: bytes) -> tuple[str, int, dict[str, Any]]:
    """The class name, ``STATE_VERSION`` and decoded fields of an encoding, whatever class or version
    wrote it (for migrations). Raises ``ValueError`` for anything that is not a complete, well-formed
    encoding."""
    try:
        return _decode_fields(data)
    except (struct.error, KeyError, IndexError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt beam_dp state encoding: {type(exc).__name__}: {exc}") from exc


def _decode_fields(data: bytes) -> tuple[str, int, dict[str, Any]]:
    if data[:4] != _MAGIC:
        raise ValueError("not a beam_dp state encoding")
    fmt, head_len = struct.unpack_from("<HI", data, 4)
    if fmt != _FORMAT:
        raise ValueError(f"unsupported state format {fmt}")
    offset = 10
    header = json.loads(data[offset : offset + head_len])
    offset += head_len
    buffers = []
    for size in header["sizes"]:
        buffers.append(data[offset : offset + size])
        offset += size
    if offset != len(data):
        raise ValueError(f"state encoding is truncated or has trailing bytes ({len(data)} bytes, expected {offset})")
    fields = {name: _unpack(node, buffers) for name, node in header["fields"].items()}
    return str(header["class"]), int(header["version"]), fields
