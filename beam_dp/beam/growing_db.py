"""``GrowingDatabaseQueries``: linear queries on growing databases (PMWG, BBScheduler, BBImprover) on Beam.

Two inputs keyed by stream (spec growing-databases §5):

* **elements** ``(stream_id, timestamp, record)`` (or mappings with those fields): ``record`` is a row
  of the declared :class:`~beam_dp.mechanisms.universe.Universe` (a mapping by field, a tuple in
  field order, or a bare value for a one-field universe). Elements join the database in event-time
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

Own stateful DoFn (the generic ``ContinualReleaseDoFn`` drives one input with one release per step;
this family is query-driven with two inputs), reusing its patterns: encoded mechanism state in
``ReadModifyWriteState``, the noise key loaded in ``setup()``, event-time timers, dead letters, metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, Mapping, NamedTuple, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder, PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam.domains import bind_noise_domain, release_labels
from beam_dp.beam.events import DeadLetter, Reason, checked_stream, to_micros
from beam_dp.beam.params import NoiseKey
from beam_dp.beam.parse import DEAD_LETTER
from beam_dp.core.budget import BudgetShare, check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.io.schema import ReleaseRow, release_to_row
from beam_dp.mechanisms.pmwg import PMWG, GrowingBlock, GrowingQueryMechanism, Query
from beam_dp.mechanisms.schedulers import BBImprover, BBScheduler, BlackBox, LaplaceHistogram
from beam_dp.mechanisms.universe import Universe, check_query

__all__ = [
    "GrowingDatabaseOutputs",
    "GrowingDatabaseParams",
    "GrowingDatabaseQueries",
    "GrowingReason",
    "plan_block",
    "replay_growing_database",
]

SNAPSHOTS = "snapshots"
beam.coders.registry.register_coder(ReleaseRow, beam.coders.RowCoder)


class GrowingReason(Reason):
    """Dead-letter reasons of this family (``Reason`` plus universe and query checks)."""

    OUTSIDE_UNIVERSE = "outside_universe"
    OUT_OF_RANGE = "out_of_range"


@dataclass(frozen=True)
class GrowingDatabaseParams:
    """Parameters of :class:`GrowingDatabaseQueries` (validated, and the mechanism built, at construction).

    ``mechanism``: ``"pmwg"`` (uses ``alpha``, ``a``, ``xi_n``), ``"bbscheduler"`` (``black_box``,
    ``beta``, ``gamma``) or ``"bbimprover"`` (``black_box``, ``beta``; needs ``delta > 0``). The default
    black box is ``LaplaceHistogram(N)``. ``clock`` gives the event-time steps (a batch replay needs its
    ``end``); ``streams`` optionally declares the streams.
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

    def __post_init__(self) -> None:
        if not isinstance(self.universe, Universe):
            raise ValueError("universe must be a beam_dp.mechanisms.universe.Universe")
        if not isinstance(self.clock, StepClock):
            raise ValueError("clock must be a StepClock (event-time steps)")
        if self.mechanism not in ("pmwg", "bbscheduler", "bbimprover"):
            raise ValueError(f"mechanism must be 'pmwg', 'bbscheduler' or 'bbimprover', got {self.mechanism!r}")
        if self.streams is not None:
            if isinstance(self.streams, str) or not all(isinstance(s, str) and s for s in self.streams):
                raise ValueError("streams must be a tuple of non-empty strings")
            object.__setattr__(self, "streams", tuple(dict.fromkeys(self.streams)))
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


# -- ordering shared by the DoFn and the pure replay -------------------------------------------
def plan_block(size: int, items: Iterable[tuple[int, int]], queries: Iterable[tuple]
               ) -> tuple[GrowingBlock, list[tuple], list[tuple]]:
    """One closed step: elements ``(micros, index)`` sorted by time then index; the queries
    ``(t, query_id, weights, ...)`` with ``size ≤ t ≤ size + len(elements)`` in ``(t, query_id)`` order.
    Returns the block, the queries kept for later and the queries already passed (``t < size``)."""
    ordered = sorted(items)
    elements = np.array([index for _, index in ordered], dtype=np.int64)
    top = size + len(elements)
    now, later, passed = [], [], []
    for q in queries:
        (now if size <= q[0] <= top else later if q[0] > top else passed).append(q)
    now.sort(key=lambda q: (q[0], q[1]))
    block = GrowingBlock(elements, tuple(Query(q[0], q[1], q[2]) for q in now))
    return block, later, passed


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
def _get(element: Any, names: tuple[str, ...]) -> tuple:
    if isinstance(element, Mapping):
        return tuple(element.get(n) for n in names)
    if hasattr(element, "stream_id"):
        return tuple(getattr(element, n, None) for n in names)
    raise ValueError(f"unsupported element type {type(element).__name__}")


