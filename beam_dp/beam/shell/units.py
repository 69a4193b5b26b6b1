"""The privacy-unit stages of a continual sum on a batch replay (user-level DP; ``docs/privacy_units.md``).

::

    events ─ UnitEvents (hash the unit id, validate, step, clip) ─┬─ dead_letter (no clear id)
                                                                  └─ GroupByKey ─ BoundUnits ─ ((stream, step), sum)

:class:`UnitEvents` reads each event's unit id (the params' ``privacy_unit.column``: a mapping key, a row
attribute or the 4th item of a tuple ``(stream_id, timestamp, value, unit_id)``), hashes it under the
job's secret key (read in ``setup()``, as the noise-drawing stages read it) and keeps only the hash: the
clear id never reaches a shuffle or a dead letter (a rejected event's id is replaced by its keyed hash,
or by ``None`` when it is the id that is bad: ``bad_unit_id``). A :class:`UnitEventBatch` (rows in
columns, as :class:`ReadUnitEventFiles` reads them with ``batches=True``) is validated, hashed (once per
distinct id) and clipped in vectorised passes; a row those passes reject is looked at alone, as the same
event would be, so its dead letter is the event's. Keyed by unit hash (the default: one element per
event), or with ``buckets=B`` by one of ``B`` buckets of units (``hash mod B``): a bundle's rows then
leave as one :class:`UnitRows` block per bucket, so every row of a unit still meets the others in one
``BoundUnits`` call, in a few elements instead of one per event. :class:`BoundUnits` runs the units'
ledger over their steps in order (:func:`beam_dp.core.units.bound_sorted`, the units of a bundle
together) and emits the kept (stream, step) sums, each unit's of norm at most ``R``, into the release
path (summed per bundle, as the lifted combiner would); what it drops is counted per reason
(Beam counters ``beam_dp/units``: ``dropped_<reason>``), never released nor written. Which contributions
are kept depends on each unit's rows and the key only, so the keying changes no release.
:class:`ReadUnitEventFiles` reads CSV/Parquet event files with a unit column as such events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generator, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.core.limits import check_count
from beam_dp.core.units import (
    DROP_REASONS,
    MAX_UNIT_ID_BYTES,
    UnitKeys,
    UnitLedger,
    bound_sorted,
    unit_id_problems,
)
from beam_dp.io.coders import register_block_coders
from beam_dp.io.sources import StructuralInputError, value_columns
from beam_dp.io.tables import BATCH_ROWS, iter_parquet_batches, read_csv_rows
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of
from beam_dp.steps.batch import row_reasons
from beam_dp.steps.events import (
    DEAD_LETTER,
    DETAIL,
    DeadLetter,
    EventBatch,
    Reason,
    parse_contribution,
    record_source,
)

__all__ = ["UNIT_BUCKETS", "BoundUnits", "ReadUnitEventFiles", "UnitEventBatch", "UnitEvents", "UnitRows", "unit_key"]

_NAMESPACE = "beam_dp/units"
#: buckets of units a batch replay keys the units' rows by (``UnitEvents(params, buckets=UNIT_BUCKETS)``):
#: the parallelism of the bounding stage, and the blocks a bundle's rows leave in (each carries the names
#: of the streams its rows touch)
UNIT_BUCKETS = 64
#: rows per batch :class:`ReadUnitEventFiles` reads (a unit id is hashed once per batch it appears in)
UNIT_BATCH_ROWS = 1 << 20

def unit_key(noise_key: Any) -> bytes:
    """The job's secret key bytes, read on the worker from where ``noise_key`` says (a Secret Manager
    version, a key file on any Beam filesystem, or the env var). ``ValueError`` when none is set: a key
    drawn at random on each worker would hash one unit apart, so it is never drawn for units."""
    from beam_dp.core.noise import load_key
    from beam_dp.io.keys import read_key_file, read_secret

    if noise_key.secret:
        key = load_key(None, noise_key.secret, read_secret)
    else:
        key = load_key(noise_key.env_var, noise_key.key_file, read_key_file)
    if key is None:
        raise ValueError("privacy units need the job's secret key (a key file, a secret or the key env var): "
                         "units are hashed with it on every worker")
    return key


def _split_unit(element: Any, column: str) -> tuple[Any, Any, Any]:
    """``(unit id, the event without it for parsing, a copy for dead letters with the id slot to fill)``."""
    if isinstance(element, tuple) and not hasattr(element, "_fields"):
        if len(element) != 4:
            return None, element, element
        return element[3], element[:3], element[:3] + (None,)
    if isinstance(element, Mapping):
        rest = {k: v for k, v in element.items() if k != column}
        return element.get(column), rest, dict(rest, **{column: None})
    if hasattr(element, "stream_id"):
        fields = ("stream_id", "timestamp", "value")
        rest = {name: getattr(element, name, None) for name in fields}
        return getattr(element, column, None), rest, dict(rest, **{column: None})
    return None, element, element


def _redacted(letter: DeadLetter, redacted: Any, column: str, replacement: Any) -> DeadLetter:
    """``letter`` whose element is the event with its unit slot set to ``replacement`` (never the clear id)."""
    if isinstance(redacted, tuple) and len(redacted) == 4:
        element: Any = redacted[:3] + (replacement,)
    elif isinstance(redacted, dict):
        element = dict(redacted, **{column: replacement})
    else:
        element = redacted
    return DeadLetter(letter.reason, letter.detail, letter.stream, element, letter.source)


@dataclass(frozen=True, eq=False)
class UnitEventBatch:
    """Events with their privacy unit ids in columns (what :class:`ReadUnitEventFiles` reads): row ``i``
    stands for exactly the mapping the per-row path would read, :meth:`event` ``(i)``: ``{"stream_id",
    "timestamp", column, "value"}``.

    ``units``, ``stream_ids`` (n,): the ids as read (an Arrow string array, or objects: ``None`` where a
    cell is missing or not UTF-8); ``stamps`` (n,): the time cells as read; ``micros`` (n,) float: the event
    times in µs, rounded (NaN where a cell is not a number); ``values`` (n, d) float; ``scalar``: a
    ``value`` column (each event's value a number, not a list); ``odd``: row → its event, for the rows
    whose time or value cells are not plain numbers (their array cells are placeholders); ``source`` and
    ``records``: the file and each row's record number in it. Holds clear unit ids: only
    :class:`UnitEvents` reads it, and drops them."""

    column: str
    units: Any
    stream_ids: Any
    stamps: np.ndarray
    micros: np.ndarray
    values: np.ndarray
    scalar: bool
    odd: Mapping[int, dict] = field(default_factory=dict)
    source: str | None = None
    records: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.stream_ids)

    def event(self, i: int) -> dict:
        """Row ``i`` as the per-row event mapping."""
        if i in self.odd:
            return dict(self.odd[i])
        stamp = self.stamps[i]
        return {"stream_id": _cell(self.stream_ids, i), "timestamp": stamp.item() if isinstance(stamp, np.generic)
                else stamp, self.column: _cell(self.units, i),
                "value": float(self.values[i, 0]) if self.scalar else self.values[i].tolist()}

    def source_of(self, i: int) -> str | None:
        """``<file>#record=<n>`` of row ``i``, None if unknown."""
        return None if self.source is None or self.records is None else record_source(self.source, int(self.records[i]))

    def counted(self) -> "UnitEventBatch":
        """The batch of a count: every event's value 1.0 (as ``ContinualCount`` reads an event)."""
        odd = {i: {**event, "value": 1.0} for i, event in self.odd.items()}
        return replace(self, values=np.ones((len(self), 1)), scalar=True, odd=odd)


def _cell(ids: Any, i: int) -> Any:
    return ids[i].as_py() if isinstance(ids, pa.Array) else ids[i]


@dataclass(frozen=True, eq=False)
class UnitRows:
    """Hashed, stepped and clipped contributions of privacy units, in columns: row ``i`` is unit
    ``hashes[i]`` (uint64) contributing ``values[i]`` ((n, d) float, clipped to the mechanism's bound) to
    stream ``streams[codes[i]]`` at step ``steps[i]``; ``streams`` (object) sorted and distinct. No clear id."""

    hashes: np.ndarray
    steps: np.ndarray
    streams: np.ndarray
    codes: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.hashes)

    @classmethod
    def of(cls, hashes: np.ndarray, steps: np.ndarray, streams: Any, values: np.ndarray) -> "UnitRows":
        """Rows from per-row stream ids."""
        names, codes = _sorted_codes(list(streams))
        return cls(np.asarray(hashes, np.uint64), np.asarray(steps, np.int64), names, codes,
                   np.asarray(values, np.float64).reshape(len(hashes), -1))

    @classmethod
    def of_events(cls, events: Sequence[tuple[int, str, Any, np.ndarray]], dim: int) -> "UnitRows":
        """Rows from ``(unit hash, stream, step, clipped value)`` tuples (the per-row path's)."""
        n = len(events)
        hashes = np.fromiter((h for h, _, _, _ in events), np.uint64, n)
        steps = np.fromiter((t for _, _, t, _ in events), np.int64, n)
        values = np.array([v for _, _, _, v in events], np.float64).reshape(n, dim)
        return cls.of(hashes, steps, [s for _, s, _, _ in events], values)

    @staticmethod
    def concat(parts: Sequence["UnitRows"]) -> "UnitRows":
        """The rows of every part, in order, over one sorted stream table."""
        if len(parts) == 1:
            return parts[0]
        tables = [p.streams.tolist() for p in parts]
        names = sorted(set().union(*tables))
        index = {name: i for i, name in enumerate(names)}
        codes = np.concatenate([np.fromiter(map(index.__getitem__, table), np.int64, len(table))[p.codes]
                                for p, table in zip(parts, tables)])
        return UnitRows(np.concatenate([p.hashes for p in parts]), np.concatenate([p.steps for p in parts]),
                        np.array(names, dtype=object), codes, np.concatenate([p.values for p in parts]))

    def take(self, rows: np.ndarray | slice) -> "UnitRows":
        """The rows ``rows`` (indices, in their order, or a slice) over the streams they name."""
        codes = self.codes[rows]
        used = np.bincount(codes, minlength=len(self.streams)) > 0
        return UnitRows(self.hashes[rows], self.steps[rows], self.streams[used], (np.cumsum(used) - 1)[codes],
                        self.values[rows])

    def by_bucket(self, buckets: int) -> Iterator[tuple[int, "UnitRows"]]:
        """``(bucket, its rows)`` per bucket ``hash mod buckets`` that has rows (one stable sort by bucket,
        a radix sort below 2^15 buckets; each bucket a slice of the sorted rows)."""
        if not len(self):
            return
        bucket = (self.hashes % np.uint64(buckets)).astype(np.int16 if buckets < 2**15 else np.int64)
        order = np.argsort(bucket, kind="stable")
        rows = UnitRows(self.hashes[order], self.steps[order], self.streams, self.codes[order], self.values[order])
        sizes = np.bincount(bucket, minlength=buckets)
        ends = np.cumsum(sizes)
        for b in np.flatnonzero(sizes).tolist():
            yield b, rows.take(slice(int(ends[b] - sizes[b]), int(ends[b])))

    def events(self) -> Iterator[tuple[int, tuple[str, int, np.ndarray]]]:
        """Each row as the per-event element ``(unit hash as int64, (stream, step, value))``."""
        signed = self.hashes.view(np.int64).tolist()
        for i, (unit, stream, step) in enumerate(zip(signed, self.streams[self.codes].tolist(), self.steps.tolist())):
            yield unit, (stream, step, self.values[i])


