"""The privacy-unit stages of a continual sum on a batch replay (user-level DP; ``docs/privacy_units.md``).

::

    events ─ UnitEvents (hash the unit id, validate, step) ─┬─ dead_letter (no clear id)
                                                            └─ GroupByKey(unit hash) ─ BoundUnits ─ ((stream, step), sum)

:class:`UnitEvents` reads each event's unit id (the params' ``privacy_unit.column``: a mapping key, a row
attribute or the 4th item of a tuple ``(stream_id, timestamp, value, unit_id)``), hashes it under the
job's secret key (read in ``setup()``, as the noise-drawing stages read it) and keeps only the hash: the
clear id never reaches a shuffle or a dead letter (a rejected event's id is replaced by its keyed hash,
or by ``None`` when it is the id that is bad: ``bad_unit_id``). :class:`BoundUnits` runs the units'
ledger over their steps in order (:func:`beam_dp.core.units.bound_block`, the units of a bundle
together) and emits the kept (stream, step) sums, each unit's of norm at most ``R``, into the release
path (summed per bundle, as the lifted combiner would); what it drops is counted per reason
(Beam counters ``beam_dp/units``: ``dropped_<reason>``), never released nor written.
:class:`ReadUnitEventFiles` reads CSV/Parquet event files with a unit column as such events (one per row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.core.units import DROP_REASONS, UnitKeys, UnitLedger, bound_block, unit_id_problems
from beam_dp.io.sources import StructuralInputError, value_columns
from beam_dp.io.tables import BATCH_ROWS, iter_parquet_batches, read_csv_rows
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.steps.events import DEAD_LETTER, DETAIL, DeadLetter, EventBatch, Reason, parse_contribution

__all__ = ["BoundUnits", "ReadUnitEventFiles", "UnitEvents", "unit_key"]

_NAMESPACE = "beam_dp/units"


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


class UnitEvents(beam.DoFn):
    """Events → ``(unit hash as int64, (stream, step, clipped value))``; bad events to ``dead_letter``."""

    def __init__(self, params: Any):
        self._params = params

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._clock = self._params.clock
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._column = self._params.privacy_unit.column
        self._keys = UnitKeys(unit_key(self._params.noise_key))
        self._dead = Metrics.counter(_NAMESPACE, "dead_letters")

    def _letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def process(self, element: Any) -> Iterator:
        if isinstance(element, EventBatch):
            letter = DeadLetter(Reason.BAD_UNIT_ID, "an EventBatch carries no privacy unit ids: give events with "
                                "the unit field", None, None, element.source)
            yield self._letter(letter)
            return
        unit, rest, redacted = _split_unit(element, self._column)
        problems = unit_id_problems([unit])
        if problems:
            detail = f"{DETAIL[Reason.BAD_UNIT_ID]}: {problems[0][1].replace('unit_id', self._column)}"
            yield self._letter(_redacted(DeadLetter(Reason.BAD_UNIT_ID, detail, None, None), redacted, self._column,
                                         None))
            return
        hashed = int(self._keys.hash([unit]).view(np.int64)[0])  # the shuffle key: a signed 64-bit integer
        parsed = parse_contribution(rest, self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            yield self._letter(_redacted(parsed, redacted, self._column, f"{hashed & (2**64 - 1):016x}"))
            return
        stream, step, block = parsed
        yield hashed, (stream, step, block.vector)


class BoundUnits(beam.DoFn):
    """Units' events (each unit with all its steps) → the kept ``((stream, step), ClippedSum)``, summed over
    the units of a bundle. The units of a bundle are bounded together, one
    :func:`~beam_dp.core.units.bound_block` per step over all of them (one ledger): what each unit keeps
    depends on its own events and the key only, so this is the bounding of each unit alone, in fewer
    calls. Drops counted per reason."""

    #: rows held before the bundle's units are bounded and their sums emitted
    FLUSH_ROWS = 1 << 20

    def __init__(self, params: Any):
        self._params = params

    def setup(self) -> None:
        self._keys = UnitKeys(unit_key(self._params.noise_key))
        self._bounds = self._params.unit_bounds()
        self._clip = float(self._params.clip_bound)
        self._dim = int(self._params.dim)
        self._drops = {reason: Metrics.counter(_NAMESPACE, f"dropped_{reason}") for reason in DROP_REASONS}
        self._kept = Metrics.counter(_NAMESPACE, "kept")

    def start_bundle(self) -> None:
        self._pending: dict[Any, list] = {}  # window -> [(unit, its events)]
        self._rows = 0

    def process(self, keyed: tuple[int, Any], window=beam.DoFn.WindowParam) -> Iterator:
        unit, events = keyed
        events = list(events)
        self._pending.setdefault(window, []).append((unit, events))
        self._rows += len(events)
        if self._rows >= self.FLUSH_ROWS:
            yield from self._flush()

    def finish_bundle(self) -> Iterator:
        yield from self._flush()

    def _flush(self) -> Iterator[WindowedValue]:
        pending, self._pending, self._rows = self._pending, {}, 0
        for window, units in pending.items():
            for key, block in self._bounded(units):
                yield WindowedValue((key, block), window.max_timestamp(), (window,))

    def _bounded(self, units: list) -> Iterator[tuple[tuple[str, int], ClippedSum]]:
        events = [event for _, rows in units for event in rows]
        n = len(events)
        hashes = np.repeat(np.array([unit for unit, _ in units], np.int64), [len(rows) for _, rows in units])
        steps = np.fromiter((step for _, step, _ in events), np.int64, n)
        streams = np.array([stream for stream, _, _ in events], dtype=object)
        values = np.array([vector for _, _, vector in events], dtype=np.float64).reshape(n, self._dim)
        order = np.argsort(steps, kind="stable")
        hashes, steps, streams, values = hashes[order].view(np.uint64), steps[order], streams[order], values[order]
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if n else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], n]
        ledger = UnitLedger.empty(self._bounds)
        for start, end in zip(starts.tolist(), ends.tolist()):
            step = int(steps[start])
            block = bound_block(ledger, step, hashes[start:end], streams[start:end].tolist(), values[start:end],
                                self._bounds, self._keys, clip_bound=self._clip)
            ledger = block.ledger
            for reason, count in block.drops.items():
                if count:
                    self._drops[reason].inc(count)
            self._kept.inc(len(block.streams))
            if not len(block.streams):
                continue
            names, of = np.unique(block.streams.astype(str), return_inverse=True)
            sums = np.zeros((len(names), self._dim))
            np.add.at(sums, of, np.asarray(block.sums, np.float64).reshape(len(of), self._dim))
            kept, clipped = np.bincount(of, minlength=len(names)), np.bincount(of, block.clipped, len(names))
            for i, stream in enumerate(names.tolist()):
                yield (stream, step), ClippedSum(sums[i], int(kept[i]), int(clipped[i]))


def _text(raw: Any) -> Any:
    """A CSV cell read as bytes, as text (``None`` where it is not UTF-8: a bad id, dead-lettered)."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw


