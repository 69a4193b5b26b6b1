"""Input events and their validation: what goes in, and what goes to the dead-letter output.

An event is one contribution ``(stream_id, timestamp, value)``. Accepted forms:

* a tuple ``(stream_id, timestamp, value)`` (or ``(stream_id, value)`` for count steps);
* a mapping or ``beam.Row`` with fields ``stream_id``, ``timestamp``, ``value``;
* an :class:`EventBatch`: columnar numpy arrays, the fast path for batch replays (sources that
  emit blocks avoid Beam's per-element cost).

``timestamp`` is event time in seconds since the epoch (int/float), a ``datetime`` or a Beam
``Timestamp``. ``value`` is a number (dim 1) or a sequence/array of ``dim`` finite numbers.
Every rejected event becomes a :class:`DeadLetter` with a machine-readable ``reason``; the
``detail`` text never contains the raw value. :func:`split_event` is the one validation of an
event's head (fields, stream id, timestamp, place in the public schedule) that every family uses,
so every family dead-letters with the same reasons and messages; :func:`numeric_array` the one
check that a value is an array of real numbers.

A dead letter leaves a job as one JSON object (:meth:`DeadLetter.to_json`): ``reason``, ``detail``,
``stream`` (the stream id whenever it is a valid one), ``source`` (``<file>#record=<n>`` where the reader
knows it, :func:`record_source`, else null) and ``element``, the rejected input as JSON values as read
(:func:`json_value`: text, numbers, null, lists, objects; bytes as UTF-8 text) — never a Python repr.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np
import pyarrow as pa

from beam_dp.core.limits import MAX_ABS_SECONDS, is_utf8

__all__ = [
    "DEAD_LETTER", "DETAIL", "REASONS", "DeadLetter", "EventBatch", "OutOfRange", "Reason", "checked_stream",
    "coerce_value", "column_micros", "encodable", "json_value", "named_fields", "numeric_array", "parse_contribution",
    "parse_event", "record_source", "split_event", "timestamp_letter", "to_micros", "value_letter",
]

DEAD_LETTER = "dead_letter"  # the tag of every engine's dead-letter output


class Reason:
    """Dead-letter reasons (stable strings, safe to alert on)."""

    MALFORMED = "malformed"
    BAD_STREAM_ID = "bad_stream_id"
    UNDECLARED_STREAM = "undeclared_stream"
    BAD_TIMESTAMP = "bad_timestamp"
    BEFORE_START = "before_start"
    AFTER_END = "after_end"
    BAD_VALUE = "bad_value"
    BAD_DTYPE = "bad_dtype"
    WRONG_SHAPE = "wrong_shape"
    NON_FINITE = "non_finite"
    LATE = "late"
    OUT_OF_RANGE = "out_of_range"  # a number beyond the representable range (e.g. |timestamp| > 1e12 s)
    # the stream reached its mechanism's public end (horizon or budget): one dead letter when it ends
    # (element None), then one per later element (element kept); its state is freed
    STREAM_ENDED = "stream_ended"
    UNCLOSED = "unclosed"  # buffered for a step the input ended before (see beam_dp.steps.driver)
    LINE_TOO_LONG = "line_too_long"  # a CSV line over beam_dp.io.tables.MAX_LINE_BYTES (never parsed)
    OUTSIDE_UNIVERSE = "outside_universe"  # growing databases: a record outside the declared universe
    UNKNOWN_TASK = "unknown_task"  # lifelong learning: a task id that is not declared
    BAD_LABEL = "bad_label"  # lifelong learning: a label that is not an integer class
    TASK_BACKWARDS = "task_backwards"  # lifelong learning: a row for a task already closed
    UNREADABLE_STATE = "unreadable_state"  # a key's stored state cannot be decoded: its stream ends
    BAD_UNIT_ID = "bad_unit_id"  # privacy units: the unit id is missing, not a string, empty or too long


#: every dead-letter reason any job or engine writes (the values of :class:`Reason`)
REASONS: tuple[str, ...] = tuple(v for k, v in vars(Reason).items() if k.isupper() and isinstance(v, str))


#: the one message of each check of an event's head (every family; per element and per EventBatch row)
DETAIL = {
    Reason.BAD_STREAM_ID: "stream_id must be a non-empty UTF-8 string",
    Reason.UNDECLARED_STREAM: "stream_id is not among the declared streams",
    Reason.BAD_TIMESTAMP: "timestamp must be finite epoch seconds, a datetime, a Beam Timestamp or ISO-8601 text",
    Reason.OUT_OF_RANGE: f"timestamp beyond ±{MAX_ABS_SECONDS:g} s from the epoch",
    Reason.BEFORE_START: "timestamp outside the public schedule",
    Reason.AFTER_END: "timestamp outside the public schedule",
    Reason.NON_FINITE: "non-finite coordinate",
    Reason.BAD_UNIT_ID: "the privacy unit id must be a non-empty UTF-8 string of at most 1024 bytes",
    Reason.LINE_TOO_LONG: "line longer than the reader's bound; the element holds its first bytes",
}


class _DeadLetterFields(NamedTuple):
    reason: str
    detail: str
    stream: str | None
    element: Any
    source: str | None = None


class DeadLetter(_DeadLetterFields):
    """A rejected input: why (``reason``), a value-free explanation, the stream (when its id is valid),
    the original element and where it was read (``source``: ``<file>#record=<n>``, :func:`record_source`).

    Text that Beam's coders cannot encode (lone surrogates) and integers beyond int64 in ``stream`` or
    ``element`` are kept as escaped text (``encodable``), so any rejected input can be written out."""

    __slots__ = ()

    def __new__(cls, reason: str, detail: str, stream: str | None, element: Any, source: str | None = None):
        return super().__new__(cls, reason, detail, encodable(stream), encodable(element), source)

    def to_json(self, stage: str) -> dict:
        """The dead letter as one JSON object (see the module docstring); ``json.dumps`` of it round-trips."""
        return {"stage": stage, "reason": self.reason, "detail": self.detail, "stream": self.stream,
                "source": self.source, "element": json_value(self.element)}


def json_value(value: Any) -> Any:
    """``value`` as JSON values as read: None, bools, ints and finite floats unchanged; text (bytes
    decoded as UTF-8, undecodable bytes backslash-escaped); a non-finite float as its text ("nan",
    "inf", "-inf": JSON has no such number); numpy scalars and arrays, tuples, lists, mappings, Beam
    rows and :class:`EventBatch` es as numbers, lists and objects; a datetime as ISO-8601 text, a Beam
    Timestamp as epoch seconds; anything else as its text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, np.ndarray):
        return [json_value(v) for v in value.tolist()]
    if isinstance(value, EventBatch):
        ids = value.stream_ids
        return {"stream_id": json_value(ids.to_pylist() if isinstance(ids, pa.Array) else ids),
                "timestamp": None if value.timestamps is None else json_value(value.timestamps),
                "value": json_value(value.values)}
    if isinstance(value, Mapping):
        return {str(json_value(k)): json_value(v) for k, v in value.items()}
    if hasattr(value, "as_dict"):  # beam.Row
        return json_value(value.as_dict())
    if hasattr(value, "_asdict"):  # a NamedTuple
        return json_value(value._asdict())
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if hasattr(value, "micros"):  # apache_beam.utils.timestamp.Timestamp
        return int(value.micros) / 1_000_000
    return str(value)