register_block_coders(UnitRows)  # array blocks: Beam's size sampling must not pickle them
#: one event's hashed contribution: (unit hash, stream, step, clipped value)
_Contribution = tuple[int, str, Any, np.ndarray]


def _sorted_codes(ids: list) -> tuple[np.ndarray, np.ndarray]:
    """``(names, codes)``: the distinct ``ids`` sorted (an object array) and each one's index into them."""
    names = sorted(set(ids))
    index = {name: i for i, name in enumerate(names)}
    return np.array(names, dtype=object), np.fromiter(map(index.__getitem__, ids), np.int64, len(ids))


def _unit_ids_ok(units: Any) -> np.ndarray:
    """Per row: whether the unit id is a non-empty UTF-8 string of at most ``MAX_UNIT_ID_BYTES`` bytes
    (one Arrow pass over an Arrow string array)."""
    if isinstance(units, pa.Array):
        size = pc.binary_length(units)
        ok = pc.and_(pc.greater(size, 0), pc.less_equal(size, MAX_UNIT_ID_BYTES))
        return np.asarray(pc.fill_null(ok, False).to_numpy(zero_copy_only=False), bool)
    ok = np.ones(len(units), bool)
    ok[[row for row, _ in unit_id_problems(units)]] = False
    return ok


class UnitEvents(beam.DoFn):
    """Events (or :class:`UnitEventBatch` es) → the units' hashed contributions, keyed by unit hash:
    ``(unit hash as int64, (stream, step, clipped value))`` per event; or, with ``buckets``, by bucket:
    ``(hash mod buckets, UnitRows)`` per bucket and bundle. Bad events to ``dead_letter`` (no clear id).

    Args:
        params: the sum's unit-level params.
        buckets: ``None`` (default): one element per event, keyed by its unit's hash; else the number of
            buckets (>= 1) the units' rows are keyed by, a bundle's rows leaving as one block per bucket.
    """

    #: rows a bundle holds (``buckets`` set) before they leave
    FLUSH_ROWS = 1 << 20

    def __init__(self, params: Any, buckets: int | None = None):
        self._params = params
        self._buckets = None if buckets is None else check_count("buckets", buckets)

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._clock = self._params.clock
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._column = self._params.privacy_unit.column
        self._keys = UnitKeys(unit_key(self._params.noise_key))
        self._dead = Metrics.counter(_NAMESPACE, "dead_letters")
        self._elements = Metrics.counter(_NAMESPACE, "elements")  # accepted events (what a job counts as read)

    def start_bundle(self) -> None:
        self._pending: dict[Any, list] = {}  # window -> [UnitRows or (hash, stream, step, value)]
        self._rows = 0

    def finish_bundle(self) -> Iterator:
        yield from self._flush()

    def _letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def process(self, element: Any, window=beam.DoFn.WindowParam) -> Iterator:
        rows: UnitRows | list[_Contribution]
        if isinstance(element, UnitEventBatch):
            rows = yield from self._batch(element)
        elif isinstance(element, EventBatch):
            letter = DeadLetter(Reason.BAD_UNIT_ID, "an EventBatch carries no privacy unit ids: give events with "
                                "the unit field", None, None, element.source)
            yield self._letter(letter)
            return
        else:
            parsed = self._one(element)
            if isinstance(parsed, DeadLetter):
                yield self._letter(parsed)
                return
            rows = [parsed]
        self._elements.inc(len(rows))
        if self._buckets is None:
            yield from (rows.events() if isinstance(rows, UnitRows) else (
                (int(np.uint64(h).view(np.int64)), (s, t, v)) for h, s, t, v in rows))
            return
        held = self._pending.setdefault(window, [])
        if isinstance(rows, UnitRows):
            held.append(rows)
        else:
            held.extend(rows)
        self._rows += len(rows)
        if self._rows >= self.FLUSH_ROWS:
            yield from self._flush()

    def _flush(self) -> Iterator[WindowedValue]:
        pending, self._pending, self._rows = self._pending, {}, 0
        for window, held in pending.items():
            singles = [row for row in held if not isinstance(row, UnitRows)]
            parts = [row for row in held if isinstance(row, UnitRows)]
            if singles:
                parts.append(UnitRows.of_events(singles, self._mechanism.dim))
            if parts:
                for bucket, rows in UnitRows.concat(parts).by_bucket(self._buckets or 1):
                    yield WindowedValue((bucket, rows), window.max_timestamp(), (window,))

    def _one(self, element: Any) -> DeadLetter | _Contribution:
        """One event → ``(unit hash, stream, step, clipped value)`` or its dead letter (no clear id)."""
        unit, rest, redacted = _split_unit(element, self._column)
        problems = unit_id_problems([unit])
        if problems:
            detail = f"{DETAIL[Reason.BAD_UNIT_ID]}: {problems[0][1].replace('unit_id', self._column)}"
            return _redacted(DeadLetter(Reason.BAD_UNIT_ID, detail, None, None), redacted, self._column, None)
        hashed = int(self._keys.hash([unit])[0])
        parsed = parse_contribution(rest, self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            return _redacted(parsed, redacted, self._column, f"{hashed:016x}")
        stream, step, block = parsed
        return hashed, stream, step, block.vector

    def _batch(self, batch: UnitEventBatch) -> Generator[Any, None, UnitRows]:
        """Yields the dead letters of ``batch``, returns its valid rows as :class:`UnitRows`: every check in
        vectorised passes; a row they reject (or whose cells are odd) is then parsed alone (:meth:`_one`)."""
        n, dim = len(batch), self._mechanism.dim
        values = batch.values if batch.values.shape[1] == dim else np.full((n, dim), np.nan)  # a wrong dim: alone
        codes, _, arrow_ids = row_reasons(batch.stream_ids, batch.micros, values, self._clock, self._streams)
        clean = (codes == 0) & _unit_ids_ok(batch.units)
        if batch.odd:
            clean[np.fromiter(batch.odd, np.int64, len(batch.odd))] = False
        alone = []
        for i in np.flatnonzero(~clean).tolist():
            parsed = self._one(batch.event(i))
            if isinstance(parsed, DeadLetter):
                yield self._letter(parsed._replace(source=batch.source_of(i)))
            else:
                alone.append(parsed)
        every = bool(clean.all())
        units = batch.units if every else _take(batch.units, clean)
        if isinstance(units, pa.Array):  # each distinct id hashed once
            encoded = pc.dictionary_encode(units)
            hashes = self._keys.hash(encoded.dictionary.to_pylist())[encoded.indices.to_numpy(zero_copy_only=False)]
        else:
            hashes = self._keys.hash(units)
        micros = batch.micros if every else batch.micros[clean]
        clipped, _ = self._mechanism.clip_rows(values if every else values[clean])
        steps = self._clock.step_of_micros(micros.astype(np.int64))
        if arrow_ids is not None:
            encoded = pc.dictionary_encode(arrow_ids if every else arrow_ids.filter(pa.array(clean)))
            names, of = _sorted_codes(encoded.dictionary.to_pylist())
            rows = UnitRows(hashes, steps, names, of[encoded.indices.to_numpy(zero_copy_only=False)], clipped)
        else:
            rows = UnitRows.of(hashes, steps, _take(batch.stream_ids, clean), clipped)
        return UnitRows.concat([rows, UnitRows.of_events(alone, dim)]) if alone else rows


def _take(ids: Any, rows: np.ndarray) -> Any:
    return ids.filter(pa.array(rows)) if isinstance(ids, pa.Array) else np.asarray(ids, dtype=object)[rows]


def _step_unit_stream_order(rows: UnitRows) -> np.ndarray:
    """The order of ``rows`` by (step, unit hash, stream): a stable sort by step (a radix sort when the
    steps span under 2^15), then per step a sort of its hashes and a stable one of (unit rank, stream),
    nearly in order by then (small sorts: the step's rows stay in cache)."""
    low, span = int(rows.steps.min()), int(rows.steps.max()) - int(rows.steps.min())
    by_step = np.argsort((rows.steps - low).astype(np.int16 if span < 2**15 else np.int64), kind="stable")
    steps = rows.steps[by_step]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    shift = max(1, (len(rows.streams) - 1).bit_length())
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(steps)]):
        at = by_step[start:end]
        by_unit = at[np.argsort(rows.hashes[at])]
        units = rows.hashes[by_unit]
        rank = np.cumsum(np.r_[False, units[1:] != units[:-1]])
        at[:] = by_unit[np.argsort((rank << shift) | rows.codes[by_unit], kind="stable")]
    return by_step


