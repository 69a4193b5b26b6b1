"""The PyFlink job: a ``KeyedProcessFunction`` shell over the one step driver (:mod:`beam_dp.steps.driver`).

    from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream, to_event
    env = local_environment(parallelism=2)
    releases, dead = release_stream(env, env.from_collection(events, type_info=EVENT_TYPE), params, uid="sums")

``events`` are ``(stream_id, timestamp seconds, value)``, or for a file replay the block records of
:func:`block_events` (a :class:`~beam_dp.flink.blocks.StepBlock`: the clipped sums of one key and step,
added to the step's state as one contribution would be); ``params`` a
:class:`~beam_dp.flink.params.FlinkReleaseParams` (or a Beam params object of the continual sums);
``uid`` names the release function and its noise domain (:mod:`beam_dp.flink.domains`).
With ``params.stream_groups`` the function is keyed by groups of streams
(:mod:`beam_dp.mechanisms.stream_groups`: the same public hash, join rule and releases as on Beam), each
group's Flink key placing it on its own subtask where the parallelism allows
(:func:`~beam_dp.flink.blocks.group_keys`; a savepoint keyed otherwise is refused, :data:`GROUPED_UID`).
``releases`` is a DataStream of release rows as JSON (the columns of ``beam_dp.io.ReleaseRow``),
``dead`` the dead-letter side output (JSON ``stage``, ``reason``, ``detail``, ``stream``, ``source``, ``element``).
With a clock every release record of step ``s`` has the Flink record timestamp
``StepDriver.release_time(s) // 1000`` (ms, exact: the step start, period and grace are whole ms),
``end(s) + allowed_lateness``, whichever firing closed the step (docs/steps.md rule 9), and the
watermarks flow on, so a downstream event-time window per step keeps each release (docs/running.md,
"Windowing releases").

Per key the function keeps the driver's state in Flink keyed state, checkpointed with the job: two
``ValueState`` s of the driver's versioned bytes (the key's step bookkeeping, read for every element,
and the mechanism's state, read only where steps close) and a ``MapState`` of one merged block per
open step (pre-aggregated per (stream, step) as it arrives: sums, not events). The
driver gets Flink's exact watermark: one timer firing closes every step the watermark has passed,
and the watermark at +infinity (end of a bounded input, ``flink stop --drain``) applies the driver's
end rule. A Flink watermark ``W`` (ms) means no more records with timestamp ``<= W``; the driver's
watermarks are Beam's (no more records ``< W``, µs): ``(W + 1) * 1000``. In streaming the events first
pass the watermark gate (:func:`gated`, :mod:`beam_dp.flink.gate`), so a key first seen after a restore
opens at the watermark proven before it.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import Any, Iterator

import numpy as np
from pyflink.common import Configuration, Duration, Row, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import OutputTag, RuntimeExecutionMode, StreamExecutionEnvironment
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor
from pyflink.table import DataTypes, Schema, StreamTableEnvironment

from beam_dp.core.budget import composition_of
from beam_dp.flink.blocks import BlockParser, StepBlock, group_keys, read_split
from beam_dp.flink.domains import bind_noise_domain
from beam_dp.flink.gate import (
    GATE_BUCKETS,
    MAX_WATERMARK,
    MIN_WATERMARK,
    Gated,
    GateSeed,
    WatermarkGateFunction,
    gate_bucket,
)
from beam_dp.flink.params import FlinkReleaseParams
from beam_dp.flink.rows import json_rows
from beam_dp.mechanisms.base import ContinualSumMechanism
from beam_dp.mechanisms.stream_groups import GroupBlock, GroupedSum, group_of
from beam_dp.steps.coder import (
    KeyState,
    UnreadableState,
    decode_entry,
    decode_key_state,
    encode_entry,
    encode_key_state,
)
from beam_dp.steps.driver import RELEASE, Output, StepDriver, release_step
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, parse_contribution
from beam_dp.steps.params import StepParams, legacy_noise_of, noise_source_of
from beam_dp.steps.policies import BlockPolicy, GroupPolicy
from beam_dp.steps.schema import ReleaseLabels

__all__ = ["BYTES_TYPE", "DEAD_LETTERS", "DECLARE", "EVENT_TYPE", "GROUPED_UID", "STAMPED_TYPE",
           "ContinualReleaseFunction", "block_events", "check_sums", "claimed_uids", "dead_json", "gated",
           "local_environment", "release_stream", "restamped", "to_event"]

EVENT_TYPE = Types.TUPLE([Types.STRING(), Types.DOUBLE(), Types.PICKLED_BYTE_ARRAY()])
DEAD_LETTERS = OutputTag(DEAD_LETTER, Types.STRING())
BYTES_TYPE = Types.PRIMITIVE_ARRAY(Types.BYTE())
DECLARE = "beam_dp:declare-stream"  # Flink cannot carry a null value: the marker of a declared stream
_NO_BYTES = np.zeros(0, dtype=np.uint8)
STAMPED_TYPE = Types.ROW_NAMED(["release_ms", "row"], [Types.LONG(), Types.STRING()])  # a release and its time
#: the operator uid suffix of a release function keyed by stream groups (:func:`~beam_dp.flink.blocks.group_keys`).
#: A savepoint of a job that keyed its groups by the bare ``group_key`` holds their state under other keys:
#: resumed, the groups would restart from nothing and release their steps again with the same noise. Under
#: its own uid Flink refuses that savepoint at start (its state maps to no operator of the job).
GROUPED_UID = "/spread"


class _Counts:
    """An operator's metrics in its ``beam_dp`` group (the Beam shell's names, docs/running.md), each a
    count kept here and read by a gauge. PyFlink reports a counter only when it changes while an element
    is processed (its timer path runs outside the operation's metrics scope, so what ``on_timer``
    counted never reached Flink), but reads every gauge when a bundle finishes, whatever changed it.
    A reason's dead letters are the metric ``dead_letters_<reason>`` beside ``dead_letters`` (a group of
    that name would collide with the metric; Flink's metric names turn dots into underscores). Per
    subtask, counted from its (re)start."""

    def __init__(self, metrics, names: tuple[str, ...]) -> None:
        self._metrics, self._values = metrics, {}
        for name in names:
            self._gauge(name)

    def _gauge(self, name: str) -> None:
        self._values[name] = 0
        self._metrics.gauge(name, lambda: self._values[name])

    def add(self, name: str, n: int = 1) -> None:
        if name not in self._values:
            self._gauge(name)
        self._values[name] += n

    def set(self, name: str, value: int) -> None:
        self._values[name] = value

    def letter(self, reason: str) -> None:
        self.add("dead_letters")
        self.add(f"dead_letters_{reason}")


class _StepSums:
    """The driver's :class:`~beam_dp.steps.driver.Buffer` over a Flink ``MapState`` of step -> one merged
    item (entry bytes): each item added to a step is merged into that step's item (``merge``: the
    mechanism's ``merge_blocks``: clipped sums and counts), so state per open step holds sums, O(d) per
    stream with data, not one entry per event. ``counts``: its ``buffered_items`` (entries held)."""

    def __init__(self, state, merge, counts: _Counts) -> None:
        self._state, self._merge, self._counts, self._read = state, merge, counts, 0

    def add(self, entry: tuple[int, Any]) -> None:
        step, item = entry
        held = self._state.get(step)
        if held is not None:
            item = self._merge([decode_entry(bytes(held))[1], item])
        else:
            self._counts.add("buffered_items")
        self._state.put(step, encode_entry(step, item))

    def read(self) -> list[tuple[int, Any]]:
        entries = [decode_entry(bytes(data)) for data in self._state.values()]
        self._read = len(entries)  # the driver reads before it clears: what a clear removes
        return entries

    def clear(self) -> None:
        self._state.clear()
        self._counts.add("buffered_items", -self._read)
        self._read = 0


def dead_json(letter: DeadLetter, stage: str) -> str:
    """One dead letter as the Beam jobs write it (``DeadLetter.to_json``): ``stage`` ("parse": a line or
    event refused; "release": the keyed function's late, unclosed or ended-stream letters)."""
    return json.dumps(letter.to_json(stage), allow_nan=False)


class ContinualReleaseFunction(KeyedProcessFunction):
    """Keyed by stream (or group of streams); moves state and timers between Flink and the driver, nothing else."""

    def __init__(self, params: Any, provisional: bool = False, stamp: bool = True):
        self._params = params
        self._provisional = provisional  # streaming: a key opened before any watermark waits for its first timer
        self._stamp = stamp  # emit Row(release_ms, text) for release_stream to stamp (with a clock)

    def open(self, runtime_context: RuntimeContext) -> None:
        params = self._params
        self._driver = self._make_driver()
        unit = getattr(params, "unit_declaration", None)  # unit-level sums declare their unit in every row
        self._labels = ReleaseLabels(params.noise_key.domain, composition_of(self._mechanism), params.budget,
                                     tuple(sorted(unit().items())) if unit else ())
        self._streams = frozenset(params.streams) if params.streams is not None else None
        self._step_records = getattr(params, "step_records", False)
        self._key = runtime_context.get_state(ValueStateDescriptor("beam_dp_key_state", BYTES_TYPE))
        self._mechanism_state = runtime_context.get_state(ValueStateDescriptor("beam_dp_mechanism", BYTES_TYPE))
        # last_closed_step: the last step a firing closed; its lag: the wall clock then minus its release time (ms)
        self._counts = _Counts(runtime_context.get_metrics_group().add_group("beam_dp"), (
            "releases", "dead_letters", "buffered_items", "timer_firings", "unreadable_states", "last_closed_step",
            "last_closed_step_lag_ms"))
        self._buffer = self._make_buffer(runtime_context)
        self._gate = MIN_WATERMARK  # the watermark (ms) the element in hand's gate bucket proved (beam_dp.flink.gate)

    def _make_driver(self) -> StepDriver:
        """The step driver and its policy (the sums': blocks, or groups of streams); sets ``_mechanism``
        and ``_grouped``. A family's function (:mod:`beam_dp.flink.families`) builds its own."""
        params = self._params
        self._mechanism = params.build_mechanism()
        self._grouped = getattr(params, "stream_groups", None) is not None
        noise = noise_source_of(params)
        policy = GroupPolicy(GroupedSum(self._mechanism), noise) if self._grouped else BlockPolicy(self._mechanism, noise)
        driver = StepDriver.for_params(params, policy)
        driver.legacy_noise = legacy_noise_of(params)  # keys written before the binding
        return driver

    def _make_buffer(self, runtime_context: RuntimeContext):
        """The driver's buffer: the sums' one merged block per open step."""
        sums = runtime_context.get_map_state(MapStateDescriptor("beam_dp_step_sums", Types.LONG(), BYTES_TYPE))
        return _StepSums(sums, self._driver.policy.mechanism.merge_blocks, self._counts)

    def _emit(self, outputs: list[Output]) -> Iterator:
        """Release rows as JSON text: one record per row, or with ``params.step_records`` one record per
        release (a key's step: all its rows joined by newlines); with a clock each record is
        ``Row(release_ms, text)``, stamped downstream (:func:`release_stream`); dead letters to the side output."""
        for tag, value in outputs:
            if tag != RELEASE:
                self._counts.letter(value.reason)
                yield DEAD_LETTERS, dead_json(value, "release")
                continue
            rows = json_rows(value, self._labels)
            self._counts.add("releases", len(rows))
            if self._step_records:
                rows = ["\n".join(rows)] if rows else []
            when = self._driver.release_time(release_step(value)) if self._stamp else None
            yield from rows if when is None else (Row(when // 1000, row) for row in rows)

    def _ended_unreadable(self, key: str, exc: UnreadableState) -> Iterator:
        """A key whose state this version cannot read ends (as on Beam, :meth:`StepDriver.unreadable`): one
        ``unreadable_state`` dead letter and the metric, never a failure that Flink would retry forever."""
        self._counts.add("unreadable_states")
        state, outputs = self._driver.unreadable(key, self._buffer, str(exc))
        self._store(state, True)
        yield from self._emit(outputs)

    def _engine_key(self, ctx) -> str:
        """The key the driver keeps: a stream, or a group's ``group_key`` (its Flink key without the salt
        that places it, :func:`~beam_dp.flink.blocks.group_keys`)."""
        key = ctx.get_current_key()
        return key.split("/", 1)[0] if self._grouped else key

    def _timer(self, ctx, state) -> None:
        timer = self._driver.timer(state)
        if timer is not None:
            ctx.timer_service().register_event_time_timer(-(-timer // 1000) - 1)

    # The key's driver state lives in two values: the small rest (read for every element) and the
    # mechanism's state (read only where steps close or count steps complete: it grows with a group).
    def _load(self, mechanism: bool) -> KeyState | None:
        data = self._key.value()
        if data is None:
            return None
        state = decode_key_state(bytes(data), self._driver.binding)
        if mechanism:
            state.mechanism = np.frombuffer(bytes(self._mechanism_state.value()), dtype=np.uint8).copy()
        return state

    def _store(self, state: KeyState, mechanism: bool) -> None:
        held = state.mechanism
        state.mechanism = _NO_BYTES
        self._key.update(encode_key_state(state))
        state.mechanism = held
        if mechanism:
            self._mechanism_state.update(np.asarray(held, dtype=np.uint8).tobytes())

    def _state(self, key: str, ctx, mechanism: bool = False) -> KeyState:
        """The key's driver state; a key seen for the first time opens at Flink's current watermark, or the
        higher one its gate bucket proved (kept across a restore: :mod:`beam_dp.flink.gate`). With neither
        (a job just started: Flink's watermark is not checkpointed) a streaming key opens provisionally, as
        on Beam: at the lowest step of its items until its first timer fires."""
        state = self._load(mechanism)
        if state is not None:
            return state
        watermark = max(ctx.timer_service().current_watermark(), self._gate)
        if watermark == MIN_WATERMARK and self._provisional:
            state = self._driver.open(key, provisional=True)
        else:
            state = self._driver.open(key, None if watermark == MIN_WATERMARK else (watermark + 1) * 1000)
        self._store(state, True)
        self._timer(ctx, state)
        return state

    def _declare(self, state: KeyState, ctx) -> None:
        """A declared stream (or a group with one) releases from step 1: fixes a provisional key there."""
        if state.provisional:
            self._driver.declare(state)
            self._store(state, False)
            self._timer(ctx, state)

    def process_element(self, value, ctx: KeyedProcessFunction.Context):
        stream, seconds, payload = value
        self._gate = MIN_WATERMARK
        if isinstance(payload, Gated):
            self._gate, value = payload.watermark, (stream, seconds, payload.payload)
        try:
            outputs = list(self._process(value, ctx))
        except UnreadableState as exc:
            outputs = list(self._ended_unreadable(self._engine_key(ctx), exc))
        yield from outputs

    def _process(self, value, ctx) -> Iterator:
        stream, seconds, payload = value
        if isinstance(payload, StepBlock):  # a file replay's block: the clipped sums of one key and step
            yield from self._add(ctx, stream, payload.step, payload.block, None, None)
            return
        if payload == DECLARE:
            if not (isinstance(stream, str) and stream):
                return
            if self._grouped:  # a group learns its declared streams as carried items
                state = self._state(self._engine_key(ctx), ctx)
                self._declare(state, ctx)
                lowest = state.lowest
                self._driver.carry(state, self._buffer, GroupBlock.declaring([stream], self._mechanism.dim))
                if state.lowest != lowest:
                    self._store(state, False)
            else:
                self._declare(self._state(stream, ctx), ctx)
            return
        parsed = parse_contribution((stream, seconds, payload), self._mechanism, self._driver.clock, self._streams)
        if isinstance(parsed, DeadLetter):
            self._counts.letter(parsed.reason)
            yield DEAD_LETTERS, dead_json(parsed, "parse")
            return
        stream, step, block = parsed
        if self._grouped:
            block = GroupBlock((stream,), block.vector[None, :], np.array([block.count]), np.array([block.clipped]))
        yield from self._add(ctx, stream, step, block, (stream, seconds, payload), stream)

    def _add(self, ctx, stream: str, step: int, block: Any, original: Any, letter_key: str | None) -> Iterator:
        """Adds one block (an event's, or a file replay's per key and step) to the key's step ``step``;
        ``letter_key``: the key of a dead letter (a stream; None: the engine key)."""
        counted = self._driver.block_size is not None  # a count step may close here: it needs the mechanism
        state = self._state(self._engine_key(ctx) if self._grouped else stream, ctx, counted)
        lowest, first = state.lowest, state.next_step
        outputs = self._driver.add(state, self._buffer, step, block, original, letter_key)
        if counted or state.lowest != lowest or state.next_step != first:  # else nothing but the buffer changed
            self._store(state, counted)
        if state.provisional and state.next_step != first:  # a provisional key placed lower: its timer follows
            self._timer(ctx, state)
        yield from self._emit(outputs)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        self._counts.add("timer_firings")
        try:
            state = self._load(True)
            first = state.next_step
            watermark = ctx.timer_service().current_watermark()
            if watermark >= MAX_WATERMARK:
                outputs = self._driver.finish(state, self._buffer)
            else:
                outputs = self._driver.advance(state, self._buffer, (max(watermark, timestamp) + 1) * 1000)
                self._timer(ctx, state)
        except UnreadableState as exc:
            yield from self._ended_unreadable(self._engine_key(ctx), exc)
            return
        self._store(state, True)
        if state.next_step > first:
            self._closed(state.next_step - 1)
        yield from self._emit(outputs)

    def _closed(self, step: int) -> None:
        when = self._driver.release_time(step)
        self._counts.set("last_closed_step", step)
        self._counts.set("last_closed_step_lag_ms", 0 if when is None else int(time.time() * 1000 - when / 1000))


class _ParseBlocks(ProcessFunction):
    """A file split ``(path, start, end)`` -> block records of :data:`EVENT_TYPE` (one per key and step,
    :class:`~beam_dp.flink.blocks.BlockParser`) and the dead letters of its rejected lines."""

    def __init__(self, params: Any):
        self._params = params

    def open(self, runtime_context: RuntimeContext) -> None:
        params = self._params
        streams = frozenset(params.streams) if params.streams is not None else None
        self._parser = BlockParser(params.build_mechanism(), params.clock, streams,
                                   getattr(params, "stream_groups", None))
        self._counts = _Counts(runtime_context.get_metrics_group().add_group("beam_dp"), ("dead_letters",))

    def process_element(self, value, ctx: ProcessFunction.Context):
        records, letters = self._parser.parse(read_split(*value))
        for letter in letters:
            self._counts.letter(letter.reason)
            yield DEAD_LETTERS, dead_json(letter, "parse")
        yield from records


def block_events(env: StreamExecutionEnvironment, splits: list[tuple[str, int, int]], params: Any):
    """A bounded file replay as blocks: ``splits`` (:func:`beam_dp.flink.blocks.file_splits`: files on a
    filesystem every worker reads) -> ``(events, dead_letters)``: ``events`` a DataStream of
    :data:`EVENT_TYPE` block records for :func:`release_stream` (one per key and step of each split),
    ``dead_letters`` the JSON dead letters of the rejected lines (each with its raw line)."""
    source = env.from_collection(splits, type_info=Types.TUPLE([Types.STRING(), Types.LONG(), Types.LONG()]))
    events = source.rebalance().process(_ParseBlocks(params), output_type=EVENT_TYPE).name("parse-blocks")
    return events, events.get_side_output(DEAD_LETTERS)


class _EventTime(TimestampAssigner):
    """Record timestamp in ms from the event's seconds (0 for an unusable one; it is dead-lettered)."""

    def extract_timestamp(self, value, record_timestamp) -> int:
        seconds = value[1]
        if isinstance(seconds, float) and seconds == seconds and abs(seconds) < 1e13:
            return int(seconds * 1000)
        return 0


def local_environment(parallelism: int = 1, replay: bool = True,
                      settings: dict[str, str] | None = None) -> StreamExecutionEnvironment:
    """A local MiniCluster (STREAMING mode) whose Python workers use this interpreter and see ``PYTHONPATH``
    (under ``flink run``: the cluster's environment, with the same settings). ``settings``: more Flink
    configuration (e.g. :func:`beam_dp.flink.run.checkpoint_settings`).

    ``replay``: a bounded replay: no periodic watermarks, so the first watermark is +infinity at the
    end of the input and the driver's end rule releases the whole public schedule (as a Beam batch
    replay does). Otherwise watermarks follow the events every 200 ms. (Flink's BATCH mode is not
    used: its keyed state follows one key at a time, which a Python keyed function does not honour.)"""
    config = Configuration()
    config.set_string("python.executable", sys.executable)  # else the workers use the system python
    config.set_string("python.client.executable", sys.executable)
    if os.environ.get("PYTHONPATH"):
        config.set_string("python.pythonpath", os.environ["PYTHONPATH"])
    for name, value in (settings or {}).items():
        config.set_string(name, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    env.get_config().set_auto_watermark_interval(0 if replay else 200)
    return env


def watermarks(max_delay_ms: int = 0, idle_ms: int | None = None) -> WatermarkStrategy:
    """Event-time watermarks from the events' seconds: monotonous, or bounded out-of-orderness
    (``max_delay_ms``); ``idle_ms`` marks a silent source split idle so it does not hold the watermark."""
    strategy = (WatermarkStrategy.for_monotonous_timestamps() if max_delay_ms == 0
                else WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(max_delay_ms)))
    if idle_ms:
        strategy = strategy.with_idleness(Duration.of_millis(idle_ms))
    return strategy.with_timestamp_assigner(_EventTime())


def release_stream(env: StreamExecutionEnvironment, events, params: Any, *, uid: str | None = None,
                   max_delay_ms: int = 0, idle_ms: int | None = None, stamp: bool = True, units: bool = False):
    """``events`` (a DataStream of :data:`EVENT_TYPE`) -> ``(releases, dead_letters)``, JSON strings.

    With a clock each release record of step s carries the Flink timestamp ``end(s) + allowed_lateness``
    (ms; :func:`restamped`); ``stamp=False`` skips that for a sink that never reads record timestamps
    (a ``FileSink`` of text), saving the Table planner's start and a map per record.

    ``uid`` names this release function in the job: its noise domain unless ``params.noise_key.domain``
    is set (one of them is required), and, as ``beam_dp/<domain>`` (keyed by stream groups:
    ``beam_dp/<domain>/spread``, :data:`GROUPED_UID`), its Flink operator uid. A domain
    already claimed by a release function of this job is refused (``ValueError``;
    :mod:`beam_dp.flink.domains`), as are params of anything but continual sums (:func:`check_sums`).
    Unit-level params go through :func:`beam_dp.flink.units.unit_release_stream`, whose unit stage feeds
    this function its blocks, timestamped already (``units=True``)."""
    check_sums(params)
    if (getattr(params, "privacy_unit", None) is not None) != units:
        raise ValueError("unit-level params run through beam_dp.flink.units.unit_release_stream" if not units
                         else "units=True takes unit-level params")
    params, operator = bind_noise_domain(params, uid, claimed_uids(env))
    if params.clock is not None and not units:
        events = events.assign_timestamps_and_watermarks(watermarks(max_delay_ms, idle_ms))
    if params.streams:
        start = params.clock.start if params.clock is not None else 0.0
        markers = env.from_collection([to_event(s, start, None) for s in params.streams], type_info=EVENT_TYPE)
        if params.clock is not None:
            markers = markers.assign_timestamps_and_watermarks(watermarks(0, idle_ms))
        events = events.union(markers)
    streaming = env.get_config().get_auto_watermark_interval() > 0  # else a replay: new keys start at step 1
    if streaming and params.clock is not None:
        events = gated(env, events, params, operator, idle_ms)
    groups = getattr(params, "stream_groups", None)
    keys = group_keys(groups) if groups is not None else ()  # spread over the subtasks at any parallelism

    def key(event) -> str:
        stream = event[0] if isinstance(event[0], str) else ""
        return keys[group_of(stream, groups)] if groups is not None else stream

    stamped = stamp and params.clock is not None
    releases = (events
                .key_by(key, key_type=Types.STRING())
                .process(ContinualReleaseFunction(params, provisional=streaming, stamp=stamped),
                         output_type=STAMPED_TYPE if stamped else Types.STRING())
                .uid(operator + GROUPED_UID if groups is not None else operator).name(uid or params.noise_key.domain))
    dead = releases.get_side_output(DEAD_LETTERS)
    return (restamped(env, releases) if stamped else releases), dead


def gated(env: StreamExecutionEnvironment, events, params: Any, operator: str, idle_ms: int | None = None):
    """``events`` (timestamped) through the watermark gate of a streaming release function (operator uid
    ``operator``; :mod:`beam_dp.flink.gate`): every bucket seeded at the clock's start, each event
    forwarded with its bucket's proven watermark."""
    seeds = env.from_collection([to_event("", params.clock.start, GateSeed(bucket)) for bucket in range(GATE_BUCKETS)],
                                type_info=EVENT_TYPE).assign_timestamps_and_watermarks(watermarks(0, idle_ms))
    return (events.union(seeds)
            .key_by(gate_bucket, key_type=Types.INT())
            .process(WatermarkGateFunction(params), output_type=EVENT_TYPE)
            .uid(f"{operator}/gate").name(f"{operator}/gate"))


def check_sums(params: Any) -> None:
    """Refuse (``ValueError``, one line, when the job is built) params the function cannot run: it
    releases continual sums of vectors, a :class:`~beam_dp.flink.params.FlinkReleaseParams` of a
    continual-sum mechanism or a Beam ``ContinualSumParams`` / ``WindowedSumParams``; another family's
    params (a count's, whose events carry no value, included) would fail on every element."""
    sums = isinstance(params, FlinkReleaseParams) or (isinstance(params, StepParams)
                                                      and callable(getattr(params, "sum_spec", None)))
    if not (sums and isinstance(params.build_mechanism(), ContinualSumMechanism)):
        raise ValueError(f"release_stream releases continual sums of vectors (FlinkReleaseParams of a continual sum, "
                         f"ContinualSumParams or WindowedSumParams), not {type(params).__name__}")


def restamped(env: StreamExecutionEnvironment, stamped):
    """``(release_ms, row)`` records -> the ``row`` texts, each with the Flink record timestamp
    ``release_ms``, the release function's watermarks kept. A PyFlink function cannot set its outputs'
    timestamps (they carry the input's, or the firing timer's); the Table API can: ``rt``, a rowtime
    from ``release_ms``, is written into each record's timestamp by ``toChangelogStream`` (its
    ``rowtime`` metadata column: the rows reach Python as the text alone), and ``SOURCE_WATERMARK()``
    forwards the upstream watermarks unchanged, each after the records emitted before it (a release
    is never behind the downstream watermark: its step was open at the previous one). Stateless (Java
    conversions and one Python map, no uid needed for a restore); it costs a one-off ~5 s when the job
    is built (the Table planner) and ~16 µs CPU per release (docs/running.md, "Windowing releases")."""
    t_env = StreamTableEnvironment.create(env)
    schema = (Schema.new_builder().column("release_ms", DataTypes.BIGINT()).column("row", DataTypes.STRING())
              .column_by_expression("rt", "TO_TIMESTAMP_LTZ(release_ms, 3)").watermark("rt", "SOURCE_WATERMARK()")
              .build())
    table = t_env.from_data_stream(stamped, schema)
    texts = (Schema.new_builder().column("row", DataTypes.STRING())
             .column_by_metadata("rowtime", DataTypes.TIMESTAMP_LTZ(3)).build())
    return (t_env.to_changelog_stream(table.select(table.row, table.rt), texts)  # inserts only
            .map(_text, output_type=Types.STRING()).name("release rows"))


def _text(record: Row) -> str:
    return record[0]  # the release row's text


def claimed_uids(env: StreamExecutionEnvironment) -> list[str]:
    """The operator uids of the job ``env`` is building (its transformations so far), a grouped release
    function's without :data:`GROUPED_UID`: the uid of the noise domain it claims."""
    uids = [t.getUid() for t in env._j_stream_execution_environment.getTransformations() if t.getUid()]
    return [u[:-len(GROUPED_UID)] if u.endswith(GROUPED_UID) else u for u in uids]


def to_event(stream_id: Any, seconds: float, value: Any) -> tuple:
    """A record of :data:`EVENT_TYPE` for ``env.from_collection`` (which wants the pickled bytes of a
    PICKLED_BYTE_ARRAY field; Python operators upstream emit the plain value instead). The value
    may have any shape (validated on the worker); ``None`` declares the stream."""
    return (stream_id, float(seconds), pickle.dumps(DECLARE if value is None else value))