_INT64 = 2**63


def encodable(value: Any) -> Any:
    """``value`` with every non-UTF-8 string (lone surrogates) backslash-escaped and every integer
    beyond int64 turned into its decimal text, inside tuples, lists and dicts; other values unchanged."""
    if isinstance(value, str):
        return value if is_utf8(value) else value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        return str(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(encodable(v) for v in value)
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    return value


def record_source(path: str | None, record: int | None) -> str | None:
    """A dead letter's ``source``: ``<path>#record=<n>`` (record ``n`` of the file: 1-based, the header
    excluded, blank lines not counted, rejected records counted), ``path`` when the record is unknown."""
    if path is None or record is None:
        return path
    return f"{path}#record={record}"


class OutOfRange(ValueError):
    """A timestamp that is a number, but beyond ±``MAX_ABS_SECONDS`` (dead-lettered ``out_of_range``)."""


@dataclass(frozen=True, eq=False)
class EventBatch:
    """A block of events in columns: ``stream_ids`` (n,) str (an object array, or an Arrow string array
    as the file readers give), ``timestamps`` (n,) float seconds or
    None (count steps), ``values`` (n, dim) float; optionally the ``source`` file and the ``records``
    (n,) numbers of the rows in it (dead letters then say where a rejected row was read). Sources that emit these are 5–10× faster than
    per-event elements on Beam."""

    stream_ids: np.ndarray
    timestamps: np.ndarray | None
    values: np.ndarray
    # where the rows were read (optional): the file, and each row's record number in it (1-based)
    source: str | None = None
    records: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.stream_ids)

    def source_of(self, i: int) -> str | None:
        """``<file>#record=<n>`` of row ``i`` when the reader said where it came from, else None."""
        if self.source is None or self.records is None:
            return None
        return record_source(self.source, int(self.records[i]))

    def row(self, i: int) -> tuple:
        ts = None if self.timestamps is None else float(self.timestamps[i])
        stream = self.stream_ids[i]
        return (stream.as_py() if isinstance(stream, pa.Scalar) else str(stream), ts, np.asarray(self.values[i]).tolist())


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _in_range(micros: int) -> int:
    if abs(micros) > MAX_ABS_SECONDS * 1_000_000:
        raise OutOfRange(DETAIL[Reason.OUT_OF_RANGE])
    return micros