class BoundUnits(beam.DoFn):
    """Units' contributions (each unit with all its steps: keyed by unit hash, or by a bucket of units
    as :class:`UnitRows`) → the kept ``((stream, step), ClippedSum)``, summed over the units of a bundle
    (with ``params.stream_groups``: one ``((group key, step), GroupBlock)`` per group and step).
    The units of a bundle are bounded together, one :func:`~beam_dp.core.units.bound_sorted` per step over
    all of them (one ledger): what each unit keeps depends on its own events and the key only, so this is
    the bounding of each unit alone, in fewer calls. Drops counted per reason."""

    #: bytes of rows held (hash, step, stream and value: 24 + 8·d a row) before the bundle's units are
    #: bounded and their sums emitted (fewer, larger flushes bound each step in fewer calls)
    FLUSH_BYTES = 64 << 20

    def __init__(self, params: Any):
        self._params = params

    def setup(self) -> None:
        self._keys = UnitKeys(unit_key(self._params.noise_key))
        self._bounds = self._params.unit_bounds()
        self._clip = float(self._params.clip_bound)
        self._dim = int(self._params.dim)
        self._drops = {reason: Metrics.counter(_NAMESPACE, f"dropped_{reason}") for reason in DROP_REASONS}
        self._kept = Metrics.counter(_NAMESPACE, "kept")
        self._groups = getattr(self._params, "stream_groups", None)
        self._group_keys: dict[str, str] = {}  # stream -> its group's key (hashed once per stream and worker)

    def start_bundle(self) -> None:
        self._pending: dict[Any, list[UnitRows]] = {}  # window -> the units' rows
        self._rows = 0

    def process(self, keyed: tuple[int, Any], window=beam.DoFn.WindowParam) -> Iterator:
        key, values = keyed
        parts, events = [], []
        for value in values:
            if isinstance(value, UnitRows):
                parts.append(value)
            else:
                stream, step, vector = value
                events.append((key, stream, step, vector))
        if events:  # keyed by unit hash: the unit's events
            parts.append(UnitRows.of_events([(int(np.int64(h).view(np.uint64)), s, t, v) for h, s, t, v in events],
                                            self._dim))
        self._pending.setdefault(window, []).extend(parts)
        self._rows += sum(map(len, parts))
        if self._rows * (24 + 8 * self._dim) >= self.FLUSH_BYTES:
            yield from self._flush()

    def finish_bundle(self) -> Iterator:
        yield from self._flush()

    def _flush(self) -> Iterator[WindowedValue]:
        pending, self._pending, self._rows = self._pending, {}, 0
        for window, parts in pending.items():
            for key, block in self._bounded(UnitRows.concat(parts)):
                yield WindowedValue((key, block), window.max_timestamp(), (window,))

    def _bounded(self, rows: UnitRows) -> Iterator[tuple[tuple[str, int], ClippedSum | GroupBlock]]:
        """The rows sorted once by (step, unit hash, stream), each step's run bounded in place
        (:func:`~beam_dp.core.units.bound_sorted`); stream hashes and group keys taken once per flush."""
        n = len(rows)
        if not n:
            return
        order = _step_unit_stream_order(rows)
        hashes, codes, steps = rows.hashes[order], rows.codes[order], rows.steps[order]
        values = rows.values.reshape(n, self._dim)[order]
        names = rows.streams  # sorted: the codes follow the stream ids' order, as bound_sorted needs
        stream_hashes = self._keys.stream_hashes(names.tolist())
        groups = None
        if self._groups is not None:
            group_names, groups = np.unique(np.array(self._group_keys_of(names.tolist(), self._groups), dtype=object),
                                            return_inverse=True)
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
        ledger = UnitLedger.empty(self._bounds)
        for start, end in zip(starts.tolist(), [*starts[1:].tolist(), n]):
            step = int(steps[start])
            block = bound_sorted(ledger, step, hashes[start:end], codes[start:end], values[start:end], stream_hashes,
                                 self._bounds, self._keys, clip_bound=self._clip)
            ledger = block.ledger
            for reason, count in block.drops.items():
                if count:
                    self._drops[reason].inc(count)
            self._kept.inc(len(block.codes))
            if not len(block.codes):
                continue
            present, of = np.unique(block.codes, return_inverse=True)  # the streams kept, in name order
            kept = np.bincount(of, minlength=len(present))
            sums = np.stack([np.bincount(of, block.sums[:, j], len(present)) for j in range(self._dim)], axis=1)
            clipped = np.bincount(of, block.clipped, len(present)).astype(np.int64)
            if groups is None:
                for i, stream in enumerate(names[present].tolist()):
                    yield (stream, step), ClippedSum(sums[i], int(kept[i]), int(clipped[i]))
                continue
            of_group = groups[present]
            by_group = np.argsort(of_group, kind="stable")  # the streams stay in name order within a group's block
            bounds = np.flatnonzero(np.r_[True, of_group[by_group][1:] != of_group[by_group][:-1]])
            for lo, hi in zip(bounds.tolist(), [*bounds[1:].tolist(), len(by_group)]):
                mine = by_group[lo:hi]
                yield ((group_names[of_group[mine[0]]], step),
                       GroupBlock(tuple(names[present[mine]].tolist()), sums[mine], kept[mine], clipped[mine]))

    def _group_keys_of(self, streams: list[str], groups: int) -> list[str]:
        """Each stream's key among ``groups`` groups (hashed once per stream and worker)."""
        keys = list(map(self._group_keys.get, streams))  # known streams: one C-level pass
        if None in keys:
            for stream in streams:
                if stream not in self._group_keys:
                    self._group_keys[stream] = group_key(group_of(stream, groups))
            return list(map(self._group_keys.__getitem__, streams))
        return keys  # type: ignore[return-value]  # no None left


