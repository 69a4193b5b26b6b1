"""Explicit, versioned byte encodings of the driver's per-key state and buffered items.

Engines keep in-flight data in their own state stores (Beam bags, Flink list state) as these bytes,
never as pickled classes: a buffered item is a registered *kind* (a stable name, not a class path)
plus its fields (numpy arrays and plain values, encoded by :mod:`beam_dp.core.state`). Renaming a
block class only needs its entry in :data:`KINDS` updated; in-flight data stays readable.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from beam_dp.core.state import decode_state, encode_state

__all__ = ["KINDS", "KeyState", "decode_entry", "decode_key_state", "encode_entry", "encode_key_state"]

#: Stable kind name -> "module:Class" of every block a policy buffers (frozen dataclasses of arrays).
KINDS = {
    "clipped_sum": "beam_dp.mechanisms.base:ClippedSum",
    "group_block": "beam_dp.mechanisms.stream_groups:GroupBlock",
    "regression_block": "beam_dp.mechanisms.regression:RegressionBlock",
    "online_record": "beam_dp.mechanisms.online:OnlineRecord",
    "labelled_rows": "beam_dp.mechanisms.erm.base:LabelledRows",
    "task_data": "beam_dp.mechanisms.lifelong.config:TaskData",
}
_TUPLE = "tuple"  # plain tuples of numbers, strings and arrays (growing databases' elements and queries)
_classes: dict[str, type] = {}


def _class_of(kind: str) -> type:
    if kind not in _classes:
        module, name = KINDS[kind].split(":")
        _classes[kind] = getattr(importlib.import_module(module), name)
    return _classes[kind]


def _kind_of(item: Any) -> str:
    for kind in KINDS:
        if type(item) is _class_of(kind):
            return kind
    raise TypeError(f"no buffer kind registered for {type(item).__name__} (add it to beam_dp.steps.coder.KINDS)")


@dataclass(frozen=True)
class _Entry:
    """Wire form of one buffered item: its step (0 = carried across steps) and its kind and fields."""

    STATE_VERSION: ClassVar[int] = 1
    step: int
    kind: str
    fields: Any


def encode_entry(step: int, item: Any) -> bytes:
    if isinstance(item, tuple):
        return encode_state(_Entry(step, _TUPLE, list(item)))
    kind = _kind_of(item)
    return encode_state(_Entry(step, kind, {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}))


def decode_entry(data: bytes) -> tuple[int, Any]:
    entry = decode_state(_Entry, data)
    if entry.kind == _TUPLE:
        return entry.step, tuple(entry.fields)
    return entry.step, _class_of(entry.kind)(**entry.fields)


@dataclass
class KeyState:
    """The driver's state of one key (a stream, or later a group of streams).

    ``mechanism``: the mechanism's own versioned state encoding (uint8 array); ``next_step``: the first
    open step; ``buffered``: contributions waiting in an incomplete count step; ``watermark``: the
    latest finite watermark reported for this key (µs, or None); ``ended``: the input has ended (or
    the public end was reached) and nothing more is released; ``offset``: the step before the key's
    first step (a stream first seen late: its mechanism's step ``t`` is the schedule's ``t + offset``);
    ``stream_ended``: the mechanism refused a step at its public end (horizon or budget); the stream
    is over and its mechanism state freed; ``lowest``: the lowest step with buffered items (0 when
    items are carried across steps, None when nothing is buffered), so closing empty steps never
    reads the buffer.
    """

    STATE_VERSION: ClassVar[int] = 1
    key: str
    mechanism: np.ndarray
    next_step: int
    buffered: int = 0
    watermark: int | None = None
    ended: bool = False
    offset: int = 0
    stream_ended: bool = False
    lowest: int | None = None


def encode_key_state(state: KeyState) -> bytes:
    return encode_state(state)


def decode_key_state(data: bytes) -> KeyState:
    return decode_state(KeyState, data)
