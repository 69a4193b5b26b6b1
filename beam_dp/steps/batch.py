"""The vectorised sibling of :func:`~beam_dp.steps.events.parse_contribution`: a block of events in columns
validated at once and reduced to clipped step sums (engine-neutral: Beam's ``EventBatch`` path and the
Flink job's file blocks use it).

:func:`row_reasons` gives each row the reason :func:`~beam_dp.steps.events.split_event` and
:func:`~beam_dp.steps.events.coerce_value` would give it, checked in the same order (``bad_stream_id``,
``undeclared_stream``, ``bad_timestamp``, ``out_of_range``, ``before_start`` / ``after_end``,
``non_finite``), for rows whose value already is an ``(n, d)`` float array (shape and dtype are the
caller's to check). :func:`step_sums` clips and sums the valid rows per (stream, step) with the
mechanism's own ``clip_and_sum_groups`` (the privacy arithmetic stays in the mechanism);
:func:`key_step_parts` orders those sums by (engine key, step) for one block per key and step.
:func:`event_steps` gives each valid row its stream and step only, for a caller that adds rows to
sums it already holds (the parse stage's dense bundle sums).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.core.limits import MAX_ABS_SECONDS, is_utf8
from beam_dp.steps.events import Reason

__all__ = ["ROW_REASONS", "EventSteps", "StepSums", "event_steps", "key_step_parts", "key_step_runs", "row_reasons", "rows_by_group", "step_sums", "stream_reasons"]


ROW_REASONS = ("", Reason.BAD_STREAM_ID, Reason.UNDECLARED_STREAM, Reason.BAD_TIMESTAMP, Reason.OUT_OF_RANGE,
               Reason.BEFORE_START, Reason.AFTER_END, Reason.NON_FINITE)  # row_reasons' codes: 0 = valid


def row_reasons(streams: "np.ndarray | pa.Array", micros: np.ndarray, values: np.ndarray, clock: Any,
                declared: frozenset[str] | None) -> tuple[np.ndarray, np.ndarray, "pa.Array | None"]:
    """``(codes, good_id, arrow_ids)``: each row's dead-letter reason as a code (``ROW_REASONS[code]``;
    0 for a valid row), whether its stream id is valid, and the ids as one Arrow string array when every
    id is a string.

    ``streams`` (n,) object (or an Arrow string array), ``micros`` (n,) float event times in µs (rounded;
    NaN where unusable), ``values`` (n, d) float, ``clock`` a ``StepClock``, ``declared`` the declared
    streams or None."""
    n = len(streams)
    codes, good_id, arrow_ids = _stream_codes(streams, declared)

    def mark(rows: np.ndarray, reason: str) -> None:  # a row keeps its first reason
        codes[(codes == 0) & rows] = ROW_REASONS.index(reason)

    finite_ts = np.isfinite(micros)
    mark(~finite_ts, Reason.BAD_TIMESTAMP)
    with np.errstate(invalid="ignore"):
        outside = finite_ts & (np.abs(micros) > MAX_ABS_SECONDS * 1e6)
    mark(outside, Reason.OUT_OF_RANGE)
    finite_ts &= ~outside
    where = np.zeros(n, dtype=np.int8)
    where[finite_ts] = clock.classify_micros(micros[finite_ts].astype(np.int64))
    mark(where < 0, Reason.BEFORE_START)
    mark(where > 0, Reason.AFTER_END)
    mark(~np.all(np.isfinite(values), axis=1), Reason.NON_FINITE)
    return codes, good_id, arrow_ids


def stream_reasons(streams: "np.ndarray | pa.Array", declared: frozenset[str] | None
                   ) -> tuple[np.ndarray, np.ndarray, "pa.Array | None"]:
    """``(reasons, good_id, arrow_ids)`` of the stream ids alone (:func:`row_reasons`' first checks):
    ``bad_stream_id``, ``undeclared_stream`` or ``""`` per row (an object array)."""
    codes, good_id, arrow_ids = _stream_codes(streams, declared)
    return np.array(ROW_REASONS, dtype=object)[codes], good_id, arrow_ids


def _stream_codes(streams: "np.ndarray | pa.Array", declared: frozenset[str] | None
                  ) -> tuple[np.ndarray, np.ndarray, "pa.Array | None"]:
    codes = np.zeros(len(streams), dtype=np.int8)
    good_id, arrow_ids = _good_stream_ids(streams)
    codes[~good_id] = ROW_REASONS.index(Reason.BAD_STREAM_ID)
    if declared is not None:
        if arrow_ids is not None:
            known = _numpy(pc.is_in(arrow_ids, value_set=pa.array(sorted(declared), type=pa.string())))
        else:
            known = np.array([s in declared for s in streams], dtype=bool)
        codes[good_id & ~known] = ROW_REASONS.index(Reason.UNDECLARED_STREAM)
    return codes, good_id, arrow_ids


class StepSums(NamedTuple):
    """Clipped sums per (stream, step): block ``i`` is stream ``names[stream[i]]`` at ``step[i]``
    (blocks sorted by (stream, step), ``names`` sorted); ``row_block[j]``: the block of input row ``j``."""

    names: np.ndarray
    stream: np.ndarray
    step: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    clipped: np.ndarray
    row_block: np.ndarray


def step_sums(mechanism: Any, clock: Any, streams: np.ndarray | None, arrow_ids: "pa.Array | None",
              micros: np.ndarray, values: np.ndarray) -> StepSums:
    """The valid rows ``(streams, micros, values)`` (``arrow_ids``: the same ids as Arrow, or None; with
    them ``streams`` is not read) clipped and summed per (stream, step) by ``mechanism.clip_and_sum_groups``
    (at least one row)."""
    steps = clock.step_of_micros(micros.astype(np.int64))
    names, codes = _sorted_codes(streams, arrow_ids)
    width = int(steps.max()) + 1
    unique, row_block = _unique_codes(codes * width + steps, len(names) * width)
    sums, counts, clipped = mechanism.clip_and_sum_groups(values, row_block, len(unique))
    return StepSums(names, unique // width, unique % width, sums, counts, clipped, row_block)


class EventSteps(NamedTuple):
    """Row ``j`` is stream ``names[stream[j]]`` at ``step[j]``; ``names`` the distinct ids, in order of
    first sight (not sorted)."""

    names: list[str]
    stream: np.ndarray
    step: np.ndarray


def event_steps(clock: Any, arrow_ids: "pa.Array", micros: np.ndarray) -> EventSteps:
    """Each valid row's stream (an index into its distinct ids, by one hash pass over the Arrow ids) and
    step."""
    encoded = pc.dictionary_encode(arrow_ids)
    steps = clock.step_of_micros(micros.astype(np.int64))
    return EventSteps(encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False), steps)


def key_step_parts(key_of_block: np.ndarray, steps: np.ndarray) -> list[np.ndarray]:
    """The block indices of each (engine key, step), ordered by (key, step), each part in block order
    (so by stream name): ``key_of_block`` (n,) int key indices, ``steps`` (n,) int steps."""
    order, starts = key_step_runs(key_of_block, steps)
    return np.split(order, starts[1:])


def key_step_runs(key_of_block: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: the block indices ordered by (key, step) (stable: each run in block order) and
    where each (key, step) run starts in ``order`` (``starts[0] == 0``; at least one block)."""
    code = key_of_block.astype(np.int64) * (int(steps.max()) + 1) + steps
    order = np.argsort(code, kind="stable")
    return order, np.flatnonzero(np.r_[True, np.diff(code[order]) != 0])


def rows_by_group(groups: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The row indices of each group ``0 .. n_groups − 1``, ascending (``np.flatnonzero(groups == g)``
    for every ``g``): one stable argsort and a split, O(n log n) instead of O(n · groups)."""
    order = np.argsort(groups, kind="stable")
    return np.split(order, np.cumsum(np.bincount(groups, minlength=n_groups))[:-1])


def _sorted_codes(streams: np.ndarray, ids: "pa.Array | None") -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)``: the distinct stream ids sorted (a str array) and each row's index into them
    (``np.unique(..., return_inverse=True)``), by one hash pass over the Arrow ids when there are
    (sorting only the distinct names), else by sorting every row."""
    if ids is None:
        names, codes = np.unique(streams.astype(str), return_inverse=True)
        return names, codes.astype(np.int64)
    encoded = pc.dictionary_encode(ids)
    distinct = np.asarray(encoded.dictionary.to_pylist(), dtype=str)
    order = np.argsort(distinct, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[encoded.indices.to_numpy(zero_copy_only=False)]


def _unique_codes(codes: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True)`` for integer codes in ``[0, bound)``: by a presence
    table (O(n + bound), no sort) unless ``bound`` is much larger than the number of rows (a table of
    ``bound`` booleans and int64 positions costs about what sorting ``bound / 16`` codes does)."""
    if bound > 16 * len(codes) + (1 << 20):
        unique, inverse = np.unique(codes, return_inverse=True)
        return unique, inverse.astype(np.int64)
    present = np.zeros(bound, dtype=bool)
    present[codes] = True
    unique = np.flatnonzero(present)
    position = np.cumsum(present) - 1
    return unique, position[codes]


def _numpy(array: "pa.Array") -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False))


def _good_stream_ids(streams: "np.ndarray | pa.Array") -> tuple[np.ndarray, "pa.Array | None"]:
    """Which ids are non-empty UTF-8 strings, and the ids as one Arrow string array when every id is a
    string (the usual case: one conversion), else ``None`` (one check per row)."""
    if isinstance(streams, pa.Array):
        ids = streams
    else:
        try:
            ids = pa.array(streams, from_pandas=False)
        except (pa.ArrowException, UnicodeError):
            ids = None
    if ids is not None and pa.types.is_string(ids.type):
        return _numpy(pc.fill_null(pc.greater(pc.utf8_length(ids), 0), False)), ids
    return np.array([isinstance(s, str) and bool(s) and is_utf8(s) for s in streams], dtype=bool), None