def _text(raw: Any) -> Any:
    """A CSV cell read as bytes, as text (``None`` where it is not UTF-8: a bad id, dead-lettered)."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw


def _number(cell: Any) -> Any:
    """A text cell that reads as a number as that number, any other cell as read (the event parser
    dead-letters what it cannot use)."""
    if not isinstance(cell, str):
        return cell
    try:
        return float(cell)
    except ValueError:
        return cell


def _numbers(column: pa.Array) -> list:
    """A column's cells; in a text column (a reader infers one when a cell is not a number) each cell that
    reads as a number as that number, the others as read."""
    cells = column.to_pylist()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return cells
    return list(map(_number, cells))


def _ids(column: pa.Array) -> Any:
    """An id column as an Arrow string array when every cell is text (bytes read as UTF-8), else objects as
    the per-row path reads them (``None`` for a missing or non-UTF-8 cell, other cells as read)."""
    if pa.types.is_large_string(column.type) or pa.types.is_string(column.type):
        return pc.cast(column, pa.string())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        try:
            return pc.cast(column, pa.string())
        except pa.ArrowInvalid:
            pass
    return np.array(list(map(_text, column.to_pylist())) + [None], dtype=object)[:-1]


def _plain(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(cells, plain)``: a number column's cells as read (integers stay integers) and which are numbers
    (not missing); any other column's cells as floats where they read as numbers (NaN elsewhere)."""
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        plain = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
        cells = column.fill_null(0).to_numpy(zero_copy_only=False) if column.null_count else column.to_numpy(
            zero_copy_only=False)
        return cells, plain
    read = _numbers(column)
    plain = np.fromiter((type(cell) is float for cell in read), bool, len(read))
    return np.array([cell if type(cell) is float else np.nan for cell in read], np.float64), plain


