"""Stage 1 of every continual transform: validate, assign steps, clip (stateless, before the shuffle).

Valid contributions leave as ``ClippedSum`` blocks made by the mechanism itself (the privacy
arithmetic stays in the mechanism); invalid ones leave on the ``dead_letter`` output. With
``pre_aggregate`` the output is keyed by ``(stream, step)`` for a lifted combiner; otherwise it
is ``(stream, (step, block, original_element))`` so a late element can still be dead-lettered whole.
With ``params.stream_groups`` the key is the stream's group (``beam_dp.mechanisms.stream_groups``)
and the block a ``GroupBlock`` of every stream of that group and step in the input element.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.beam.shell.combine import BundleGroupSums, MergeClippedSums  # MergeClippedSums: the lifted combiner
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of
from beam_dp.steps.batch import (
    ROW_REASONS,
    StepSums,
    event_steps,
    key_step_parts,
    row_reasons,
    rows_by_group,
    step_sums,
)
from beam_dp.steps.events import DEAD_LETTER, DETAIL, DeadLetter, EventBatch, Reason, parse_contribution

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
        self._bundle: BundleGroupSums | None = None
        namespace = f"beam_dp/{self._mechanism.name}"
        self._elements = Metrics.counter(namespace, "elements")
        self._clipped = Metrics.counter(namespace, "clipped")
        self._dead = Metrics.counter(namespace, "dead_letters")

    def start_bundle(self) -> None:
        # a batch replay keyed by stream groups sums the bundle's blocks here (beam_dp.beam.shell.combine)
        self._bundle = BundleGroupSums(self._mechanism.dim) if self._pre_aggregate and self._groups else None

    def finish_bundle(self) -> Iterator:
        if self._bundle:
            yield from self._bundle_blocks()

    def _bundle_blocks(self) -> Iterator[WindowedValue]:
        """The bundle's sums so far as blocks (at its end, or when they pass their memory budget)."""
        for window, key, step, block in self._bundle.take():
            yield WindowedValue(((key, step), block), window.max_timestamp(), (window,))

    def _dead_letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def _key_of(self, stream: str) -> str:
        key = self._group_keys.get(stream)
        if key is None:
            key = self._group_keys[stream] = group_key(group_of(stream, self._groups))
        return key

    def _emit(self, stream: str, step: int | None, block: ClippedSum, original: Any, window: Any):
        if self._groups is not None:
            block = GroupBlock((stream,), block.vector[None, :], np.array([block.count]), np.array([block.clipped]))
            stream = self._key_of(stream)
            if self._bundle is not None:
                self._bundle.add_block(window, stream, step, block)
                return None
        if self._pre_aggregate:
            return (stream, step), block
        return stream, (step, block, original)

    def process(self, element: Any, window=beam.DoFn.WindowParam) -> Iterator:
        if isinstance(element, EventBatch):
            yield from self._process_batch(element, window)
            return
        parsed = parse_contribution(element, self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            yield self._dead_letter(parsed)
            return
        stream, step, block = parsed
        self._elements.inc()
        if block.clipped:
            self._clipped.inc(block.clipped)
        out = self._emit(stream, step, block, element, window)
        if out is not None:
            yield out
        elif self._bundle.full:
            yield from self._bundle_blocks()

    def _process_batch(self, batch: EventBatch, window: Any) -> Iterator:
        """Vectorised path: validate all rows at once, dead-letter the bad ones, one block per (stream, step)."""
        n = len(batch)
        dim = self._mechanism.dim
        try:
            ids = batch.stream_ids  # a reader's Arrow strings stay Arrow (objects only where needed)
            streams = ids if isinstance(ids, pa.Array) else np.asarray(ids, dtype=object).reshape(n)
            values = np.asarray(batch.values, dtype=np.float64).reshape(n, dim)
            micros = None
            if self._clock is not None:
                micros = np.round(np.asarray(batch.timestamps, dtype=np.float64) * 1e6).reshape(n)
        except (ValueError, TypeError) as exc:
            yield self._dead_letter(DeadLetter(Reason.MALFORMED, f"bad EventBatch: {type(exc).__name__}", None, batch))
            return
        if self._clock is None:  # count steps keep arrival order per element
            for i in range(n):
                for out in self.process(batch.row(i), window):
                    source = batch.source_of(i)
                    if source is not None and isinstance(out, beam.pvalue.TaggedOutput):
                        out = beam.pvalue.TaggedOutput(DEAD_LETTER, out.value._replace(source=source))
                    yield out
            return
        codes, good_id, arrow_ids = row_reasons(streams, micros, values, self._clock, self._streams)
        bad = np.flatnonzero(codes)
        ok = codes == 0
        sums = dense = None
        if len(bad) < n:
            every = not len(bad)  # every row valid (the usual case): no copies
            values_ok, micros_ok = (values, micros) if every else (values[ok], micros[ok])
            ids_ok = None if arrow_ids is None else arrow_ids if every else arrow_ids.filter(ok)
            if self._bundle is not None and ids_ok is not None:
                dense = self._dense_rows(window, ids_ok, micros_ok, values_ok)
            if dense is None:  # the ids as objects only where blocks or originals name them
                streams_ok = None if self._bundle is not None and ids_ok is not None else (
                    streams[ok] if ids_ok is None else _objects(ids_ok))
                sums = step_sums(self._mechanism, self._clock, streams_ok, ids_ok, micros_ok, values_ok)
        for i in bad.tolist():  # loop over rejected rows only
            reason, row = ROW_REASONS[codes[i]], batch.row(i)
            yield self._dead_letter(DeadLetter(reason, DETAIL[reason], row[0] if good_id[i] else None, row,
                                               batch.source_of(i)))
        if dense is not None:  # added after the pass: the array outlives it
            rows, steps, cells = dense
            self._elements.inc(len(rows))
            clipped = int(cells[:, -1].sum())
            if clipped:
                self._clipped.inc(clipped)
            self._bundle.add_rows(window, rows, steps, cells)
            if self._bundle.full:
                yield from self._bundle_blocks()
            return
        if sums is None:
            return
        self._elements.inc(int(ok.sum()))
        if sums.clipped.sum():
            self._clipped.inc(int(sums.clipped.sum()))
        seconds_ok = None if self._pre_aggregate else micros_ok / 1e6
        if self._bundle is not None:
            names, key_names, key_of_stream = self._streams_and_keys(sums)
            self._bundle.add(window, key_names.tolist(), names, key_of_stream, sums.stream, sums.step, sums.sums,
                             sums.counts, sums.clipped)
            if self._bundle.full:
                yield from self._bundle_blocks()
            return
        if self._groups is not None:
            yield from self._emit_groups(sums, streams_ok, seconds_ok, values_ok)
            return
        names = sums.names[sums.stream]
        members = None if self._pre_aggregate else rows_by_group(sums.row_block, len(sums.step))
        for g in range(len(sums.step)):
            block = ClippedSum(sums.sums[g], int(sums.counts[g]), int(sums.clipped[g]))
            original = None
            if members is not None:
                rows = members[g]
                original = EventBatch(streams_ok[rows], seconds_ok[rows], values_ok[rows])
            yield self._emit(str(names[g]), int(sums.step[g]), block, original, window)

    def _dense_rows(self, window: Any, ids: pa.Array, micros: np.ndarray,
                    values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(rows, steps, cells)`` of valid rows for the bundle's dense array (each row clipped by the
        mechanism: its sum, count 1 and whether it was clipped), or None when the array cannot hold them."""
        events = event_steps(self._clock, ids, micros)
        rows = self._bundle.rows_of(events.names, self._key_of)
        if not self._bundle.dense_fits(window, int(events.step.min()), int(events.step.max())):
            return None
        clipped, was_clipped = self._mechanism.clip_rows(values)
        dim = self._mechanism.dim
        cells = np.empty((len(values), dim + 2))
        cells[:, :dim] = clipped
        cells[:, dim] = 1.0
        cells[:, dim + 1] = was_clipped
        return rows[events.stream], events.step, cells

    def _streams_and_keys(self, sums: StepSums) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``(names, key_names, key_of_stream)``: the streams of ``sums`` as one interned str each (blocks
        share them; row lookups compare identities and reuse cached hashes), their group keys sorted, and
        each stream's index into them."""
        names = list(map(sys.intern, sums.names.tolist()))
        stream_keys = list(map(self._group_keys.get, names))  # known streams: one C-level pass
        if None in stream_keys:
            stream_keys = [self._key_of(name) for name in names]
        key_names, key_of_stream = np.unique(np.array(stream_keys, dtype=str), return_inverse=True)
        return names, key_names, key_of_stream

    def _emit_groups(self, sums: StepSums, streams_ok, seconds_ok, values_ok) -> Iterator:
        """One ``GroupBlock`` per (group, step) from the per-(stream, step) ``sums``."""
        names, key_names, key_of_stream = self._streams_and_keys(sums)
        key_idx = key_of_stream[sums.stream]
        parts = key_step_parts(key_idx, sums.step)
        members = None
        if seconds_ok is not None:  # the input rows of each part, kept so a late part is dead-lettered whole
            order = np.concatenate(parts)
            part_of_block = np.repeat(np.arange(len(parts)), [len(p) for p in parts])[np.argsort(order)]
            members = rows_by_group(part_of_block[sums.row_block], len(parts))
        for i, part in enumerate(parts):
            key, step = str(key_names[key_idx[part[0]]]), int(sums.step[part[0]])
            block = GroupBlock(tuple(map(names.__getitem__, sums.stream[part].tolist())), sums.sums[part],
                               sums.counts[part].astype(np.int64), sums.clipped[part].astype(np.int64))
            original = None
            if members is not None:
                rows = members[i]
                original = EventBatch(streams_ok[rows], seconds_ok[rows], values_ok[rows])
            yield (key, step) if self._pre_aggregate else key, (block if self._pre_aggregate else (step, block, original))


def _objects(streams: "np.ndarray | pa.Array") -> np.ndarray:
    """Stream ids as an object array of ``str``."""
    if isinstance(streams, pa.Array):
        return np.asarray(streams.to_numpy(zero_copy_only=False), dtype=object)
    return streams