def _numbers(column: pa.Array) -> list:
    """A column's cells; in a text column (a reader infers one when a cell is not a number) each cell that
    reads as a number as that number, the others as read (the event parser dead-letters them)."""
    cells = column.to_pylist()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return cells

    def number(cell: Any) -> Any:
        try:
            return float(cell)
        except (TypeError, ValueError):
            return cell

    return list(map(number, cells))


class _UnitEventFile(beam.DoFn):
    def __init__(self, column: str):
        self._column = column

    def process(self, path: str) -> Iterator:
        if path.endswith(".parquet"):
            with FileSystems.open(path) as fh:
                for batch in iter_parquet_batches(fh, BATCH_ROWS):
                    yield from self._events(batch, path)
            return
        with FileSystems.open(path) as fh:
            try:  # ids as bytes: a non-UTF-8 id is one dead letter, not a failed file
                read = read_csv_rows(fh, column_types={"stream_id": pa.binary(), self._column: pa.binary()},
                                     batch_size=BATCH_ROWS)
            except ValueError as exc:
                raise StructuralInputError(path, str(exc)) from None
        for letter in read.letters(path):
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, letter)
        for batch in read.batches:
            yield from self._events(batch, path)

    def _events(self, batch: pa.RecordBatch, path: str) -> Iterator[dict]:
        names = batch.schema.names
        missing = [c for c in ("stream_id", "timestamp", self._column) if c not in names]
        if missing:
            raise StructuralInputError(path, f"event files with privacy units need columns stream_id, timestamp, "
                                             f"{self._column}, value...; {missing} missing from {names}")
        try:
            values = value_columns(names)
        except ValueError as exc:
            raise StructuralInputError(path, str(exc)) from None
        streams, units = (batch.column(c).to_pylist() for c in ("stream_id", self._column))
        stamps, *cells = (_numbers(batch.column(c)) for c in ["timestamp", *values])
        scalar = values == ["value"]
        for i in range(batch.num_rows):
            yield {"stream_id": _text(streams[i]), "timestamp": stamps[i], self._column: _text(units[i]),
                   "value": cells[0][i] if scalar else [column[i] for column in cells]}


class ReadUnitEventFiles(beam.PTransform):
    """CSV/Parquet event files matching ``pattern`` with the unit column ``column`` → ``(events,
    dead_letter)``: one mapping per row (``stream_id``, ``timestamp``, ``value``, ``column``), validated
    by :class:`UnitEvents`; unreadable lines dead-lettered as ``beam_dp.io.sources`` does."""

    def __init__(self, pattern: str, column: str):
        super().__init__()
        self.pattern = pattern
        self.column = column

    def expand(self, pbegin):
        paths = (pbegin | "Pattern" >> beam.Create([self.pattern])
                 | "Match" >> beam.FlatMap(lambda p: sorted(m.path for m in FileSystems.match([p])[0].metadata_list))
                 | "Spread" >> beam.Reshuffle())
        out = paths | "Read" >> beam.ParDo(_UnitEventFile(self.column)).with_outputs(DEAD_LETTER, main="events")
        return out.events, out[DEAD_LETTER]
