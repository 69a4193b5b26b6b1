"""``GrowingDatabaseQueries``: linear queries on growing databases (PMWG, BBScheduler, BBImprover) on Beam
(guide: ``docs/growing_db.md``).

Two inputs keyed by stream (Cummings et al., "Differential Privacy for Growing Databases"):

* **elements** ``(stream_id, timestamp, record)`` (or mappings with fields ``stream_id``,
  ``timestamp``, ``value``, or :class:`~beam_dp.steps.columns.ElementColumns` blocks of such mappings,
  a file's batch read in columns): ``record`` is a row of the declared
  :class:`~beam_dp.mechanisms.growing_db.universe.Universe` (a mapping by field, a tuple in field order, or a bare
  value for a one-field universe). Elements join the database in event-time
  order (ties by universe index): steps of the public ``StepClock`` close when the watermark passes,
  and a closed step's elements are absorbed one at a time (mixing per element);
* **queries** ``(stream_id, query_id, t, weights)`` or mappings with ``stream_id, query_id, t`` and one
  of ``weights`` (N numbers in [0, 1]), ``predicate`` (``{field: selection}``, see
  ``Universe.predicate``) or ``indices`` (a counting query). A query is answered against ``x_t``:
  right after the t-th element is absorbed and before the (t+1)-th. Analysts may pick queries
  adaptively from earlier answers. Several queries at one t are answered in ``query_id`` order.

Outputs (:class:`GrowingDatabaseOutputs`): ``releases`` (one :class:`~beam_dp.io.ReleaseRow` per
answer, ``step = t``, value ``[answer]``, ``meta`` with ``query_id``; schedulers add one row per
black-box run), ``snapshots`` (the public synthetic histogram each time steps close, when
``snapshots=True``; write them with ``WriteReleasesToParquet``) and ``dead_letter``: records outside
the universe, malformed rows and timestamps, elements of a released step (``late``); queries with
``t < n`` (``before_start``), a ``t`` already passed (``late``), never reached by the end of the
schedule (``after_end``), or with weights of the wrong length, outside [0, 1] or NaN. A dead letter's
``detail`` never contains the value.

Public: the clock, the arrival count per stream (t is the database size), the query times and
weights, the set of streams. Protected: which elements the database holds (event level,
substitution from the element's arrival on). The privacy arithmetic is in the mechanisms.

With ``privacy_unit=`` (a :class:`~beam_dp.core.group_privacy.RecordUnit`) the elements are bounded to
at most ``max_records`` per privacy unit (the first by arrival, on a batch replay and a streaming job
alike: one count per unit in keyed state, no timers), and every answer protects one unit's whole
contribution by group privacy over the chain of its element substitutions, calibrated at the record-level
budget :func:`~beam_dp.core.group_privacy.record_budget` gives (``docs/growing_db.md``, "Privacy units").
Queries are public and carry no unit.

The stateful DoFn is a shell over the one step driver (:mod:`beam_dp.steps.driver`) with the
growing-database policy (:class:`~beam_dp.steps.policies.GrowingPolicy`): two inputs, elements by
step, queries carried until answered; the same end, lateness and refusal rules as every family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, Mapping, NamedTuple, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection

from beam_dp.beam.shell.blocks import (
    BlockOriginals,
    BundleBlocks,
    ElementColumns,
    RecordColumns,
    by_record,
    sourced,
    stream_parts,
)
from beam_dp.beam.shell.dofn import DriverDoFn
from beam_dp.beam.shell.domains import bind_noise_domain, release_labels
from beam_dp.beam.shell.unit_records import BoundUnitRecords, with_record_unit
from beam_dp.core.budget import BudgetShare, check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.group_privacy import RecordUnit, check_unit_share
from beam_dp.core.limits import (
    EPSILON_RANGE,
    MAX_COUNT,
    MAX_SCALE,
    MIN_SCALE,
    check_clock,
    check_count,
    check_delta,
    check_number,
    is_utf8,
)
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.core.release import Release
from beam_dp.io.keys import load_noise_source
from beam_dp.mechanisms.growing_db.base import GrowingQueryMechanism
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, BBScheduler, BlackBox, LaplaceHistogram
from beam_dp.mechanisms.growing_db.universe import Universe, check_query
from beam_dp.steps.batch import stream_reasons
from beam_dp.steps.driver import CARRIED, SNAPSHOTS, StepDriver
from beam_dp.steps.events import (
    DEAD_LETTER,
    DETAIL,
    DeadLetter,
    Reason,
    checked_stream,
    column_micros,
    named_fields,
    split_event,
    to_micros,
)
from beam_dp.steps.params import NoiseKey, check_schedule, check_streams, legacy_noise_of, noise_source_of
from beam_dp.steps.policies import GrowingPolicy, plan_block
from beam_dp.steps.schema import ReleaseRow

__all__ = [
    "GrowingDatabaseOutputs",
    "GrowingDatabaseParams",
    "GrowingDatabaseQueries",
    "GrowingReason",
    "ParseGrowing",
    "plan_block",
    "replay_growing_database",
]

beam.coders.registry.register_coder(ReleaseRow, beam.coders.RowCoder)


class GrowingReason(Reason):
    """Dead-letter reasons of this family (``Reason`` plus universe and query checks)."""

    OUTSIDE_UNIVERSE = "outside_universe"


@dataclass(frozen=True)
class GrowingDatabaseParams:
    """Parameters of :class:`GrowingDatabaseQueries` (validated, and the mechanism built, at construction;
    ``docs/growing_db.md``).

    Args:
        universe: the declared data universe of ``N >= 2`` rows
            (:class:`~beam_dp.mechanisms.growing_db.universe.Universe`); records outside it are dead-lettered.
        n: the starting database size (>= 1; >= 3 for ``"bbimprover"``): queries are answered from ``t = n``
            elements on, earlier ones are dead-lettered (``before_start``).
        epsilon: ``ε`` (in ``[1e-9, 1e9]``): each element's total privacy loss over the whole unbounded stream
            of answers (substitution from its arrival on).
        clock: the event-time steps (:class:`~beam_dp.core.StepClock`; a batch replay needs its public ``end``).
        mechanism: ``"pmwg"`` (default; uses ``alpha``, ``a``, ``xi_n``), ``"bbscheduler"`` (``black_box``,
            ``beta``, ``gamma``) or ``"bbimprover"`` (``black_box``, ``beta``; needs ``delta > 0``).
        alpha: PMWG's target accuracy ``α`` in ``(0, 1]`` (default 0.25).
        delta: ``δ`` in ``[0, 1)`` (default 0.0: pure ε-DP); ``δ > 0``: (ε, δ)-DP under zCDP accounting.
        a: PMWG's noise-decay exponent in ``[0, 1)``: noise scale ``ξ_t = ξ_n (n/t)^a`` (default 0.5).
        xi_n: PMWG's noise scale ``ξ_n`` at size ``n`` (> 0; default None: planned from ``n``, ε, δ). Its
            accountant charges every segment, so ε holds for any value: it sets the accuracy only.
        black_box: the schedulers' offline ε-DP synopsis (default None: ``LaplaceHistogram(N)``).
        beta: the schedulers' failure probability ``β`` in ``(0, 1]`` (``"bbimprover"``: at most ``1/e``;
            default 0.05); it sets their accuracy, not the privacy.
        gamma: BBScheduler's epoch growth ``γ`` in ``[1e-6, 1e3]`` (runs at sizes ``⌈(1+γ)^i n⌉``); default None:
            planned from ``n`` and ``beta``.
        snapshots: also release the public synthetic histogram each time steps close (default False;
            post-processing, no privacy cost).
        streams, noise_key, budget, allowed_lateness: the step fields of
            :class:`~beam_dp.steps.params.StepParams`.
        privacy_unit: the :class:`~beam_dp.core.group_privacy.RecordUnit` every answer protects (default
            None: one element); set by ``with_record_unit`` (or the transform's ``privacy_unit=``), with
            ``epsilon``, ``delta`` the record-level budget every calibration (PMWG's ``xi_n``, the schedulers'
            epochs) is planned from and ``budget`` the unit's share.
    """

    universe: Universe
    n: int
    epsilon: float
    clock: StepClock
    mechanism: Literal["pmwg", "bbscheduler", "bbimprover"] = "pmwg"
    alpha: float = 0.25
    delta: float = 0.0
    a: float = 0.5
    xi_n: float | None = None
    black_box: BlackBox | None = None
    beta: float = 0.05
    gamma: float | None = None
    snapshots: bool = False
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    budget: BudgetShare | None = None  # this transform's share of its job's budget (**share.params())
    allowed_lateness: float = 0.0  # grace in seconds (see beam_dp.steps.params)
    privacy_unit: RecordUnit | None = None  # the unit protected (with_record_unit); None: one element

    def __post_init__(self) -> None:
        if not isinstance(self.universe, Universe):
            raise ValueError("universe must be a beam_dp.mechanisms.growing_db.universe.Universe")
        if not isinstance(self.clock, StepClock):
            raise ValueError("clock must be a StepClock (event-time steps)")
        check_schedule(self.clock, None, self.allowed_lateness)
        if self.mechanism not in ("pmwg", "bbscheduler", "bbimprover"):
            raise ValueError(f"mechanism must be 'pmwg', 'bbscheduler' or 'bbimprover', got {self.mechanism!r}")
        check_streams(self)
        check_clock(self.clock, self.streams)
        check_count("n", self.n)
        check_number("epsilon", self.epsilon, *EPSILON_RANGE)
        check_delta(self.delta)
        check_number("alpha", self.alpha, 1e-9, 1.0)
        check_number("beta", self.beta, MIN_SCALE, 1.0)
        if self.gamma is not None:
            check_number("gamma", self.gamma, 1e-6, 1e3)
        if self.xi_n is not None:
            check_number("xi_n", self.xi_n, MIN_SCALE, MAX_SCALE)
        check_unit_share(self.privacy_unit, self.budget)
        check_params_budget(self, self.build_mechanism())

    def build_mechanism(self) -> GrowingQueryMechanism:
        N = self.universe.size
        if self.mechanism == "pmwg":
            return PMWG(universe_size=N, n=self.n, epsilon=self.epsilon, alpha=self.alpha, delta=self.delta,
                        a=self.a, xi_n=self.xi_n)
        box = self.black_box if self.black_box is not None else LaplaceHistogram(N)
        if self.mechanism == "bbscheduler":
            return BBScheduler(box, universe_size=N, n=self.n, epsilon=self.epsilon, beta=self.beta,
                               delta=self.delta, gamma=self.gamma)
        return BBImprover(box, universe_size=N, n=self.n, epsilon=self.epsilon, delta=self.delta, beta=self.beta)


class GrowingDatabaseOutputs(NamedTuple):
    releases: PCollection
    snapshots: PCollection
    dead_letter: PCollection


def replay_growing_database(params: GrowingDatabaseParams, stream: str, elements: Iterable[tuple[float, Any]],
                            queries: Iterable[tuple[str, int, np.ndarray]], noise: NoiseSource
                            ) -> tuple[list[Release], list[Release]]:
    """The pure reference of one stream: ``elements`` ``(timestamp seconds, universe index)``, queries
    ``(query_id, t, weights)``; returns ``(releases, snapshots)`` as the transform makes them in a batch
    replay (one timer at the clock's end, every step fed in order)."""
    mech, clock = params.build_mechanism(), params.clock
    by_step: dict[int, list[tuple[int, int]]] = {}
    for ts, index in elements:
        micros = to_micros(ts)
        by_step.setdefault(int(clock.step_of_micros(micros)), []).append((micros, int(index)))
    pending = [(t, qid, np.asarray(w, np.float64)) for qid, t, w in queries]
    state = mech.init_state(stream)
    releases: list[Release] = []
    for step in range(1, clock.last_step + 1):
        block, pending, _ = plan_block(state.t, by_step.get(step, []), pending)
        state, rel = mech.step(state, block, noise)
        releases.extend(rel)
    snap = mech.snapshot(state) if params.snapshots else None
    return releases, [snap] if snap is not None else []


# -- parsing -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Rows:
    """A chunk of one stream's elements read in columns, in a bundle's block: ``micros`` (n,) int64 event
    times, ``index`` (n,) int64 universe indices, ``valid`` (n,) bool (False: outside the universe)."""

    micros: np.ndarray
    index: np.ndarray
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.micros)


def _flatten(rows: list) -> tuple[_Rows, np.ndarray, list]:
    """A block's rows (single rows ``(micros, record)`` and :class:`_Rows` chunks, in order) as one
    ``_Rows`` (single rows with index 0 and valid, not yet encoded), the single rows' positions and their
    records."""
    parts: list[_Rows] = []
    singles: list[np.ndarray] = []
    records: list = []
    run: list = []
    at = 0
    for row in rows + [None]:
        if row is not None and not isinstance(row, _Rows):
            run.append(row)
            continue
        if run:  # consecutive single rows: one part
            singles.append(np.arange(at, at + len(run)))
            records += [record for _, record in run]
            parts.append(_Rows(np.array([m for m, _ in run], dtype=np.int64), np.zeros(len(run), dtype=np.int64),
                               np.ones(len(run), dtype=bool)))
            at, run = at + len(run), []
        if row is not None:
            parts.append(row)
            at += len(row)
    if len(parts) == 1:
        flat = parts[0]
    else:
        flat = _Rows(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("micros", "index", "valid")))
    return flat, np.concatenate(singles) if singles else np.zeros(0, dtype=np.int64), records


