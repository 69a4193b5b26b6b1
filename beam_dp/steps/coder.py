"""Explicit, versioned byte encodings of the driver's per-key state and buffered items.

Engines keep in-flight data in their own state stores (Beam bags, Flink list state) as these bytes,
never as pickled classes: a buffered item is a registered *kind* (a stable name, not a class path)
plus its fields (numpy arrays and plain values, encoded by :mod:`beam_dp.core.state`). Moving or
renaming a block class only needs its entry in :data:`KINDS` updated (a stale entry fails loudly, never
matches an alias); in-flight data stays readable.

**Versions.** Every earlier version of :class:`KeyState` and of a buffered entry stays readable: a
version ``v`` encoding is lifted by the migrations ``v -> v + 1 -> ...`` (:data:`MIGRATIONS`), and a
field a later version added takes its default. Bytes this version cannot read (corrupt, another
class, a newer version, an unknown field) raise :class:`UnreadableState`; an engine then ends the key
with one ``unreadable_state`` dead letter (:meth:`~beam_dp.steps.driver.StepDriver.unreadable`),
never an endless retry.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

import numpy as np

from beam_dp.core.state import decode_fields, encode_state

__all__ = ["KINDS", "MIGRATIONS", "UNREADABLE_STATE", "KeyState", "UnreadableState", "decode_entry",
           "decode_key_state", "decode_versioned", "encode_entry", "encode_key_state", "join_entries", "kind_class",
           "split_entries"]

#: the dead-letter reason of a key whose state this version cannot read (the key's stream ends)
UNREADABLE_STATE = "unreadable_state"
T = TypeVar("T")


class UnreadableState(ValueError):
    """State bytes this version cannot read: corrupt, another class, a newer version, an unknown field."""

#: Stable kind name -> ``"module:Class"`` of every block a policy buffers (frozen dataclasses of arrays),
#: the module where the class is defined. Imported on first use, so a job loads only its own family's
#: blocks; a class no longer defined there is refused loudly (:func:`kind_class`), and
#: ``tests/core/accounting/test_previous_outputs.py`` decodes an entry of every kind an earlier release wrote.
KINDS = {
    "clipped_sum": "beam_dp.mechanisms.base:ClippedSum",
    "group_block": "beam_dp.mechanisms.stream_groups:GroupBlock",
    "regression_block": "beam_dp.mechanisms.online.regression:RegressionBlock",
    "online_record": "beam_dp.mechanisms.online.learners:OnlineRecord",
    "labelled_rows": "beam_dp.mechanisms.erm.base:LabelledRows",
    "task_data": "beam_dp.mechanisms.lifelong.config:TaskData",
    "record_rows": "beam_dp.steps.policies:RecordRows",
}
_TUPLE = "tuple"  # plain tuples of numbers, strings and arrays (growing databases' elements and queries)
_classes: dict[str, type] = {}


def kind_class(kind: str) -> type:
    """The class of buffer kind ``kind``: :class:`UnreadableState` for a kind this version does not know,
    ``TypeError`` when the class is not defined at the path :data:`KINDS` names (moved: its entry must
    follow it, an alias left at the old place is not accepted)."""
    if kind not in _classes:
        if kind not in KINDS:
            raise UnreadableState(f"an entry of unknown buffer kind {kind!r}")
        module, name = KINDS[kind].split(":")
        cls = getattr(importlib.import_module(module), name)
        if (cls.__module__, cls.__qualname__) != (module, name):
            raise TypeError(f"buffer kind {kind!r}: {KINDS[kind]} is {cls.__module__}:{cls.__qualname__}; "
                            "update beam_dp.steps.coder.KINDS to where the class is defined")
        _classes[kind] = cls
    return _classes[kind]


def _kind_of(item: Any) -> str:
    """The kind of ``item``, by the path of its class (nothing imported)."""
    path = f"{type(item).__module__}:{type(item).__qualname__}"
    for kind, named in KINDS.items():
        if named == path:
            return kind
    raise TypeError(f"no buffer kind registered for {type(item).__name__} (add it to beam_dp.steps.coder.KINDS)")


@dataclass(frozen=True)
class _Entry:
    """Wire form of one buffered item: its step (0 = carried across steps) and its kind and fields."""

    STATE_VERSION: ClassVar[int] = 1
    step: int
    kind: str
    fields: Any


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def decode_versioned(cls: type[T], data: bytes) -> T:
    """``cls`` from an encoding of this or any earlier ``STATE_VERSION`` (lifted by ``MIGRATIONS[cls]``;
    added fields take their defaults). Raises :class:`UnreadableState` otherwise."""
    try:
        name, version, fields = decode_fields(data)
    except ValueError as exc:
        raise UnreadableState(str(exc)) from exc
    current = int(getattr(cls, "STATE_VERSION", 1))
    if name != _class_name(cls):
        raise UnreadableState(f"state is a {name}, not a {_class_name(cls)}")
    if not 1 <= version <= current:
        raise UnreadableState(f"state version {version} cannot be read by version {current}")
    for step in range(version, current):
        fields = MIGRATIONS.get(cls, {}).get(step, dict)(fields)
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise UnreadableState(f"version {version} state has fields this version does not know: {sorted(unknown)}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:  # a field without a default missing, or a bad value
        raise UnreadableState(f"state fields do not fit {cls.__name__}: {exc}") from exc


def encode_entry(step: int, item: Any) -> bytes:
    if isinstance(item, tuple):
        return encode_state(_Entry(step, _TUPLE, list(item)))
    kind = _kind_of(item)
    return encode_state(_Entry(step, kind, {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}))


def decode_entry(data: bytes) -> tuple[int, Any]:
    entry = decode_versioned(_Entry, data)
    if entry.kind == _TUPLE:
        return entry.step, tuple(entry.fields)
    return entry.step, kind_class(entry.kind)(**entry.fields)


def join_entries(entries: dict[int, bytes]) -> bytes:
    """Encoded entries (step -> :func:`encode_entry` bytes) in one value, by step: each prefixed by its
    step (i64) and length (u32), so one entry is found and replaced without decoding the others."""
    return b"".join(step.to_bytes(8, "little", signed=True) + len(data).to_bytes(4, "little") + data
                    for step, data in sorted(entries.items()))


def split_entries(data: bytes) -> dict[int, bytes]:
    """The inverse of :func:`join_entries` (``UnreadableState`` when the framing is broken)."""
    out, offset = {}, 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise UnreadableState(f"entries truncated at byte {offset} of {len(data)}")
        step = int.from_bytes(data[offset:offset + 8], "little", signed=True)
        size = int.from_bytes(data[offset + 8:offset + 12], "little")
        if offset + 12 + size > len(data):
            raise UnreadableState(f"entries truncated at byte {offset} of {len(data)}")
        out[step] = data[offset + 12:offset + 12 + size]
        offset += 12 + size
    return out


@dataclass
class KeyState:
    """The driver's state of one key (a stream, or later a group of streams).

    ``mechanism``: the mechanism's own versioned state encoding (uint8 array); ``next_step``: the first
    open step; ``buffered``: contributions waiting in an incomplete count step; ``watermark``: the
    latest finite watermark reported for this key (µs, or None); ``ended``: the input has ended (or
    the public end was reached) and nothing more is released; ``offset``: the step before the key's
    first step (a stream first seen late: its mechanism's step ``t`` is the schedule's ``t + offset``);
    ``provisional``: no close timer has fired for the key yet, so its first step is not fixed (an
    engine that cannot read the watermark opens a key at the lowest step of the items it receives
    before its first firing; version 2); ``stream_groups``: the group count the key was opened under
    (0 keyed by stream; None when not recorded, i.e. written by version 1); ``first_rung``: the step
    the first rung of a Beam key's ladder of close timers is armed at (version 3; None: no ladder,
    e.g. Flink, or not recorded): equal to ``next_step`` when no rung has closed a step since that
    rung was last set, which the end rule reads; ``recent``: the stream's last released values, one
    row per step, the first row the empty sum (version 3; only with the idle rule: ``idle_steps``;
    released values, public); ``stream_ended``: the mechanism refused a step at its public end (horizon or budget); the stream
    is over and its mechanism state freed; ``lowest``: the lowest step with buffered items (0 when
    items are carried across steps, None when nothing is buffered), so closing empty steps never
    reads the buffer; ``noise_binding``: the calibration the key's noise is bound to
    (``calibration_binding(params)``, version 4; None: written before the binding), checked on every
    read (:func:`decode_key_state`).
    """

    STATE_VERSION: ClassVar[int] = 4
    key: str
    mechanism: np.ndarray
    next_step: int
    buffered: int = 0
    watermark: int | None = None
    ended: bool = False
    offset: int = 0
    stream_ended: bool = False
    lowest: int | None = None
    provisional: bool = False
    stream_groups: int | None = None
    first_rung: int | None = None
    recent: np.ndarray | None = None
    noise_binding: str | None = None


#: per class, ``{v: fields of version v -> fields of version v + 1}`` (absent: the identity, i.e. the
#: next version only added fields with defaults)
MIGRATIONS: dict[type, dict[int, Callable[[dict], dict]]] = {
    KeyState: {1: dict,  # v2 added ``provisional`` (False) and ``stream_groups`` (None: not recorded)
               2: dict,  # v3 added ``first_rung`` (None: not recorded; the end rule then takes the key as at
                         # rest) and ``recent`` (None: the idle rule starts its window at the next release)
               3: dict},  # v4 added ``noise_binding`` (None: written before the noise was bound to the parameters)
}


def encode_key_state(state: KeyState) -> bytes:
    return encode_state(state)


def decode_key_state(data: bytes, binding: str | None = None) -> KeyState:
    """The key's state; given this job's noise ``binding``, :class:`UnreadableState` if the state was
    written under another one.

    A key's noise cells are re-derived on every read (a tree's open nodes, a counter's buffers), so a
    state continued under another calibration would draw new noise for nodes already released under
    the old one: the two releases could be averaged. A different binding (a changed epsilon, delta,
    budget share, clip bound, noise law, counter, schedule, ...) is therefore refused. A state written
    before the binding (``noise_binding`` None) is read: the driver continues it under the legacy
    derivation it was released with (``StepDriver.legacy_noise``). A key whose stream has ended draws
    nothing more and is read as it is."""
    state = decode_versioned(KeyState, data)
    if binding is not None and state.noise_binding not in (None, binding) and not state.stream_ended:
        raise UnreadableState(f"the state was written under other privacy parameters (noise binding "
                              f"{state.noise_binding}, this job has {binding}): a resumed state keeps its calibration")
    return state