def _unit_event_batch(batch: pa.RecordBatch, path: str, records: np.ndarray, column: str) -> UnitEventBatch:
    """One record batch of an event file with unit column ``column`` as a :class:`UnitEventBatch`."""
    names = batch.schema.names
    missing = [c for c in ("stream_id", "timestamp", column) if c not in names]
    if missing:
        raise StructuralInputError(path, f"event files with privacy units need columns stream_id, timestamp, "
                                         f"{column}, value...; {missing} missing from {names}")
    try:
        value_names = value_columns(names)
    except ValueError as exc:
        raise StructuralInputError(path, str(exc)) from None
    n = batch.num_rows
    times = batch.column("timestamp")
    if pa.types.is_timestamp(times.type):  # datetimes: the per-row path reads them as such
        stamps = np.array(times.to_pylist() + [None], dtype=object)[:-1]
        plain = np.asarray(times.is_valid().to_numpy(zero_copy_only=False), bool)
        micros = pc.cast(pc.cast(times, pa.timestamp("us")), pa.int64()).fill_null(0).to_numpy(
            zero_copy_only=False).astype(np.float64)
    else:
        stamps, plain = _plain(times)
        with np.errstate(invalid="ignore", over="ignore"):
            micros = np.round(np.asarray(stamps, np.float64) * 1e6)
    values = np.empty((n, len(value_names)))
    for j, name in enumerate(value_names):
        values[:, j], ok = _plain(batch.column(name))
        plain &= ok
    scalar = value_names == ["value"]
    odd = {}
    for i in np.flatnonzero(~plain).tolist():  # rows whose cells the arrays cannot hold: read as the per-row path
        cells = [_number(batch.column(c)[i].as_py()) for c in ["timestamp", *value_names]]
        odd[i] = {"stream_id": _text(batch.column("stream_id")[i].as_py()), "timestamp": cells[0],
                  column: _text(batch.column(column)[i].as_py()), "value": cells[1] if scalar else cells[1:]}
    return UnitEventBatch(column, _ids(batch.column(column)), _ids(batch.column("stream_id")), stamps, micros, values,
                          scalar, odd, path, records)


