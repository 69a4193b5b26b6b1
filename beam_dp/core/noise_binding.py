"""The calibration fingerprint: every public parameter that sets a transform's noise, bound into its draws.

A transform's noise source is ``NoiseSource(key).for_domain(domain, binding)`` with ``binding`` the
hash of this fingerprint (:func:`calibration_binding`), so its draws depend on the key, the domain *and*
the parameters. Two runs under one key and one domain reproduce each other's noise only when every
fingerprinted parameter is identical (a replay, a retry, a resumed state); any other change (epsilon,
delta, the budget share, clip bound, noise law, counter, horizon, calibration, granularity, schedule,
dims, a learner's or a database's own parameters) draws independent noise. Without this, the noise of
two calibrations would be public multiples of one draw, and ``(Y - r X) / (1 - r)`` would recover the
exact sums from two releases.

The fingerprint is a canonical JSON serialisation of *all* fields of the params dataclass (recursively),
except :data:`EXCLUDED_FIELDS`: a new field is bound by default. Numbers are written by value
(``float.hex``: ``1`` and ``1.0`` are one parameter);
arrays by dtype, shape and a hash of their bytes; a factory (``functools.partial`` or a function) by its
qualified name, its bound arguments, its constants and the values it captures; a params dataclass by its
class name (not its module, so moving the class keeps the releases and the states it wrote). Objects that cannot be
written deterministically (no fields, a default ``repr`` holding an address) raise ``TypeError``: refusing
is safer than a fingerprint that two different calibrations could share.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from beam_dp.core.state import FORMER_MODULES

__all__ = ["BINDING_VERSION", "EXCLUDED_FIELDS", "UNSET_UNBOUND", "calibration_binding", "calibration_fingerprint"]

#: The version of the binding (prefix of every binding): a derivation change bumps it.
BINDING_VERSION = "b1"

#: Fields never bound into the noise, with why (a field absent here is bound):
#: ``noise_key``: where the key is read (its ``domain`` is bound separately by ``for_domain``);
#: ``restore_states``: data (encoded states), checked by the state envelope instead;
#: ``stream_groups``: keys the engine by groups; releases do not depend on it (noise is keyed per stream);
#: ``step_records``: the Flink record framing of the same rows;
#: ``torch_threads``: CPU threads of a lifelong learner's torch ops.
EXCLUDED_FIELDS = frozenset({"noise_key", "restore_states", "stream_groups", "step_records", "torch_threads"})
#: Fields bound only when they differ from the value given: params of a run that leaves them so keep the
#: binding they had before the field existed. ``privacy_unit``: a per-record family's unit (None: record
#: level); ``max_records``: a budget share's records per unit (1: a record's share).
UNSET_UNBOUND = {"privacy_unit": None, "max_records": 1}


def calibration_fingerprint(params: Any) -> str:
    """The canonical JSON text of ``params``' calibration (a dataclass; :data:`EXCLUDED_FIELDS` left out)."""
    if not dataclasses.is_dataclass(params) or isinstance(params, type):
        raise TypeError(f"a calibration fingerprint needs a params dataclass instance, got {type(params).__name__}")
    return json.dumps(_canon(params, 0), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def calibration_binding(params: Any) -> str:
    """The binding of ``params`` (``"b1:"`` + 32 hex digits of BLAKE2b of the fingerprint): what
    ``NoiseSource.for_domain`` keys a domain's noise by, and what saved state records."""
    digest = hashlib.blake2b(calibration_fingerprint(params).encode("ascii"), digest_size=16,
                             person=b"beam_dp-calib-v1").hexdigest()
    return f"{BINDING_VERSION}:{digest}"


_MAX_DEPTH = 32


#: the path an object had when its binding was first defined: a moved module keeps its objects' noise
_BOUND_MODULES = {now: before for before, now in FORMER_MODULES.items()}


def _name(obj: Any) -> str:
    module = str(getattr(obj, "__module__", None))
    return f"{_BOUND_MODULES.get(module, module)}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _float(x: float) -> Any:
    return {"f": x.hex() if math.isfinite(x) else repr(x)}


def _unset(obj: Any, name: str) -> bool:
    """Whether field ``name`` of ``obj`` holds its :data:`UNSET_UNBOUND` value (then it is not bound)."""
    return name in UNSET_UNBOUND and getattr(obj, name) == UNSET_UNBOUND[name]


def _canon(obj: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError("a calibration fingerprint is nested too deeply (a cycle?)")
    d = depth + 1
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return {"enum": _name(type(obj)), "value": _canon(obj.value, d)}
    if isinstance(obj, (int, np.integer)):  # by value: 1 and 1.0 are one parameter
        return _float(float(obj)) if abs(int(obj)) < 2**53 else {"i": str(int(obj))}
    if isinstance(obj, (float, np.floating)):
        return _float(float(obj))
    if isinstance(obj, (bytes, bytearray)):
        return {"bytes": hashlib.blake2b(bytes(obj), digest_size=16).hexdigest()}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:  # its bytes are addresses: write its items
            return {"objects": list(obj.shape), "items": _canon(obj.ravel().tolist(), d)}
        data = np.ascontiguousarray(obj)
        return {"array": str(data.dtype), "shape": list(data.shape),
                "hash": hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest()}
    if isinstance(obj, (tuple, list)):
        return [_canon(x, d) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted(json.dumps(_canon(x, d), sort_keys=True) for x in obj)}
    if isinstance(obj, Mapping):
        items = sorted((json.dumps(_canon(k, d), sort_keys=True), _canon(v, d)) for k, v in obj.items())
        return {"map": [list(item) for item in items]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"type": type(obj).__qualname__,  # not its module: moving a params class keeps its noise
                "fields": {f.name: _canon(getattr(obj, f.name), d) for f in dataclasses.fields(obj)
                           if f.name not in EXCLUDED_FIELDS
                           and not _unset(obj, f.name)}}
    if isinstance(obj, functools.partial):
        return {"partial": _canon(obj.func, d), "args": _canon(obj.args, d), "keywords": _canon(obj.keywords, d)}
    if isinstance(obj, types.MethodType):
        return {"method": _canon(obj.__func__, d), "self": _canon(obj.__self__, d)}
    if isinstance(obj, types.FunctionType):
        return _function(obj, d)
    if isinstance(obj, (type, types.BuiltinFunctionType)):
        return {"name": _name(obj)}
    state = getattr(obj, "__dict__", None)
    slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ()) if hasattr(obj, s)]
    if state is not None or slots:
        fields = dict(state or {})
        fields.update({s: getattr(obj, s) for s in slots})
        return {"object": _name(type(obj)),
                "vars": {k: _canon(v, d) for k, v in sorted(fields.items()) if k not in EXCLUDED_FIELDS}}
    text = repr(obj)
    if " at 0x" in text:
        raise TypeError(f"cannot fingerprint a {type(obj).__name__} deterministically; give its parameters as fields")
    return {"repr": _name(type(obj)), "text": text}


def _function(fn: types.FunctionType, depth: int) -> Any:
    """A function by its qualified name, defaults, captured values and constants (so two lambdas that
    differ only in a literal, or in a value they capture, differ)."""
    cells = [c.cell_contents for c in fn.__closure__ or () if _cell_full(c)]
    return {"function": _name(fn), "defaults": _canon(fn.__defaults__, depth),
            "kwdefaults": _canon(fn.__kwdefaults__, depth), "closure": _canon(cells, depth),
            "code": _code(fn.__code__, depth)}


def _code(code: types.CodeType, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError("a calibration fingerprint is nested too deeply")
    consts = [_code(c, depth + 1) if isinstance(c, types.CodeType) else _canon(c, depth + 1) for c in code.co_consts]
    return {"names": list(code.co_names), "consts": consts}


def _cell_full(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:  # a cell not yet assigned
        return False


_EMPTY = object()