class _ParseGrowing(beam.DoFn):
    """Validate elements (``kind="element"``) or queries (``"query"``); dead-letter the bad ones."""

    def __init__(self, params: GrowingDatabaseParams, kind: str):
        self._params, self._kind = params, kind

    def setup(self) -> None:
        self._universe = self._params.universe
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._dead = Metrics.counter("beam_dp/growing_db", "dead_letters")
        self._count = Metrics.counter("beam_dp/growing_db", f"{self._kind}s")

    def _letter(self, reason: str, detail: str, stream: Any, element: Any):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(reason, detail, stream, element))

    def _stream(self, stream: Any, element: Any):
        checked = checked_stream(stream, self._streams, element)
        if isinstance(checked, DeadLetter):
            return None, self._letter(*checked)
        return checked, None

    def process(self, element: Any) -> Iterator:
        if self._kind == "element":
            yield from self._element(element)
        else:
            yield from self._query(element)

    def _element(self, element: Any) -> Iterator:
        try:
            if isinstance(element, tuple) and not hasattr(element, "_fields"):
                if len(element) != 3:
                    raise ValueError("expected (stream_id, timestamp, record)")
                stream, ts, record = element
            else:
                stream, ts, record = _get(element, ("stream_id", "timestamp", "value"))
        except ValueError as exc:
            yield self._letter(Reason.MALFORMED, str(exc), None, element)
            return
        stream, bad = self._stream(stream, element)
        if bad is not None:
            yield bad
            return
        try:
            micros = to_micros(ts)
        except (ValueError, TypeError, OverflowError):
            yield self._letter(Reason.BAD_TIMESTAMP, "timestamp is not a usable event time", stream, element)
            return
        where = int(self._params.clock.classify_micros(np.array([micros]))[0])
        if where:
            reason = Reason.BEFORE_START if where < 0 else Reason.AFTER_END
            yield self._letter(reason, "timestamp outside the public schedule", stream, element)
            return
        try:
            index = self._universe.encode_one(record)
        except (ValueError, TypeError) as exc:
            reason, _, detail = str(exc).partition(": ")
            reason = reason if reason in (GrowingReason.OUTSIDE_UNIVERSE, Reason.MALFORMED) else Reason.MALFORMED
            yield self._letter(reason, detail or "record not in the universe", stream, element)
            return
        self._count.inc()
        step = int(self._params.clock.step_of_micros(micros))
        yield stream, ("e", step, micros, index, element)

    def _query(self, element: Any) -> Iterator:
        try:
            if isinstance(element, tuple) and not hasattr(element, "_fields"):
                if len(element) != 4:
                    raise ValueError("expected (stream_id, query_id, t, weights)")
                stream, qid, t, weights = element
                predicate = indices = None
            else:
                stream, qid, t, weights, predicate, indices = _get(
                    element, ("stream_id", "query_id", "t", "weights", "predicate", "indices"))
        except ValueError as exc:
            yield self._letter(Reason.MALFORMED, str(exc), None, element)
            return
        stream, bad = self._stream(stream, element)
        if bad is not None:
            yield bad
            return
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            yield self._letter(Reason.MALFORMED, "query_id must be a string or an integer", stream, element)
            return
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
            yield self._letter(Reason.MALFORMED, "t (the database size) must be an integer", stream, element)
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