class ParseGrowing(beam.DoFn):
    """Validate elements (``kind="element"``) or queries (``"query"``); dead-letter the bad ones. A
    bundle's valid elements of one stream leave as one block per step ``(stream, ("b", step, micros,
    indices, elements))`` (:class:`~beam_dp.beam.shell.blocks.BundleBlocks`). An ``ElementColumns`` block (a
    file's batch) is checked in vectorised passes and reaches the same blocks (:meth:`_element_columns`).
    Elements or queries read one by one from a file come as :class:`~beam_dp.beam.shell.blocks.RecordColumns`:
    each is checked as one, and its letters name its ``file#record=n``."""

    MAX_ROWS = 4096  # elements per block

    def __init__(self, params: GrowingDatabaseParams, kind: str):
        self._params, self._kind = params, kind

    def start_bundle(self) -> None:
        self._blocks = BundleBlocks(self._element_block, self.MAX_ROWS)

    def finish_bundle(self) -> Iterator:
        yield from self._blocks.flush()

    def setup(self) -> None:
        self._universe = self._params.universe
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._dead = Metrics.counter("beam_dp/growing_db", "dead_letters")
        self._count = Metrics.counter("beam_dp/growing_db", f"{self._kind}s")

    def _letter(self, reason: str, detail: str, stream: Any, element: Any, source: str | None = None):
        return self._dead_letter(DeadLetter(reason, detail, stream, element, source))

    def _dead_letter(self, letter: DeadLetter):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)

    def _stream(self, stream: Any, element: Any):
        checked = checked_stream(stream, self._streams, element)
        if isinstance(checked, DeadLetter):
            return None, self._dead_letter(checked)
        return checked, None

    def process(self, element: Any, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam) -> Iterator:
        if isinstance(element, RecordColumns):
            yield from by_record(element, lambda row, original: self._query(row) if self._kind == "query" else
                                 self._element(row, timestamp, window, original=original))
        elif self._kind == "query":
            yield from self._query(element)
        elif isinstance(element, ElementColumns):
            yield from self._element_columns(element, timestamp, window)
        else:
            yield from self._element(element, timestamp, window)

    def _element(self, element: Any, timestamp: Any, window: Any, source: str | None = None,
                 original: Any = None) -> Iterator:
        """One element (``original``: what stands for it in its block, e.g. its one-row ``ElementColumns``
        that knows its source; the element itself by default)."""
        # the head checked here, its place in the schedule and the universe for the whole block
        head = split_event(element, ("value",), None, self._streams, timestamp=True)
        if isinstance(head, DeadLetter):
            yield self._dead_letter(sourced(head, source))
            return
        stream, micros, _, (record,) = head
        yield from self._blocks.add(stream, (micros, record), element if original is None else original, timestamp,
                                    window)

    def _element_columns(self, block: ElementColumns, timestamp: Any, window: Any) -> Iterator:
        """A block of elements in columns, as its rows one by one would go through :meth:`_element`: the
        stream ids and timestamps of every row checked at once (``bad_stream_id``,
        ``undeclared_stream``, ``bad_timestamp``, ``out_of_range``), the universe index of the accepted
        ones encoded at once (:meth:`_column_index`), and each stream's accepted rows added to the
        bundle's blocks as one :class:`_Rows` chunk; an odd row (or every row of a block whose fields
        are not the universe's) goes through :meth:`_element` itself, in its place in arrival order."""
        if block.names != tuple(f.name for f in self._universe.fields):
            for i in range(len(block)):
                yield from self._element(block.record(i), timestamp, window, block.source_of(i), block.take([i]))
            return
        odd = np.fromiter(sorted(block.odd), dtype=np.int64, count=len(block.odd))
        plain = np.ones(len(block), dtype=bool)
        plain[odd] = False
        reasons, good_id, _ = stream_reasons(block.stream_ids, self._streams)
        micros, times = column_micros(block.timestamps)
        reasons = np.where(reasons == "", times, reasons)
        for i in np.flatnonzero(plain & (reasons != "")).tolist():  # split_event's letters
            yield self._dead_letter(DeadLetter(reasons[i], DETAIL[reasons[i]],
                                               block.stream_ids[i] if good_id[i] else None, block.record(i),
                                               block.source_of(i)))
        accepted = np.flatnonzero(plain & (reasons == ""))
        index, valid = self._column_index(block, accepted)
        pieces = np.split(np.arange(len(accepted)), np.searchsorted(accepted, odd))  # the runs between odd rows
        for k, piece in enumerate(pieces):
            for stream, part in stream_parts(block.stream_ids[accepted[piece]]):
                at = piece[part]
                rows = accepted[at]
                yield from self._blocks.add_rows(stream, _Rows(micros[rows], index[at], valid[at]), block.take(rows),
                                                 timestamp, window)
            if k < len(odd):
                at = int(odd[k])
                yield from self._element(block.odd[at], timestamp, window, block.source_of(at), block.take([at]))

    def _column_index(self, block: ElementColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(index, valid)`` of ``rows`` of a block: each field's codes (``_Field.codes``) of its numbers,
        or of its distinct values once (``labels``), combined (:meth:`Universe.combine`); exactly
        :meth:`Universe.encode_records` of the rows' records."""
        codes = []
        for universe_field, cells, labels in zip(self._universe.fields, block.values, block.labels):
            if labels is None:
                codes.append(universe_field.codes(cells[rows]))
            else:
                distinct, ok = universe_field.codes(labels)
                codes.append((distinct[cells[rows]], ok[cells[rows]]))
        return self._universe.combine(codes)

    def _element_block(self, stream: str, rows: list, originals: BlockOriginals) -> list:
        """One stream's elements of a bundle (single rows and :class:`_Rows` chunks), checked in
        vectorised passes: their place in the public schedule (``before_start``, ``after_end``), then in
        the universe (a chunk's rows encoded when read; single rows here, together, by
        :meth:`Universe.encode_records`: ``outside_universe``, ``malformed``), each refused element
        dead-lettered on its own; the rest leave as one block per step ``(stream, ("b", step, micros,
        indices, elements))`` in arrival order."""
        clock = self._params.clock
        flat, singles, records = _flatten(rows)
        micros, index = flat.micros, flat.index.copy()
        where = clock.classify_micros(micros)
        reasons = np.full(len(micros), "", dtype=object)
        reasons[where < 0], reasons[where > 0] = Reason.BEFORE_START, Reason.AFTER_END
        reasons[(where == 0) & ~flat.valid] = GrowingReason.OUTSIDE_UNIVERSE
        placed = np.flatnonzero(where[singles] == 0)
        index[singles[placed]], reasons[singles[placed]] = self._encode([records[i] for i in placed.tolist()])
        bad, good = np.flatnonzero(reasons != ""), np.flatnonzero(reasons == "")
        self._count.inc(len(good))
        steps = clock.step_of_micros(micros[good])
        numbers = np.unique(steps).tolist()
        groups = [good[steps == step] for step in numbers]
        letters, *by_step = originals.parts([bad] + groups)
        out: list = [self._letter(reason, _DETAIL[reason], stream, element, source)
                     for reason, element, source in zip(reasons[bad].tolist(), letters.elements(), letters.sources())]
        for step, rows_of, elements in zip(numbers, groups, by_step):
            out.append((stream, ("b", step, micros[rows_of], index[rows_of], elements)))
        return out

    def _encode(self, records: list) -> tuple[np.ndarray, np.ndarray]:
        """``Universe.encode_records``, or one record at a time when a value fits no column."""
        try:
            return self._universe.encode_records(records)
        except (ValueError, TypeError):
            index, reasons = np.zeros(len(records), dtype=np.int64), np.full(len(records), "", dtype=object)
            for i, record in enumerate(records):
                try:
                    index[i] = self._universe.encode_one(record)
                except (ValueError, TypeError) as exc:
                    reason = str(exc).partition(": ")[0]
                    reasons[i] = reason if reason == GrowingReason.OUTSIDE_UNIVERSE else Reason.MALFORMED
            return index, reasons

    def _query(self, element: Any) -> Iterator:
        try:
            if isinstance(element, tuple) and not hasattr(element, "_fields"):
                if len(element) != 4:
                    raise ValueError("expected (stream_id, query_id, t, weights)")
                stream, qid, t, weights = element
                predicate = indices = None
            else:
                stream, qid, t, weights, predicate, indices = named_fields(
                    element, ("stream_id", "query_id", "t", "weights", "predicate", "indices"))
        except ValueError as exc:
            yield self._letter(Reason.MALFORMED, str(exc), None, element)
            return
        stream, bad = self._stream(stream, element)
        if bad is not None:
            yield bad
            return
        if not isinstance(qid, (str, int)) or isinstance(qid, bool) or (isinstance(qid, str) and not is_utf8(qid)):
            yield self._letter(Reason.MALFORMED, "query_id must be a UTF-8 string or an integer", stream, element)
            return
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
            yield self._letter(Reason.MALFORMED, "t (the database size) must be an integer", stream, element)
            return
        if t > MAX_COUNT:
            yield self._letter(GrowingReason.OUT_OF_RANGE, "t (the database size) must be at most 2**62", stream, element)
            return
        if t < self._params.n:
            yield self._letter(Reason.BEFORE_START, f"queries need t >= n = {self._params.n}", stream, element)
            return
        given = [x is not None for x in (weights, predicate, indices)]
        try:
            if sum(given) != 1:
                raise ValueError("malformed: give exactly one of weights, predicate, indices")
            if predicate is not None:
                weights = self._universe.predicate(predicate)
            elif indices is not None:
                weights = self._universe.counting_query(indices)
            weights = check_query(weights, self._universe.size)
        except (ValueError, TypeError) as exc:
            reason, _, detail = str(exc).partition(": ")
            known = {Reason.BAD_VALUE, Reason.WRONG_SHAPE, Reason.NON_FINITE, Reason.MALFORMED,
                     GrowingReason.OUT_OF_RANGE, GrowingReason.OUTSIDE_UNIVERSE}
            yield self._letter(reason if reason in known else Reason.MALFORMED, detail or "bad query", stream, element)
            return
        self._count.inc()
        yield stream, ("q", int(t), str(qid), weights, element)


#: the detail of an element refused by the schedule or the universe (never its value)
_DETAIL = {Reason.BEFORE_START: DETAIL[Reason.BEFORE_START], Reason.AFTER_END: DETAIL[Reason.AFTER_END],
           GrowingReason.OUTSIDE_UNIVERSE: "the record is not in the declared universe",
           Reason.MALFORMED: "a record is a mapping or a tuple with one value per field"}


# -- the stateful DoFn -------------------------------------------------------------------------
class GrowingDatabaseDoFn(DriverDoFn):
    """Input ``(stream, ("b", step, micros, indices, originals) | ("q", t, query_id, weights, original)
    | ("declare",))``. Main output: release rows; tagged ``snapshots`` and ``dead_letter``. A shell over
    the step driver with a :class:`~beam_dp.steps.policies.GrowingPolicy`: elements wait by step,
    queries are carried until the database reaches their size (a passed size is ``late``)."""

    def make_driver(self) -> StepDriver:
        params = self._params
        policy = GrowingPolicy(params.build_mechanism(), noise_source_of(params, load_noise_source), params.snapshots)
        driver = StepDriver(policy, clock=params.clock, last_step=params.clock.last_step,
                            allowed_lateness=params.allowed_lateness, binding=calibration_binding(params))
        driver.legacy_noise = legacy_noise_of(params, load_noise_source)  # keys written before the binding
        return driver

    def process(self, element, key_state=beam.DoFn.StateParam(DriverDoFn.KEY_STATE),
                buffer=beam.DoFn.StateParam(DriverDoFn.BUFFER), close=beam.DoFn.TimerParam(DriverDoFn.CLOSE),
                end=beam.DoFn.TimerParam(DriverDoFn.END)) -> Iterator:
        stream, item = element
        state = self.key_state(stream, key_state, close, end, buffer)
        if item[0] in ("b", "e"):  # a block of elements of one step ("e": one element, from earlier versions)
            _, step, micros, index, original = item
            yield from self.add(state, key_state, buffer, step, (micros, index), original)
        elif item[0] == "q":
            _, t, qid, weights, _ = item
            yield from self.add(state, key_state, buffer, CARRIED, (t, qid, weights), None)
        else:  # a declared stream starts at step 1 (an undeclared one at its first element's step)
            self.declare(state, key_state, close)
            yield from self.emit([])


class GrowingDatabaseQueries(beam.PTransform):
    """Answer linear queries on growing databases with PMWG or a black-box scheduler (see module doc).

    Input: ``{"elements": pcoll, "queries": pcoll}`` or ``(elements, queries)``. Guarantee per element
    (substitution from its arrival on): ε-DP, or (ε, δ)-DP when ``delta > 0``, over the whole
    unbounded stream of answers; every release carries the worst element's ``epsilon_spent``. With a
    privacy unit, per unit of at most ``max_records`` elements (group privacy).

    Args:
        params: a :class:`GrowingDatabaseParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: protect this :class:`~beam_dp.core.group_privacy.RecordUnit` (the elements carry its
            field; a tuple element its id as a 4th item) instead of one element (default None).
    """

    def __init__(self, params: GrowingDatabaseParams, label: str | None = None,
                 privacy_unit: RecordUnit | None = None):
        super().__init__(label)
        if not isinstance(params, GrowingDatabaseParams):
            raise TypeError("GrowingDatabaseQueries takes a GrowingDatabaseParams")
        self.params = params if privacy_unit is None else with_record_unit(params, privacy_unit)

    def expand(self, inputs) -> GrowingDatabaseOutputs:
        if isinstance(inputs, Mapping):
            elements, queries = inputs["elements"], inputs["queries"]
        else:
            elements, queries = inputs
        params = bind_noise_domain(self.params, elements)
        bounded = bool(getattr(elements, "is_bounded", True)) and bool(getattr(queries, "is_bounded", True))
        if bounded and params.clock.last_step is None:
            raise ValueError("a batch replay needs a public end: StepClock(..., end=...)")
        unit_dead = []
        if params.privacy_unit is not None:  # at most max_records elements per unit, the id hashed and dropped
            elements, bad_units = elements | "BoundUnits" >> BoundUnitRecords(params.privacy_unit, params.noise_key)
            unit_dead.append(bad_units)
        parsed_e = elements | "ParseElements" >> beam.ParDo(ParseGrowing(params, "element")).with_outputs(
            DEAD_LETTER, main="ok")
        parsed_q = queries | "ParseQueries" >> beam.ParDo(ParseGrowing(params, "query")).with_outputs(
            DEAD_LETTER, main="ok")
        keyed = [parsed_e.ok, parsed_q.ok]
        if params.streams:
            keyed.append(elements.pipeline | "DeclareStreams" >> beam.Create([(s, ("declare",)) for s in params.streams]))
        merged = (
            [pc | f"Typed{i}" >> beam.Map(lambda x: x).with_output_types(Tuple[str, Any]) for i, pc in enumerate(keyed)]
            | "Merge" >> beam.Flatten()
        )
        out = merged | "Answer" >> beam.ParDo(GrowingDatabaseDoFn(params, per_step_timers=not bounded)).with_outputs(
            DEAD_LETTER, SNAPSHOTS, main="rows")
        labels = release_labels(params)
        rows = out.rows | "Rows" >> beam.Map(labels).with_output_types(ReleaseRow)
        snaps = out[SNAPSHOTS] | "SnapshotRows" >> beam.Map(labels).with_output_types(ReleaseRow)
        dead = ((*unit_dead, parsed_e[DEAD_LETTER], parsed_q[DEAD_LETTER], out[DEAD_LETTER])
                | "DeadLetters" >> beam.Flatten())
        return GrowingDatabaseOutputs(rows, snaps, dead)
