"""Every per-record family on Flink: the Beam family's params, parse stage and step policy in one keyed shell.

    from beam_dp.flink.families import family_event, family_stream
    events = env.from_collection([family_event(e) for e in examples], type_info=EVENT_TYPE)
    releases, snapshots, dead = family_stream(env, events, params, uid="models")

A family is its Beam params object and what the Beam shell builds from it (:data:`FAMILIES`): the parse
stage (the Beam family's own ``DoFn``, run here one bundle per Flink record: a record holds one raw
element, or a block of them) and the step driver with the family's policy (the Beam shell's
``make_driver``: the same policy, noise domain and binding). :class:`FamilyReleaseFunction` only moves
the driver's state and timers between Flink and the driver, as
:class:`~beam_dp.flink.job.ContinualReleaseFunction` does for the sums: the same release rows (JSON,
the labels of the Beam transform), dead letters (``stage`` "parse" for refused elements, "release"
for the driver's), snapshots (a growing database's, on their own side output), end rule and state coder.

The function is keyed by stream and parses inside the keyed operator, so the elements of one stream
keep their arrival order from one source at any parallelism (count steps are blocks in arrival order).
Marker steps (lifelong tasks) close by the element's ``END_OF_TASK`` marker, or all at the end of the
input (the watermark at +infinity). Params of another kind, or a clock whose start, period or grace is
not whole milliseconds (Flink timers), are refused when the job is built (``ValueError``). Params with a
``privacy_unit`` (``with_record_unit``) bound each unit's records first (:mod:`beam_dp.flink.record_units`:
one element per record, keyed by unit hash, the id dropped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from apache_beam.metrics.metricbase import Counter
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue
from pyflink.common import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import ListStateDescriptor

from beam_dp.beam.erm import (
    ContinualModelParams,
    MultiResolutionParams,
    ParseLabelledExamples,
    SlidingWindowModelParams,
)
from beam_dp.beam.growing_db import GrowingDatabaseDoFn, GrowingDatabaseParams, ParseGrowing
from beam_dp.beam.lifelong import LifelongDoFn, LifelongParams, ParseTaskRows
from beam_dp.beam.online import IncrementalRegressionParams, OnlineLearnerParams, ParseRecords
from beam_dp.beam.shell.blocks import BlockOriginals
from beam_dp.beam.shell.dofn import continual_driver
from beam_dp.beam.shell.domains import release_labels
from beam_dp.flink.domains import bind_noise_domain
from beam_dp.flink.job import (
    BYTES_TYPE,
    DEAD_LETTERS,
    DECLARE,
    EVENT_TYPE,
    STAMPED_TYPE,
    ContinualReleaseFunction,
    claimed_uids,
    dead_json,
    gated,
    restamped,
    to_event,
    watermarks,
)
from beam_dp.flink.params import check_timers
from beam_dp.flink.record_units import QUERIES, bound_unit_records
from beam_dp.steps.coder import decode_entry, encode_entry
from beam_dp.steps.driver import RELEASE, SNAPSHOTS, Output, StepDriver
from beam_dp.steps.events import DEAD_LETTER

__all__ = ["FAMILIES", "SNAPSHOT_ROWS", "Elements", "Family", "FamilyReleaseFunction", "block_record", "family_event",
           "family_of", "family_stream", "stream_of"]

SNAPSHOT_ROWS = OutputTag(SNAPSHOTS, Types.STRING())  # a growing database's snapshots (JSON release rows)


class Elements(NamedTuple):
    """One Flink record's raw elements (of input ``kind``: ``"elements"``, or a growing database's
    ``"queries"``), parsed as one bundle of the Beam family's parse stage."""

    kind: str
    elements: tuple