def to_micros(ts: Any) -> int:
    """Event time -> integer microseconds since the epoch. Raises ``ValueError`` if unusable
    (``OutOfRange`` for a time beyond ±``MAX_ABS_SECONDS``)."""
    if isinstance(ts, bool) or ts is None:
        raise ValueError("timestamp missing or boolean")
    if hasattr(ts, "micros"):  # apache_beam.utils.timestamp.Timestamp
        return _in_range(int(ts.micros))
    if isinstance(ts, _dt.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=_dt.timezone.utc)
        return _in_range((ts - _EPOCH) // _dt.timedelta(microseconds=1))
    if isinstance(ts, (int, np.integer)):
        return _in_range(int(ts) * 1_000_000)
    if isinstance(ts, (float, np.floating)):
        if not math.isfinite(ts):
            raise ValueError("timestamp not finite")
        return _in_range(round(float(ts) * 1_000_000))
    if isinstance(ts, str):
        try:
            return to_micros(float(ts))
        except OutOfRange:
            raise
        except ValueError:
            return to_micros(_dt.datetime.fromisoformat(ts))
    raise ValueError(f"unsupported timestamp type {type(ts).__name__}")


def column_micros(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`to_micros` of a column of epoch seconds (float64, or int64 integers, scaled exactly) in one
    pass: ``(micros int64, reasons)``, ``reasons`` per row ``""``, ``bad_timestamp`` (not finite, or its
    microseconds are not) or ``out_of_range`` (beyond ±``MAX_ABS_SECONDS``); a refused row's micros are 0."""
    reasons = np.full(len(seconds), "", dtype=object)
    if seconds.dtype.kind in "iu":
        limit = int(MAX_ABS_SECONDS)
        ok = (seconds >= -limit) & (seconds <= limit)
        reasons[~ok] = Reason.OUT_OF_RANGE
        return np.where(ok, seconds, 0).astype(np.int64) * 1_000_000, reasons
    with np.errstate(over="ignore", invalid="ignore"):
        micros = np.rint(np.asarray(seconds, dtype=np.float64) * 1e6)  # round(ts * 1e6): half to even, as round()
    finite = np.isfinite(micros)
    ok = finite & (np.abs(np.where(finite, micros, 0.0)) <= MAX_ABS_SECONDS * 1e6)
    reasons[~finite] = Reason.BAD_TIMESTAMP
    reasons[finite & ~ok] = Reason.OUT_OF_RANGE
    return np.where(ok, micros, 0.0).astype(np.int64), reasons


def named_fields(element: Any, names: tuple[str, ...]) -> tuple:
    """Fields ``names`` of a mapping or a row-like object (missing ones are None); ValueError otherwise."""
    if isinstance(element, Mapping):
        return tuple(element.get(name) for name in names)
    if hasattr(element, names[0]):
        return tuple(getattr(element, name, None) for name in names)
    raise ValueError(f"unsupported element type {type(element).__name__}")


def checked_stream(stream: Any, streams: frozenset[str] | None, element: Any) -> str | DeadLetter:
    """The stream id as a plain ``str``, or the ``DeadLetter`` for a bad or undeclared one."""
    if not isinstance(stream, str) or not stream or not is_utf8(stream):
        return DeadLetter(Reason.BAD_STREAM_ID, DETAIL[Reason.BAD_STREAM_ID], None, element)
    stream = str(stream)  # numpy.str_ would pickle differently and split the key's state
    if streams is not None and stream not in streams:
        return DeadLetter(Reason.UNDECLARED_STREAM, DETAIL[Reason.UNDECLARED_STREAM], stream, element)
    return stream


def split_event(element: Any, payload: tuple[str, ...], clock: Any, streams: frozenset[str] | None,
                timestamp: bool | None = None) -> tuple[str, int | None, int | None, tuple] | DeadLetter:
    """The one validation of an event's head, shared by every family: ``(stream, micros, step,
    payload values)`` or the :class:`DeadLetter` saying why not.

    The element is a tuple ``(stream_id, timestamp, *payload)`` (``(stream_id, *payload)`` for count
    steps, ``clock=None``) or a mapping / row with those fields. Checks, in order: the fields
    (``malformed``), the stream id (``bad_stream_id``, ``undeclared_stream``), the timestamp
    (``bad_timestamp``, ``out_of_range``) and its place in the clock's public schedule
    (``before_start``, ``after_end``). ``micros`` and ``step`` are None for count steps.
    ``timestamp=True`` without a clock checks the timestamp but places it in no schedule (step None)."""
    timestamp = clock is not None if timestamp is None else timestamp
    names = ("stream_id",) + ("timestamp",) * timestamp + payload
    if isinstance(element, tuple) and not hasattr(element, "_fields"):
        if len(element) != len(names):
            return DeadLetter(Reason.MALFORMED, f"expected ({', '.join(names)}), got a {len(element)}-tuple",
                              None, element)
        fields = element
    else:
        try:
            fields = named_fields(element, names)
        except ValueError as exc:
            return DeadLetter(Reason.MALFORMED, str(exc), None, element)
    stream = checked_stream(fields[0], streams, element)
    if isinstance(stream, DeadLetter):
        return stream
    if not timestamp:
        return stream, None, None, tuple(fields[1:])
    try:
        micros = to_micros(fields[1])
    except (ValueError, TypeError, OverflowError) as exc:
        return timestamp_letter(exc, stream, element)
    if clock is None:
        return stream, micros, None, tuple(fields[2:])
    where = int(clock.classify_micros(np.array([micros]))[0])
    if where:
        reason = Reason.BEFORE_START if where < 0 else Reason.AFTER_END
        return DeadLetter(reason, DETAIL[reason], stream, element)
    return stream, micros, int(clock.step_of_micros(micros)), tuple(fields[2:])


def numeric_array(value: Any, what: str = "value") -> np.ndarray:
    """``value`` as a float64 array of real numbers, or ``ValueError("<reason>: <detail>")``
    (``bad_value``: missing, text or not an array; ``bad_dtype``: bool, complex, ...): the one check
    every family applies before a value can reach a mechanism."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"{Reason.BAD_VALUE}: {what} is missing or text")
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged sequences and the like
        raise ValueError(f"{Reason.BAD_VALUE}: {what} is not an array ({type(exc).__name__})") from None
    if arr.dtype == object:
        raise ValueError(f"{Reason.BAD_VALUE}: {what} is not a numeric array")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{Reason.BAD_DTYPE}: {what} has dtype kind {arr.dtype.kind!r}, not real numbers")
    return arr.astype(np.float64)


def coerce_value(value: Any, dim: int, what: str = "value") -> np.ndarray:
    """Value -> float64 vector of shape (dim,), or raise ``ValueError`` whose first word is a reason
    (``what`` names the field in the message)."""
    arr = numeric_array(value, what)
    arr = arr.reshape(-1) if arr.ndim == 0 else arr
    if arr.shape != (dim,):
        raise ValueError(f"{Reason.WRONG_SHAPE}: expected {what} of shape ({dim},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{Reason.NON_FINITE}: {DETAIL[Reason.NON_FINITE]}")
    return arr


def value_letter(exc: Exception, stream: str, element: Any) -> DeadLetter:
    """The dead letter of a value check's ``ValueError("<reason>: <detail>")``."""
    reason, _, detail = str(exc).partition(": ")
    return DeadLetter(reason, detail, stream, element)


def timestamp_letter(exc: Exception, stream: str | None, element: Any) -> DeadLetter:
    """The dead letter of an event time that ``to_micros`` refused with ``exc``."""
    reason = Reason.OUT_OF_RANGE if isinstance(exc, OutOfRange) else Reason.BAD_TIMESTAMP
    return DeadLetter(reason, DETAIL[reason], stream, element)


def parse_event(
    element: Any, dim: int, need_timestamp: bool, streams: frozenset[str] | None
) -> tuple[str, int | None, np.ndarray] | DeadLetter:
    """Validate one event without a schedule; return ``(stream, micros or None, value)`` or a ``DeadLetter``."""
    return _parse(element, dim, None, streams, need_timestamp)


def parse_contribution(element: Any, mechanism: Any, clock: Any, streams: frozenset[str] | None
                       ) -> tuple[str, int | None, Any] | DeadLetter:
    """One event -> ``(stream, step | None, clipped block)`` for ``mechanism`` (``clip_and_sum``) on
    ``clock`` (a ``StepClock``, or None for count steps), or the ``DeadLetter`` saying why not."""
    parsed = _parse(element, mechanism.dim, clock, streams, clock is not None)
    if isinstance(parsed, DeadLetter):
        return parsed
    stream, step, vec = parsed
    return stream, step, mechanism.clip_and_sum(vec)


def _parse(element: Any, dim: int, clock: Any, streams: frozenset[str] | None, timestamp: bool
           ) -> tuple[str, int | None, np.ndarray] | DeadLetter:
    """``(stream, step with a clock else micros, value)`` or the dead letter."""
    head = split_event(element, ("value",), clock, streams, timestamp)
    if isinstance(head, DeadLetter):
        return head
    stream, micros, step, (value,) = head
    try:
        return stream, micros if clock is None else step, coerce_value(value, dim)
    except ValueError as exc:
        return value_letter(exc, stream, element)