class _UnitEventFile(beam.DoFn):
    def __init__(self, column: str, batch_rows: int | None):
        self._column = column
        self._batch_rows = batch_rows

    def process(self, path: str) -> Iterator:
        size = self._batch_rows or BATCH_ROWS
        if path.endswith(".parquet"):
            offset = 0
            with FileSystems.open(path) as fh:
                for batch in iter_parquet_batches(fh, size):
                    yield from self._rows(batch, path, np.arange(offset + 1, offset + 1 + batch.num_rows))
                    offset += batch.num_rows
            return
        with FileSystems.open(path) as fh:
            try:  # ids as bytes: a non-UTF-8 id is one dead letter, not a failed file
                read = read_csv_rows(fh, column_types={"stream_id": pa.binary(), self._column: pa.binary()},
                                     batch_size=size)
            except ValueError as exc:
                raise StructuralInputError(path, str(exc)) from None
        for letter in read.letters(path):  # a line the reader cannot split: its text (the clear id in it) dropped
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, letter._replace(element=None))
        offset = 0
        for batch in read.batches:
            records = (np.arange(offset + 1, offset + 1 + batch.num_rows) if read.records is None
                       else read.records[offset:offset + batch.num_rows])
            yield from self._rows(batch, path, records)
            offset += batch.num_rows

    def _rows(self, batch: pa.RecordBatch, path: str, records: np.ndarray) -> Iterator:
        rows = _unit_event_batch(batch, path, records, self._column)
        if self._batch_rows is not None:
            yield rows
            return
        yield from map(rows.event, range(len(rows)))