@dataclass(frozen=True)
class Family:
    """What the Beam shell of a family builds from its params: ``parse(params, kind)`` its parse ``DoFn``
    (``kind``: the input), ``driver(params)`` its step driver (policy, noise, binding); ``items`` how the
    parse stage's ``(stream, item)`` reach the driver (``"blocks"``: ``(step | None, block, original)``;
    ``"growing"``: ``("b", step, micros, indices, originals)`` / ``("q", t, query_id, weights, element)``;
    ``"tasks"``: ``(task index, x | None, y, original)``, ``x`` None a task's end marker)."""

    parse: Callable[[Any, str], Any]
    driver: Callable[[Any], StepDriver]
    items: str
    composition: Callable[[Any], str | None] = lambda params: None


def _records(params: Any, kind: str) -> Any:
    return ParseRecords(params)


def _examples(params: Any, kind: str) -> Any:
    return ParseLabelledExamples(params)


_BLOCKS = Family(_records, continual_driver, "blocks")
_ERM = Family(_examples, continual_driver, "blocks")

#: params class -> its family (the sums go through :func:`beam_dp.flink.job.release_stream`)
FAMILIES: dict[type, Family] = {
    OnlineLearnerParams: _BLOCKS,
    IncrementalRegressionParams: _BLOCKS,
    MultiResolutionParams: _ERM,
    ContinualModelParams: _ERM,
    SlidingWindowModelParams: _ERM,
    GrowingDatabaseParams: Family(lambda params, kind: ParseGrowing(params, "query" if kind == QUERIES else "element"),
                                  lambda params: GrowingDatabaseDoFn(params, per_step_timers=False).make_driver(),
                                  "growing"),
    LifelongParams: Family(lambda params, kind: ParseTaskRows(params),
                           lambda params: LifelongDoFn(params, per_step_timers=False).make_driver(), "tasks",
                           lambda params: params.composition),
}


def family_of(params: Any) -> Family:
    """The family of ``params``; params of another kind, or a schedule Flink timers cannot keep, are refused."""
    family = FAMILIES.get(type(params))
    if family is None:
        raise ValueError(f"Flink runs no family of {type(params).__name__}: give one of "
                         f"{', '.join(sorted(t.__name__ for t in FAMILIES))} (the sums: beam_dp.flink.job.release_stream)")
    check_timers(params)
    return family


def stream_of(element: Any) -> str:
    """The stream id of a raw element (a tuple's first field, a mapping's or a row's ``stream_id``): its
    Flink key; "" when it has none (the parse stage dead-letters it)."""
    if isinstance(element, tuple) and not hasattr(element, "_fields"):
        stream = element[0] if element else None
    elif isinstance(element, dict):
        stream = element.get("stream_id")
    else:
        stream = getattr(element, "stream_id", None)
    return stream if isinstance(stream, str) else ""


def family_event(element: Any, seconds: float = 0.0, kind: str = "elements") -> tuple:
    """A record of :data:`~beam_dp.flink.job.EVENT_TYPE` holding one raw element of the family (as the Beam
    transform takes it) for ``env.from_collection``; ``seconds``: its event time (event-time steps in
    streaming; a replay ignores it)."""
    return to_event(stream_of(element), seconds, Elements(kind, (element,)))


def block_record(stream: str, elements: list, seconds: float = 0.0, kind: str = "elements") -> tuple:
    """A block of raw elements of one ``stream`` as one record of a Python operator upstream (a file's rows
    of one stream: one parse bundle; the payload plain, as Python operators emit it)."""
    return stream, float(seconds), Elements(kind, tuple(elements))


class _EntryList:
    """The driver's :class:`~beam_dp.steps.driver.Buffer` over a Flink ``ListState`` of entry bytes (the
    Beam shell's bag: entries kept as they come, in arrival order). ``counts``: the function's metrics
    (``buffered_items``: entries held)."""

    def __init__(self, state, counts) -> None:
        self._state, self._counts, self._read = state, counts, 0

    def add(self, entry: tuple[int, Any]) -> None:
        self._state.add(encode_entry(*entry))
        self._counts.add("buffered_items")

    def read(self) -> list[tuple[int, Any]]:
        entries = [decode_entry(bytes(data)) for data in (self._state.get() or ())]
        self._read = len(entries)
        return entries

    def clear(self) -> None:
        self._state.clear()
        self._counts.add("buffered_items", -self._read)
        self._read = 0


