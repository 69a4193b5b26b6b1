"""Stage 1 of every continual transform: validate, assign steps, clip (stateless, before the shuffle).

Valid contributions leave as ``ClippedSum`` blocks made by the mechanism itself (the privacy
arithmetic stays in the mechanism); invalid ones leave on the ``dead_letter`` output. With
``pre_aggregate`` the output is keyed by ``(stream, step)`` for a lifted combiner; otherwise it
is ``(stream, (step, block, original_element))`` so a late element can still be dead-lettered whole.
"""

from __future__ import annotations

from typing import Any, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from beam_dp.core.limits import MAX_ABS_SECONDS, is_utf8
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, EventBatch, Reason, parse_contribution
from beam_dp.mechanisms.base import ClippedSum

__all__ = ["DEAD_LETTER", "MergeClippedSums", "ParseEvents"]


class MergeClippedSums(beam.CombineFn):
    """Sums ``ClippedSum`` blocks of one (stream, step); lifted before the shuffle by Beam."""

    def create_accumulator(self):
        return None

    def add_input(self, acc, block):
        return block if acc is None else acc.merge(block)

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:
            if acc is not None:
                out = acc if out is None else out.merge(acc)
        return out

    def extract_output(self, acc):
        return acc


class ParseEvents(beam.DoFn):
    def __init__(self, params: Any, pre_aggregate: bool):
        self._params = params
        self._pre_aggregate = pre_aggregate

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._clock = self._params.clock
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        namespace = f"beam_dp/{self._mechanism.name}"
        self._elements = Metrics.counter(namespace, "elements")
        self._clipped = Metrics.counter(namespace, "clipped")
        self._dead = Metrics.counter(namespace, "dead_letters")

    def _dead_letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def _emit(self, stream: str, step: int | None, block: ClippedSum, original: Any):
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
                yield from self.process(batch.row(i))
            return
        reasons = np.full(n, "", dtype=object)
        good_id = np.array([isinstance(s, str) and bool(s) and is_utf8(s) for s in streams], dtype=bool)
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
            yield self._dead_letter(DeadLetter(reasons[i], "rejected row of an EventBatch", stream, batch.row(i)))
        ok = reasons == ""
        if not ok.any():
            return
        streams_ok, values_ok = streams[ok], values[ok]
        steps = self._clock.step_of_micros(micros[ok].astype(np.int64))
        stream_names, stream_idx = np.unique(streams_ok.astype(str), return_inverse=True)
        keys = stream_idx.astype(np.int64) * (int(steps.max()) + 1) + steps
        unique_keys, groups = np.unique(keys, return_inverse=True)
        sums, counts, clipped = self._mechanism.clip_and_sum_groups(values_ok, groups, len(unique_keys))
        self._elements.inc(int(ok.sum()))
        if clipped.sum():
            self._clipped.inc(int(clipped.sum()))
        width = int(steps.max()) + 1
        members = None if self._pre_aggregate else _rows_by_group(groups, len(unique_keys))
        seconds_ok = None if self._pre_aggregate else micros[ok] / 1e6
        for g, key in enumerate(unique_keys):
            stream, step = str(stream_names[key // width]), int(key % width)
            block = ClippedSum(sums[g], int(counts[g]), int(clipped[g]))
            original = None
            if members is not None:
                rows = members[g]
                original = EventBatch(streams_ok[rows], seconds_ok[rows], values_ok[rows])
            yield self._emit(stream, step, block, original)


def _rows_by_group(groups: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The row indices of each group ``0 .. n_groups − 1``, ascending (``np.flatnonzero(groups == g)``
    for every ``g``): one stable argsort and a split, O(n log n) instead of O(n · groups)."""
    order = np.argsort(groups, kind="stable")
    return np.split(order, np.cumsum(np.bincount(groups, minlength=n_groups))[:-1])