# -- the stateful DoFn -------------------------------------------------------------------------
class GrowingDatabaseDoFn(beam.DoFn):
    """Input ``(stream, ("e", step, micros, index, original) | ("q", t, query_id, weights, original)
    | ("declare",))``. Main output: release rows; tagged ``snapshots`` and ``dead_letter``."""

    MECHANISM_STATE = ReadModifyWriteStateSpec("mechanism_state", BytesCoder())
    NEXT_STEP = ReadModifyWriteStateSpec("next_step", VarIntCoder())
    SIZE = ReadModifyWriteStateSpec("size", VarIntCoder())  # absorbed elements (public)
    ELEMENTS = BagStateSpec("elements", PickleCoder())
    QUERIES = BagStateSpec("queries", PickleCoder())
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)

    def __init__(self, params: GrowingDatabaseParams, per_step_timers: bool):
        self._params = params
        self._per_step_timers = per_step_timers

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._noise = self._params.noise_key.load()  # read on the worker, never pickled
        self._clock = self._params.clock
        namespace = f"beam_dp/{self._mechanism.name}"
        self._releases = Metrics.counter(namespace, "releases")
        self._dead = Metrics.counter(namespace, "dead_letters")

    def _timer_micros(self, next_step: int) -> int:
        step = next_step if self._per_step_timers else self._clock.last_step
        return self._clock.step_end_micros(step)

    def _letter(self, reason: str, detail: str, stream: str, original: Any):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(reason, detail, stream, original))

    def _rows(self, releases: list[Release]) -> Iterator:
        for release in releases:
            self._releases.inc()
            yield release_to_row(release, self._mechanism.guarantee)

    def process(
        self,
        element,
        mechanism_state=beam.DoFn.StateParam(MECHANISM_STATE),
        next_step_state=beam.DoFn.StateParam(NEXT_STEP),
        size_state=beam.DoFn.StateParam(SIZE),
        elements=beam.DoFn.StateParam(ELEMENTS),
        queries=beam.DoFn.StateParam(QUERIES),
        close=beam.DoFn.TimerParam(CLOSE),
    ) -> Iterator:
        stream, item = element
        next_step = next_step_state.read()
        if next_step is None:
            next_step = 1
            next_step_state.write(next_step)
            size_state.write(0)
            mechanism_state.write(self._mechanism.encode_state(self._mechanism.init_state(stream)))
            close.set(Timestamp(micros=self._timer_micros(next_step)))
        if item[0] == "e":
            _, step, micros, index, original = item
            if step < next_step:
                yield self._letter(Reason.LATE, f"step {step} was already absorbed", stream, original)
                return
            elements.add((step, micros, index))
        elif item[0] == "q":
            _, t, qid, weights, original = item
            if t < (size_state.read() or 0):
                yield self._letter(Reason.LATE, f"the database already has more than {t} elements", stream, original)
                return
            queries.add((t, qid, weights, original))

    @on_timer(CLOSE)
    def close_steps(
        self,
        fired=beam.DoFn.TimestampParam,
        key=beam.DoFn.KeyParam,
        mechanism_state=beam.DoFn.StateParam(MECHANISM_STATE),
        next_step_state=beam.DoFn.StateParam(NEXT_STEP),
        size_state=beam.DoFn.StateParam(SIZE),
        elements=beam.DoFn.StateParam(ELEMENTS),
        queries=beam.DoFn.StateParam(QUERIES),
        close=beam.DoFn.TimerParam(CLOSE),
    ) -> Iterator:
        clock, last = self._clock, self._clock.last_step
        next_step = next_step_state.read()
        upto = int(clock.step_of_micros(fired.micros)) - 1
        if last is not None:
            upto = min(upto, last)
        if upto < next_step:
            return
        by_step: dict[int, list] = {}
        keep_elements = []
        for step, micros, index in elements.read():
            if step <= upto:
                by_step.setdefault(step, []).append((micros, index))
            else:
                keep_elements.append((step, micros, index))
        pending = list(queries.read())  # (t, query_id, weights, original)
        state = self._mechanism.decode_state(mechanism_state.read())
        for step in range(next_step, upto + 1):
            block, pending, passed = plan_block(state.t, by_step.get(step, []), pending)
            for query in passed:  # process() refuses these already; defence in depth
                yield self._letter(Reason.LATE, f"size {query[0]} already passed", key, query[3])
            state, releases = self._mechanism.step(state, block, self._noise)
            yield from self._rows(releases)
        mechanism_state.write(self._mechanism.encode_state(state))
        next_step_state.write(upto + 1)
        size_state.write(state.t)
        if self._params.snapshots:
            snap = self._mechanism.snapshot(state)
            if snap is not None:
                yield beam.pvalue.TaggedOutput(SNAPSHOTS, release_to_row(snap, self._mechanism.guarantee))
        elements.clear()
        for item in keep_elements:
            elements.add(item)
        queries.clear()
        finished = last is not None and upto >= last
        for query in pending:
            if finished:
                yield self._letter(Reason.AFTER_END, f"the database never reached size {query[0]}", key, query[3])
            else:
                queries.add(query)
        if self._per_step_timers and not finished:
            close.set(Timestamp(micros=clock.step_end_micros(upto + 1)))


class GrowingDatabaseQueries(beam.PTransform):
    """Answer linear queries on growing databases with PMWG or a black-box scheduler (see module doc).

    Input: ``{"elements": pcoll, "queries": pcoll}`` or ``(elements, queries)``. Guarantee per element
    (substitution from its arrival on): ε-DP, or (ε, δ)-DP when ``delta > 0``, over the whole
    unbounded stream of answers; every release carries the worst element's ``epsilon_spent``.
    """

    def __init__(self, params: GrowingDatabaseParams, label: str | None = None):
        super().__init__(label)
        if not isinstance(params, GrowingDatabaseParams):
            raise TypeError("GrowingDatabaseQueries takes a GrowingDatabaseParams")
        self.params = params

    def expand(self, inputs) -> GrowingDatabaseOutputs:
        if isinstance(inputs, Mapping):
            elements, queries = inputs["elements"], inputs["queries"]
        else:
            elements, queries = inputs
        params = bind_noise_domain(self.params, elements)
        bounded = bool(getattr(elements, "is_bounded", True)) and bool(getattr(queries, "is_bounded", True))
        if bounded and params.clock.last_step is None:
            raise ValueError("a batch replay needs a public end: StepClock(..., end=...)")
        parsed_e = elements | "ParseElements" >> beam.ParDo(_ParseGrowing(params, "element")).with_outputs(
            DEAD_LETTER, main="ok")
        parsed_q = queries | "ParseQueries" >> beam.ParDo(_ParseGrowing(params, "query")).with_outputs(
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
        dead = (parsed_e[DEAD_LETTER], parsed_q[DEAD_LETTER], out[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return GrowingDatabaseOutputs(rows, snaps, dead)