class _Count:
    """A Beam counter of the parse stage, counted in the function's ``beam_dp`` metrics (PyFlink's harness
    would report a Beam metric under a namespace Flink cannot parse); its ``dead_letters`` are counted
    per reason where they are emitted."""

    def __init__(self, counts, name: str) -> None:
        self._counts, self._name = counts, name

    def inc(self, n: int = 1) -> None:
        if self._name != "dead_letters":
            self._counts.add(self._name, n)

    def dec(self, n: int = 1) -> None:
        self.inc(-n)


class FamilyReleaseFunction(ContinualReleaseFunction):
    """Keyed by stream: parses each record's elements with the family's parse stage and moves the driver's
    state and timers (those of :class:`~beam_dp.flink.job.ContinualReleaseFunction`), nothing else.

    Args:
        params: a Beam params object of a family in :data:`FAMILIES`, its noise domain bound.
        provisional: streaming: a key opened before any watermark waits for its first timer.
        stamp: emit ``Row(release_ms, text)`` for :func:`family_stream` to stamp (event-time steps).
    """

    def __init__(self, params: Any, provisional: bool = False, stamp: bool = True):
        super().__init__(params, provisional, stamp)
        self._family = family_of(params)

    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)
        self._labels = release_labels(self._params, self._family.composition(self._params))  # the Beam transform's
        self._parsers: dict[str, Any] = {}

    def _make_driver(self) -> StepDriver:
        driver = self._family.driver(self._params)  # the Beam shell's: the family's policy, noise and binding
        self._mechanism, self._grouped = driver.policy.mechanism, False
        return driver

    def _make_buffer(self, runtime_context: RuntimeContext) -> "_EntryList":
        entries = runtime_context.get_list_state(ListStateDescriptor("beam_dp_entries", BYTES_TYPE))
        return _EntryList(entries, self._counts)

    def _timer(self, ctx, state) -> None:
        if self._driver.clock is None and self._driver.block_size is None:  # marker steps: the end of the input
            if not state.ended:
                ctx.timer_service().register_event_time_timer(2 ** 63 - 1)
            return
        super()._timer(ctx, state)

    def _emit(self, outputs: list[Output]) -> Iterator:
        """Release rows and dead letters as the sums' shell emits them (a block's letter: one per element of
        the block, as on Beam); snapshots to :data:`SNAPSHOT_ROWS`."""
        for tag, value in outputs:
            if tag == SNAPSHOTS:
                yield SNAPSHOT_ROWS, json.dumps(self._labels(value)._asdict(), sort_keys=True)
            elif tag == DEAD_LETTER and isinstance(value.element, BlockOriginals):
                yield from super()._emit([Output(DEAD_LETTER, letter) for letter in value.element.letters(value)])
            else:
                yield from super()._emit([Output(tag, value)])

    def _parser(self, kind: str) -> Any:
        parser = self._parsers.get(kind)
        if parser is None:
            parser = self._parsers[kind] = self._family.parse(self._params, kind)
            parser.setup()
            for name, metric in list(vars(parser).items()):  # Beam counters (elements, clipped_*) -> this function's
                if isinstance(metric, Counter):
                    setattr(parser, name, _Count(self._counts, metric.metric_name.name))
        return parser

    def _parse(self, records: Elements) -> Iterator[tuple[str, Any]]:
        """One bundle of the Beam parse stage: ``(tag, value)`` (``RELEASE``: a ``(stream, item)`` for the driver)."""
        parser, window = self._parser(records.kind), GlobalWindow()
        parser.start_bundle()
        outputs = [out for element in records.elements for out in parser.process(element, None, window)]
        outputs += list(parser.finish_bundle() or ())
        for out in outputs:
            if isinstance(out, WindowedValue):
                out = out.value
            if isinstance(out, TaggedOutput):
                value = out.value.value if isinstance(out.value, WindowedValue) else out.value
                yield out.tag, value
            else:
                yield RELEASE, out

    def _process(self, value, ctx) -> Iterator:
        stream, _, payload = value
        if payload == DECLARE:
            if isinstance(stream, str) and stream:
                self._declare(self._state(stream, ctx), ctx)
            return
        for tag, out in self._parse(payload):
            if tag != RELEASE:
                letters = out.element.letters(out) if isinstance(out.element, BlockOriginals) else [out]
                for letter in letters:
                    self._counts.letter(letter.reason)
                    yield DEAD_LETTERS, dead_json(letter, "parse")
                continue
            yield from self._feed(ctx, *out)

    def _feed(self, ctx, stream: str, item: tuple) -> Iterator:
        """One parsed item to the driver, as the Beam family's shell hands it over."""
        items = self._family.items
        if items == "growing":
            if item[0] == "b":
                _, step, micros, index, original = item
                yield from self._add(ctx, stream, step, (micros, index), original, None)
            elif item[0] == "q":
                _, t, qid, weights, _ = item
                state = self._state(stream, ctx)
                lowest = state.lowest
                self._driver.carry(state, self._buffer, (t, qid, weights))
                if state.lowest != lowest:
                    self._store(state, False)
            return
        if items == "tasks":
            index, x, y, original = item
            if x is None:  # END_OF_TASK: close the task (and every earlier open one) now
                state = self._state(stream, ctx, True)
                outputs = self._driver.close_marked(state, self._buffer, index + 1, original)
                self._store(state, True)
                yield from self._emit(outputs)
                return
            from beam_dp.mechanisms.lifelong.config import TaskData

            yield from self._add(ctx, stream, index + 1, TaskData(self._params.learner.task_ids[index], x, y),
                                 original, None)
            return
        step, block, original = item
        yield from self._add(ctx, stream, step, block, original, None)