class ReadUnitEventFiles(beam.PTransform):
    """CSV/Parquet event files matching ``pattern`` with the unit column ``column`` → ``(events,
    dead_letter)``, validated by :class:`UnitEvents`; a line the CSV reader cannot split is dead-lettered as
    ``beam_dp.io.sources`` does, without its text (which may hold a clear unit id).

    Args:
        pattern: the files (any Beam filesystem).
        column: the column of the privacy unit ids.
        batches: ``False`` (default): one mapping per row (``stream_id``, ``timestamp``, ``value``,
            ``column``); ``True``: one :class:`UnitEventBatch` per :data:`UNIT_BATCH_ROWS` rows (the fast path,
            the same events).
    """

    def __init__(self, pattern: str, column: str, batches: bool = False):
        super().__init__()
        self.pattern = pattern
        self.column = column
        self.batches = batches

    def expand(self, pbegin):
        paths = (pbegin | "Pattern" >> beam.Create([self.pattern])
                 | "Match" >> beam.FlatMap(lambda p: sorted(m.path for m in FileSystems.match([p])[0].metadata_list))
                 | "Spread" >> beam.Reshuffle())
        read = _UnitEventFile(self.column, UNIT_BATCH_ROWS if self.batches else None)
        out = paths | "Read" >> beam.ParDo(read).with_outputs(DEAD_LETTER, main="events")
        return out.events, out[DEAD_LETTER]
