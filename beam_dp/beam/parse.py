"""Stage 1 of every continual transform: validate, assign steps, clip (stateless, before the shuffle).

Valid contributions leave as ``ClippedSum`` blocks made by the mechanism itself (the privacy
arithmetic stays in the mechanism); invalid ones leave on the ``dead_letter`` output. With
``pre_aggregate`` the output is keyed by ``(stream, step)`` for a lifted combiner; otherwise it
is ``(stream, (step, block, original_element))`` so a late element can still be dead-lettered whole.
With ``params.stream_groups`` the key is the stream's group (``beam_dp.mechanisms.stream_groups``)
and the block a ``GroupBlock`` of every stream of that group and step in the input element.
"""

from __future__ import annotations

from typing import Any, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from beam_dp.beam.combine import MergeClippedSums  # the lifted combiner of this stage's output
from beam_dp.core.limits import MAX_ABS_SECONDS, is_utf8
from beam_dp.steps.events import DEAD_LETTER, DETAIL, DeadLetter, EventBatch, Reason, parse_contribution
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of

__all__ = ["DEAD_LETTER", "MergeClippedSums", "ParseEvents"]


class ParseEvents(beam.DoFn):
    def __init__(self, params: Any, pre_aggregate: bool):
        self._params = params
        self._pre_aggregate = pre_aggregate

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._clock = self._params.clock
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._groups = getattr(self._params, "stream_groups", None)
        self._group_keys: dict[str, str] = {}  # stream -> its group's key (hashing once per stream and worker)
        namespace = f"beam_dp/{self._mechanism.name}"
        self._elements = Metrics.counter(namespace, "elements")
        self._clipped = Metrics.counter(namespace, "clipped")
        self._dead = Metrics.counter(namespace, "dead_letters")

    def _dead_letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def _key_of(self, stream: str) -> str:
        key = self._group_keys.get(stream)
        if key is None:
            key = self._group_keys[stream] = group_key(group_of(stream, self._groups))
        return key

    def _emit(self, stream: str, step: int | None, block: ClippedSum, original: Any):
        if self._groups is not None:
            block = GroupBlock((stream,), block.vector[None, :], np.array([block.count]), np.array([block.clipped]))
            stream = self._key_of(stream)
        if self._pre_aggregate:
            return (stream, step), block
        return stream, (step, block, original)

    def process(self, element: Any) -> Iterator:
        if isinstance(element, EventBatch):
            yield from self._process_batch(element)
            return
        parsed = parse_contribution(element, self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            yield self._dead_letter(parsed)
            return
        stream, step, block = parsed
        self._elements.inc()
        if block.clipped:
            self._clipped.inc(block.clipped)
        yield self._emit(stream, step, block, element)

    def _process_batch(self, batch: EventBatch) -> Iterator:
        """Vectorised path: validate all rows at once, dead-letter the bad ones, one block per (stream, step)."""
        n = len(batch)
        dim = self._mechanism.dim
        try:
            streams = np.asarray(batch.stream_ids, dtype=object).reshape(n)
            values = np.asarray(batch.values, dtype=np.float64).reshape(n, dim)
            micros = None
            if self._clock is not None:
                micros = np.round(np.asarray(batch.timestamps, dtype=np.float64) * 1e6).reshape(n)
        except (ValueError, TypeError) as exc:
            yield self._dead_letter(DeadLetter(Reason.MALFORMED, f"bad EventBatch: {type(exc).__name__}", None, batch))
            return
        if self._clock is None:  # count steps keep arrival order per element
            for i in range(n):
                for out in self.process(batch.row(i)):
                    source = batch.source_of(i)
                    if source is not None and isinstance(out, beam.pvalue.TaggedOutput):
                        out = beam.pvalue.TaggedOutput(DEAD_LETTER, out.value._replace(source=source))
                    yield out
            return
        reasons = np.full(n, "", dtype=object)
        good_id, arrow_ids = _good_stream_ids(streams)
        reasons[~good_id] = Reason.BAD_STREAM_ID
        if self._streams is not None:
            declared = np.array([s in self._streams for s in streams], dtype=bool)
            reasons[good_id & ~declared] = Reason.UNDECLARED_STREAM
        finite_ts = np.isfinite(micros)
        reasons[(reasons == "") & ~finite_ts] = Reason.BAD_TIMESTAMP
        with np.errstate(invalid="ignore"):
            outside = finite_ts & (np.abs(micros) > MAX_ABS_SECONDS * 1e6)
        reasons[(reasons == "") & outside] = Reason.OUT_OF_RANGE
        finite_ts &= ~outside
        where = np.zeros(n, dtype=np.int8)
        where[finite_ts] = self._clock.classify_micros(micros[finite_ts].astype(np.int64))
        reasons[(reasons == "") & (where < 0)] = Reason.BEFORE_START
        reasons[(reasons == "") & (where > 0)] = Reason.AFTER_END
        reasons[(reasons == "") & ~np.all(np.isfinite(values), axis=1)] = Reason.NON_FINITE
        bad = np.flatnonzero(reasons != "")
        for i in bad:  # loop over rejected rows only
            stream = streams[i] if good_id[i] else None
            yield self._dead_letter(DeadLetter(reasons[i], DETAIL[reasons[i]], stream, batch.row(i),
                                               batch.source_of(i)))
        ok = reasons == ""
        if not ok.any():
            return
        streams_ok, values_ok = streams[ok], values[ok]
        steps = self._clock.step_of_micros(micros[ok].astype(np.int64))
        stream_names, stream_idx = _sorted_codes(streams_ok, None if arrow_ids is None else arrow_ids.filter(ok))
        width = int(steps.max()) + 1
        unique_keys, groups = _unique_codes(stream_idx * width + steps, len(stream_names) * width)
        sums, counts, clipped = self._mechanism.clip_and_sum_groups(values_ok, groups, len(unique_keys))
        self._elements.inc(int(ok.sum()))
        if clipped.sum():
            self._clipped.inc(int(clipped.sum()))
        seconds_ok = None if self._pre_aggregate else micros[ok] / 1e6
        block_stream, block_steps = unique_keys // width, unique_keys % width
        if self._groups is not None:
            yield from self._emit_groups(stream_names, block_stream, block_steps, sums, counts, clipped, groups,
                                         streams_ok, seconds_ok, values_ok)
            return
        names = stream_names[block_stream]
        members = None if self._pre_aggregate else _rows_by_group(groups, len(unique_keys))
        for g in range(len(unique_keys)):
            block = ClippedSum(sums[g], int(counts[g]), int(clipped[g]))
            original = None
            if members is not None:
                rows = members[g]
                original = EventBatch(streams_ok[rows], seconds_ok[rows], values_ok[rows])
            yield self._emit(str(names[g]), int(block_steps[g]), block, original)

    def _emit_groups(self, stream_names, block_stream, steps, sums, counts, clipped, row_block, streams_ok,
                     seconds_ok, values_ok) -> Iterator:
        """One ``GroupBlock`` per (group, step) from the per-(stream, step) sums: block ``i`` is stream
        ``stream_names[block_stream[i]]`` (names sorted, blocks sorted by (stream, step)) at ``steps[i]``."""
        stream_keys = [self._key_of(name) for name in stream_names.tolist()]
        key_names, key_of_stream = np.unique(np.array(stream_keys, dtype=str), return_inverse=True)
        key_idx = key_of_stream[block_stream]
        width = int(steps.max()) + 1
        part_code = key_idx * width + steps
        order = np.argsort(part_code, kind="stable")  # by (group, step), then stream name (the blocks' order)
        cuts = np.flatnonzero(np.diff(part_code[order])) + 1
        parts = np.split(order, cuts)
        members = None
        if seconds_ok is not None:  # the input rows of each part, kept so a late part is dead-lettered whole
            part_of_block = np.repeat(np.arange(len(parts)), [len(p) for p in parts])[np.argsort(order)]
            members = _rows_by_group(part_of_block[row_block], len(parts))
        for i, part in enumerate(parts):
            key, step = str(key_names[key_idx[part[0]]]), int(steps[part[0]])
            block = GroupBlock(tuple(stream_names[block_stream[part]].tolist()), sums[part],
                               counts[part].astype(np.int64), clipped[part].astype(np.int64))
            original = None
            if members is not None:
                rows = members[i]
                original = EventBatch(streams_ok[rows], seconds_ok[rows], values_ok[rows])
            yield (key, step) if self._pre_aggregate else key, (block if self._pre_aggregate else (step, block, original))


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
    table when ``bound`` is at most a few times the number of rows (O(n + bound), no sort)."""
    if bound > 4 * len(codes) + 4096:
        unique, inverse = np.unique(codes, return_inverse=True)
        return unique, inverse.astype(np.int64)
    present = np.zeros(bound, dtype=bool)
    present[codes] = True
    unique = np.flatnonzero(present)
    position = np.cumsum(present) - 1
    return unique, position[codes]


def _good_stream_ids(streams: np.ndarray) -> tuple[np.ndarray, "pa.Array | None"]:
    """Which ids are non-empty UTF-8 strings, and the ids as one Arrow string array when every id is a
    string (the usual case: one conversion), else ``None`` (one check per row)."""
    try:
        ids = pa.array(streams, from_pandas=False)
    except (pa.ArrowException, UnicodeError):
        ids = None
    if ids is not None and pa.types.is_string(ids.type):
        good = np.asarray(pc.fill_null(pc.greater(pc.utf8_length(ids), 0), False).to_numpy(zero_copy_only=False))
        return good, ids
    return np.array([isinstance(s, str) and bool(s) and is_utf8(s) for s in streams], dtype=bool), None


def _rows_by_group(groups: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The row indices of each group ``0 .. n_groups − 1``, ascending (``np.flatnonzero(groups == g)``
    for every ``g``): one stable argsort and a split, O(n log n) instead of O(n · groups)."""
    order = np.argsort(groups, kind="stable")
    return np.split(order, np.cumsum(np.bincount(groups, minlength=n_groups))[:-1])