def family_stream(env, events, params: Any, *, uid: str | None = None, max_delay_ms: int = 0,
                  idle_ms: int | None = None, stamp: bool = True):
    """``events`` (a DataStream of :data:`~beam_dp.flink.job.EVENT_TYPE` records of :func:`family_event` /
    :func:`block_record`) -> ``(releases, snapshots, dead_letters)``, JSON strings; ``params`` a Beam
    params object of a family in :data:`FAMILIES` (refused otherwise). ``uid``, the watermarks and
    ``stamp`` as for :func:`beam_dp.flink.job.release_stream`: ``uid`` names the function's noise domain
    unless ``params.noise_key.domain`` is set."""
    family_of(params)
    params, operator = bind_noise_domain(params, uid, claimed_uids(env))
    unit_dead = None
    if params.privacy_unit is not None:  # at most max_records records per unit, the id hashed and dropped
        events, unit_dead = bound_unit_records(events, params, operator)
    clock = getattr(params, "clock", None)
    if clock is not None:
        events = events.assign_timestamps_and_watermarks(watermarks(max_delay_ms, idle_ms))
    if params.streams:
        markers = env.from_collection([to_event(s, clock.start if clock is not None else 0.0, None)
                                       for s in params.streams], type_info=EVENT_TYPE)
        if clock is not None:
            markers = markers.assign_timestamps_and_watermarks(watermarks(0, idle_ms))
        events = events.union(markers)
    streaming = env.get_config().get_auto_watermark_interval() > 0
    if streaming and clock is not None:
        events = gated(env, events, params, operator, idle_ms)
    stamped = stamp and clock is not None
    releases = (events
                .key_by(lambda event: event[0] if isinstance(event[0], str) else "", key_type=Types.STRING())
                .process(FamilyReleaseFunction(params, provisional=streaming, stamp=stamped),
                         output_type=STAMPED_TYPE if stamped else Types.STRING())
                .uid(operator).name(uid or params.noise_key.domain))
    snapshots, dead = releases.get_side_output(SNAPSHOT_ROWS), releases.get_side_output(DEAD_LETTERS)
    dead = dead if unit_dead is None else dead.union(unit_dead)
    return (restamped(env, releases) if stamped else releases), snapshots, dead

