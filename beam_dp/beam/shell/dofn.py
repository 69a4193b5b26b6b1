"""Beam shells over the one step driver (:mod:`beam_dp.steps.driver`): they only move state and timers.

Per key a shell keeps the driver's :class:`~beam_dp.steps.coder.KeyState` (``ReadModifyWriteState``,
bytes), a bag of buffered ``(step, item)`` entries (:class:`EncodedBuffer`: the driver's explicit,
versioned encoding, never pickled classes) and two event-time timers: ``close`` (the close of the
next open step, or in a batch replay the public end) and ``end`` (the end of the global window: the
watermark reached +infinity, so the driver's end rule applies).

**Nothing lives in process memory.** Beam gives a DoFn no watermark, and a worker may be fresh,
restarted or updated at any time, so every decision reads keyed state, timers and their firing times
(a lower bound of the watermark) and public params only. A timer set behind the watermark fires at
once with the time it was set for, so a key with no state cannot learn from its own timers whether
its first item was late. The proof comes from :class:`WatermarkGate`, the stage before the
release shell in streaming: keyed by :data:`GATE_BUCKETS` public buckets, each seeded when the job
starts (so its first element is on time) and tracking the watermark with its own ladder of close
timers, it stamps every element with the close of the first step its firings have not proven
closed. Its first close timer holds its output watermark at or before that stamp, so the stamped
element is never behind the release shell's watermark: a new key (``gated``) opens at that step,
items of earlier steps are late, and its first close timer holds the shell's output watermark too.
A shell fed without the gate (the lifelong and growing-database DoFns) opens a new key
*provisionally* (:meth:`StepDriver.open`): at the lowest step of the items it receives before its
first close timer fires. See docs/steps.md for the argument.

In streaming a key arms one ``close`` timer per rung of a ladder (:data:`LADDER`): the close of its
first open step, and of the first open step numbered a multiple of 4 and of 16 (capped at the
clock's last step). Each firing closes every step up to its time and re-arms its own rung, so a
watermark jump of N steps takes about N/16 + 6 firing rounds instead of N, for 1/3 more (no-op)
firings when the watermark moves one step at a time. The first rung always sits at the close of the
first open step, so it holds the transform's output watermark at or before the time of every release
still to come: releases, stamped ``end(step) + allowed_lateness`` (:meth:`StepDriver.release_time`)
whatever timer closed them, are never late for a downstream window.

**The end rule** (:meth:`StepDriver.end_step`, the same on Flink). At +infinity every armed timer
fires, and a rung cannot tell the last finite watermark from the end. The key's state records where
its first rung is armed (``first_rung``, set whenever rung 1 is set); while no rung has closed a step
since then (``first_rung == next_step``: the key is at rest) the ``end`` timer releases through the
first multiple of 16 after ``next_step``; once a rung has (the rungs already fired at +infinity, in
timestamp order) it releases nothing more. Both orders, rungs then ``end`` (the DirectRunner) and
``end`` first, release the same steps, and so does a restore between any two firings (the record is
keyed state). Timers a firing sets at +infinity fire after ``end``, on an ended key.

**Metrics** (namespace ``beam_dp/<mechanism>``): ``releases``, ``dead_letters`` and
``dead_letters/<reason>``, ``buffered_items`` (net items held in buffers), ``timer_firings``,
``unreadable_states``, and the gauges ``last_closed_step`` and ``last_closed_step_lag_ms`` (wall
clock at the firing minus the release time of the last step it closed).

Contract with the families: ``params`` offers ``build_mechanism()``, ``clock``, ``block_size``,
``allowed_lateness``, ``restore_states`` and ``noise_key``; a family's parse stage feeds
``(stream, (step | None, item, original_element))``, ``item=None`` declaring the stream. With
``params.stream_groups`` the key is a group of streams (``beam_dp.mechanisms.stream_groups``), items are
``GroupBlock`` s, a declaration is ``(group, (0, GroupBlock.declaring(streams), None))``, and releases
leave as one ``ReleaseColumns`` per group and step. The group count is recorded in each key's state:
a key whose state was written under another count (an ``--update`` that changed it) ends with an
``unreadable_state`` dead letter.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder, Coder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam.shell.blocks import BlockOriginals
from beam_dp.io.keys import load_noise_source
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, GroupedSum, group_of
from beam_dp.steps.coder import (
    KeyState,
    UnreadableState,
    decode_entry,
    decode_key_state,
    encode_entry,
    encode_key_state,
    join_entries,
    split_entries,
)
from beam_dp.steps.driver import CARRIED, END_RUNG, RELEASE, ListBuffer, Output, StepDriver, release_step
from beam_dp.steps.events import DEAD_LETTER
from beam_dp.steps.params import legacy_noise_of, noise_source_of
from beam_dp.steps.policies import BlockPolicy, GroupPolicy
from beam_dp.steps.schema import ReleaseColumns

__all__ = ["GATE_BUCKETS", "BufferCoder", "ContinualReleaseDoFn", "DriverDoFn", "DriverShell", "EncodedBuffer",
           "SummingBuffer", "WatermarkGate", "continual_driver"]

_END_OF_INPUT = GlobalWindow().max_timestamp()
LADDER = (1, 4, END_RUNG)  # rungs of close timers: every k-th step (dynamic timer tags); the top is the end rule's
GATE_BUCKETS = 256  # the watermark gate's keys: a public hash of the engine key (stream or group)


class BufferCoder(Coder):
    """A buffered entry's bytes (:func:`beam_dp.steps.coder.encode_entry`), stored as they are.

    The shell encodes and decodes entries itself (:class:`EncodedBuffer`), so Beam's state cache holds
    bytes, whose size it measures at once, not decoded blocks it would traverse object by object. The
    bytes in state are the same as when this coder encoded entries itself: in-flight state stays readable."""

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        return data

    def is_deterministic(self) -> bool:
        return True


class EncodedBuffer:
    """The driver's :class:`~beam_dp.steps.driver.Buffer` over a Beam bag of entry bytes; ``held``
    (a counter, optional) counts entries added less entries cleared (those of the last read pass:
    the driver reads the whole bag before it clears it)."""

    def __init__(self, bag, held=None):
        self._bag, self._held, self._read = bag, held, 0

    def add(self, entry: tuple[int, Any]) -> None:
        self._bag.add(encode_entry(*entry))
        if self._held is not None:
            self._held.inc()

    def read(self) -> Iterator[tuple[int, Any]]:
        self._read = 0  # each pass reads the whole bag: the last pass counts what a clear removes
        for data in self._bag.read():
            self._read += 1
            yield decode_entry(data)

    def clear(self) -> None:
        self._bag.clear()
        if self._held is not None and self._read:
            self._held.dec(self._read)
        self._read = 0


class SummingBuffer(EncodedBuffer):
    """A buffer that pre-aggregates: the items of one open step that are sums (``ClippedSum``,
    ``GroupBlock``: fixed size, whatever the number of events) are merged as they arrive
    (``merge``: the mechanism's ``merge_blocks``, the same left-to-right order as merging them at the
    close) into one entry per open step, kept in a ``ReadModifyWriteState`` (``sums``); state per open
    step is O(d), not O(events). Other items (records a family needs, carried items) go to the bag, and
    so do sums of steps beyond the first :data:`MAX_MERGED` open ones (each item rewrites the merged
    entries: a backlog of many open steps would make that quadratic)."""

    SUMMED = (ClippedSum, GroupBlock)
    MAX_MERGED = 32

    def __init__(self, bag, sums, merge, held=None):
        super().__init__(bag, held)
        self._sums, self._merge = sums, merge

    def _merged(self) -> dict[int, bytes]:
        data = self._sums.read()
        return split_entries(data) if data else {}

    def add(self, entry: tuple[int, Any]) -> None:
        step, item = entry
        if step == CARRIED or not isinstance(item, self.SUMMED):
            return super().add(entry)
        merged = self._merged()  # encoded entries by step: only this step's is decoded and rewritten
        if step not in merged and len(merged) >= self.MAX_MERGED:
            return super().add(entry)
        if step in merged:
            item = self._merge([decode_entry(merged[step])[1], item])
        elif self._held is not None:
            self._held.inc()
        merged[step] = encode_entry(step, item)
        self._sums.write(join_entries(merged))

    def read(self) -> Iterator[tuple[int, Any]]:
        yield from super().read()  # resets the pass count, then counts the bag's entries
        for data in self._merged().values():
            self._read += 1
            yield decode_entry(data)

    def clear(self) -> None:
        self._sums.clear()
        super().clear()


class DriverShell(beam.DoFn):
    """What every shell shares, state or none: the driver, the metrics and turning outputs into Beam's."""

    def __init__(self, params: Any):
        self._params = params

    def make_driver(self) -> StepDriver:
        raise NotImplementedError

    def setup(self) -> None:
        self._driver = self.make_driver()
        self._namespace = namespace = f"beam_dp/{self._driver.policy.mechanism.name}"
        self._releases = Metrics.counter(namespace, "releases")
        self._dead = Metrics.counter(namespace, "dead_letters")
        self._buffered = Metrics.counter(namespace, "buffered_items")
        self._firings = Metrics.counter(namespace, "timer_firings")
        self._unreadable = Metrics.counter(namespace, "unreadable_states")
        self._last_step = Metrics.gauge(namespace, "last_closed_step")
        self._lag = Metrics.gauge(namespace, "last_closed_step_lag_ms")

    def emit(self, outputs: list[Output]) -> Iterator:
        """Outputs as Beam outputs: a release stamped with its step's public time (event-time steps)."""
        outputs, self._pending = list(getattr(self, "_pending", ())) + list(outputs), []
        for tag, value in outputs:
            if tag == RELEASE:
                self._releases.inc(len(value.batch) if isinstance(value, ReleaseColumns) else 1)
                when = self._driver.release_time(release_step(value))
                yield value if when is None else TimestampedValue(value, Timestamp(micros=when))
            elif tag == DEAD_LETTER:  # a letter for a whole block: one per element of the block
                for letter in value.element.letters(value) if isinstance(value.element, BlockOriginals) else [value]:
                    self._dead.inc()
                    Metrics.counter(self._namespace, f"dead_letters/{letter.reason}").inc()
                    yield beam.pvalue.TaggedOutput(tag, letter)
            else:
                yield beam.pvalue.TaggedOutput(tag, value)

    def closed(self, step: int) -> None:
        """Gauges of the last step a firing closed: its number and how far its release time trails the wall clock."""
        self._last_step.set(step)
        if (when := self._driver.release_time(step)) is not None:
            self._lag.set(int(time.time() * 1000 - when / 1000))


class DriverDoFn(DriverShell):
    """The stateful shell: state and timer plumbing; subclasses build the driver and read elements."""

    KEY_STATE = ReadModifyWriteStateSpec("key_state", BytesCoder())
    BUFFER = BagStateSpec("buffer", BufferCoder())
    SUMS = ReadModifyWriteStateSpec("sums", BytesCoder())  # SummingBuffer: one merged sum per open step
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)
    END = TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, params: Any, per_step_timers: bool):
        super().__init__(params)
        self._per_step_timers = per_step_timers
        self._groups = getattr(params, "stream_groups", None) or 0  # recorded in every key's state

    def buffer(self, bag, sums=None) -> EncodedBuffer:
        """The driver's buffer over the key's bag (and, given, its pre-aggregated ``sums``)."""
        # a batch replay's items are already one per step; a subclass's process may not pass ``sums``;
        # a mechanism without ``merge_blocks`` (a growing database's) never merges items
        merge = getattr(self._driver.policy.mechanism, "merge_blocks", None)
        if not self._per_step_timers or not hasattr(sums, "read") or merge is None:
            return EncodedBuffer(bag, self._buffered)
        return SummingBuffer(bag, sums, merge, self._buffered)

    def read_state(self, key: str, key_state, buffer, sums=None) -> tuple[KeyState, list[Output]]:
        """The key's stored state, or (state this version cannot read, or written under another group
        count) the ended state and ``unreadable_state`` dead letter of :meth:`StepDriver.unreadable`."""
        try:
            state = decode_key_state(key_state.read(), self._driver.binding)
            if state.stream_groups is not None and state.stream_groups != self._groups:
                raise UnreadableState(f"written under stream_groups={state.stream_groups or None}, this job has "
                                      f"stream_groups={self._groups or None}: stream groups are fixed at launch")
            return state, []
        except UnreadableState as exc:
            return self.unreadable(key, key_state, buffer, exc, sums)

    def unreadable(self, key: str, key_state, bag, exc: UnreadableState, sums=None) -> tuple[KeyState, list[Output]]:
        """End a key whose state cannot be read (``bag`` None: its buffer is left, never read again)."""
        self._unreadable.inc()
        buffer = ListBuffer() if bag is None else self.buffer(bag, sums)
        state, outputs = self._driver.unreadable(key, buffer, str(exc))
        state.stream_groups = self._groups
        key_state.write(encode_key_state(state))
        return state, outputs

    # -- moving state and timers ----------------------------------------------------------------
    def key_state(self, key: str, key_state, close, end, buffer=None, sums=None, stamp: int | None = None) -> KeyState:
        """The key's driver state; a new key is opened (and its timers set). In streaming with a clock
        a new key opens at the first step the :class:`WatermarkGate`'s ``stamp`` (µs, the element's
        timestamp) has not proven closed; without a stamp it is provisional: its close timers are armed
        once an item gives it a step. (``buffer``: the key's bag, to end a key whose state cannot be
        read; its letter goes out with the next :meth:`emit`.)"""
        self._close = close  # the element's close timer, for a provisional key's ladder (see add)
        if key_state.read() is not None:
            state, letters = self.read_state(key, key_state, buffer, sums)
            self._pending = list(getattr(self, "_pending", ())) + letters
            return state
        streaming = self._per_step_timers and self._driver.clock is not None
        try:
            if streaming and stamp is not None:
                state = self._driver.open(key, watermark=_gate_watermark(self._driver, stamp))
            else:
                state = self._driver.open(key, provisional=streaming)
        except UnreadableState as exc:  # a restored snapshot this version cannot read: the key ends, no retry
            state, letters = self.unreadable(key, key_state, buffer, exc, sums)
            self._pending = list(getattr(self, "_pending", ())) + letters
            return state
        state.stream_groups = self._groups
        if self._driver.clock is None:
            if self._driver.block_size is None:  # marker steps: the end of the input closes the rest
                end.set(_END_OF_INPUT)
        elif streaming:
            if not state.provisional:  # a restored stream continues after its snapshot's step
                self.arm_ladder(close, state)
            end.set(_END_OF_INPUT)
        else:
            close.set(Timestamp(micros=self._driver.final_timer()))
        key_state.write(encode_key_state(state))
        return state

    def declare(self, state: KeyState, key_state, close) -> None:
        """A declaration: a provisional key releases from step 1 (its ladder armed there)."""
        if state.provisional:
            self._driver.declare(state)
            self.arm_ladder(close, state)
            key_state.write(encode_key_state(state))

    def arm_ladder(self, close, state: KeyState) -> None:
        for every in LADDER:
            self.arm(close, state, every)

    def arm(self, close, state: KeyState, every: int) -> None:
        """Set the ladder rung ``every`` to the close of the next open step numbered a multiple of it
        (rung 1: recorded in ``state.first_rung``, which the end rule reads; the caller writes ``state``)."""
        if (timer := self._driver.timer(state, every)) is not None:
            close.set(Timestamp(micros=timer), dynamic_timer_tag=str(every))
            if every == 1:
                state.first_rung = state.next_step

    def add(self, state: KeyState, key_state, buffer, step: int | None, item: Any, original: Any,
            stream: str | None = None, sums=None) -> Iterator:
        """Hand one item to the driver (``step`` ``CARRIED``: an item that waits across steps); the key's
        state is written back only when it can have changed (count steps, or a new lowest buffered step)."""
        lowest, first, bag, buffer = state.lowest, state.next_step, buffer, self.buffer(buffer, sums)
        try:
            if step == CARRIED:
                self._driver.carry(state, buffer, item)
                outputs = []
            else:
                outputs = self._driver.add(state, buffer, step, item, original, stream)
        except UnreadableState as exc:
            state, outputs = self.unreadable(state.key, key_state, bag, exc, sums)
            yield from self.emit(outputs)
            return
        if state.provisional and state.next_step != first:  # a provisional key moved: its ladder follows
            self.arm_ladder(self._close, state)
        if self._driver.block_size is not None or state.lowest != lowest or state.next_step != first:
            key_state.write(encode_key_state(state))
        yield from self.emit(outputs)

    @on_timer(CLOSE)
    def on_close(self, fired=beam.DoFn.TimestampParam, rung=beam.DoFn.DynamicTimerTagParam, key=beam.DoFn.KeyParam,
                 key_state=beam.DoFn.StateParam(KEY_STATE), buffer=beam.DoFn.StateParam(BUFFER),
                 close=beam.DoFn.TimerParam(CLOSE), sums=beam.DoFn.StateParam(SUMS)) -> Iterator:
        self._firings.inc()
        state, outputs = self.read_state(key, key_state, buffer, sums)
        if not outputs:
            before = state.next_step
            try:
                outputs = self._driver.advance(state, self.buffer(buffer, sums), fired.micros)  # no-op if another rung did
            except UnreadableState as exc:
                state, outputs = self.unreadable(key, key_state, buffer, exc, sums)
            else:
                if state.next_step > before:
                    self.closed(state.next_step - 1)
                if self._per_step_timers:  # an untagged timer was set by a version before the ladder: arm every rung
                    for every in (int(rung),) if rung else LADDER:
                        self.arm(close, state, every)
                key_state.write(encode_key_state(state))
        yield from self.emit(outputs)

    @on_timer(END)
    def on_end(self, key=beam.DoFn.KeyParam, key_state=beam.DoFn.StateParam(KEY_STATE),
               buffer=beam.DoFn.StateParam(BUFFER), sums=beam.DoFn.StateParam(SUMS)) -> Iterator:
        self._firings.inc()
        state, outputs = self.read_state(key, key_state, buffer, sums)
        if not outputs:
            try:
                outputs = self._driver.finish(state, self.buffer(buffer, sums))
            except UnreadableState as exc:
                state, outputs = self.unreadable(key, key_state, buffer, exc, sums)
            else:
                key_state.write(encode_key_state(state))
        yield from self.emit(outputs)


class ContinualReleaseDoFn(DriverDoFn):
    """Input ``(stream, (step | None, block | None, original))``; ``block=None`` declares the stream
    (with stream groups: ``(group, ...)`` and ``GroupBlock`` s, see the module docstring).

    Args:
        params: the family's step params.
        per_step_timers: close steps at a ladder of close timers (streaming); False: one timer at the public end.
        gated: the input passed a :class:`WatermarkGate` (streaming, event-time steps): a new key opens at
            the step its first element's stamp proves open, never provisionally.
    """

    def __init__(self, params: Any, per_step_timers: bool, gated: bool = False):
        super().__init__(params, per_step_timers)
        self._gated = gated

    def make_driver(self) -> StepDriver:
        return continual_driver(self._params)

    def process(self, element, key_state=beam.DoFn.StateParam(DriverDoFn.KEY_STATE),
                buffer=beam.DoFn.StateParam(DriverDoFn.BUFFER), close=beam.DoFn.TimerParam(DriverDoFn.CLOSE),
                end=beam.DoFn.TimerParam(DriverDoFn.END), sums=beam.DoFn.StateParam(DriverDoFn.SUMS),
                timestamp=beam.DoFn.TimestampParam) -> Iterator:
        stream, (step, block, original) = element
        stamp = timestamp.micros if self._gated else None
        state = self.key_state(stream, key_state, close, end, buffer, sums, stamp)
        if block is None or step == CARRIED:  # a declaration (by stream, or a group's declaring block)
            self.declare(state, key_state, close)
        if block is None:
            yield from self.emit([])
            return
        streams = getattr(block, "streams", None)  # a group's block: late letters carry the stream if one
        yield from self.add(state, key_state, buffer, step, block, original,
                            streams[0] if streams is not None and len(streams) == 1 else None, sums)


class WatermarkGate(beam.PTransform):
    """Streaming, event-time steps: keyed elements ``(key, value)`` -> the same elements, each with the
    timestamp ``close(f)`` = ``end(f) + allowed_lateness`` (µs), ``f`` the first step the watermark has
    not been proven to close, for a :class:`ContinualReleaseDoFn` ``gated=True``.

    Guarantee (the module docstring, docs/steps.md rule 3): the watermark had closed every step before
    ``f`` (a close timer proved it) and the stamped element is on time downstream (its bucket's first
    close timer, at or before ``close(f)``, holds the gate's output watermark), whatever worker runs
    either stage. Keyed by ``GATE_BUCKETS`` buckets (``group_of`` of the key), each seeded when the job
    starts; a bucket's state is one integer, its timers one ladder.

    Args:
        params: the release stage's params: ``clock`` (a ``StepClock``) and ``allowed_lateness`` (seconds).
    """

    def __init__(self, params: Any, label: str | None = None):
        super().__init__(label)
        self._params = params

    def expand(self, items: beam.PCollection) -> beam.PCollection:
        seeds = items.pipeline | "Seed buckets" >> beam.Create(
            [(_bucket_key(bucket), None) for bucket in range(GATE_BUCKETS)]).with_output_types(Tuple[str, Any])
        keyed = items | "By bucket" >> beam.Map(_by_bucket).with_output_types(Tuple[str, Any])
        return ((keyed, seeds) | "With seeds" >> beam.Flatten()
                | "Stamp" >> beam.ParDo(_GateDoFn(self._params)).with_output_types(Tuple[str, Any]))


def _bucket_key(bucket: int) -> str:
    return f"watermark-gate-{bucket}"


def _by_bucket(element: tuple) -> tuple:
    return _bucket_key(group_of(element[0], GATE_BUCKETS)), element


def _gate_watermark(driver: StepDriver, stamp: int) -> int:
    """The watermark a gate's stamp ``close(f)`` proves: the close of step ``f - 1``."""
    return stamp - driver.clock.period_micros


class _GateDoFn(beam.DoFn):
    """Per bucket the first step its close timers have not proven closed (``first_open``; 0 once the
    watermark reached +infinity), a ladder of close timers (:data:`LADDER`) whose first rung sits at
    or before that step's close, and an ``end`` timer after which no rung is re-armed."""

    FIRST_OPEN = ReadModifyWriteStateSpec("first_open", VarIntCoder())
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)
    END = TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, params: Any):
        self._params = params

    def setup(self) -> None:
        clock = self._params.clock
        self._driver = StepDriver(None, clock=clock, last_step=clock.last_step,
                                  allowed_lateness=self._params.allowed_lateness)

    def process(self, element, first_open=beam.DoFn.StateParam(FIRST_OPEN), close=beam.DoFn.TimerParam(CLOSE),
                end=beam.DoFn.TimerParam(END)) -> Iterator:
        _, value = element
        step = first_open.read()
        if step is None:  # the bucket's seed (this element or one in flight) holds the watermark at -infinity
            step = 1
            first_open.write(step)
            self._arm(close, step, LADDER)
            end.set(_END_OF_INPUT)
        if value is not None:
            yield TimestampedValue(value, Timestamp(micros=self._driver.release_time(step)))

    @on_timer(CLOSE)
    def on_close(self, fired=beam.DoFn.TimestampParam, rung=beam.DoFn.DynamicTimerTagParam,
                 first_open=beam.DoFn.StateParam(FIRST_OPEN), close=beam.DoFn.TimerParam(CLOSE)) -> None:
        if (step := first_open.read()) == 0:  # the end: a rung re-armed now would fire again at once, forever
            return
        step = max(step, self._driver.first_open(fired.micros))
        first_open.write(step)
        self._arm(close, step, (int(rung),))

    @on_timer(END)
    def on_end(self, first_open=beam.DoFn.StateParam(FIRST_OPEN)) -> None:
        first_open.write(0)

    def _arm(self, close, step: int, rungs: tuple[int, ...]) -> None:
        at = KeyState("", _NO_BYTES, step)
        for every in rungs:
            if (timer := self._driver.timer(at, every)) is not None:
                close.set(Timestamp(micros=timer), dynamic_timer_tag=str(every))


_NO_BYTES = np.zeros(0, dtype=np.uint8)


def continual_driver(params: Any) -> StepDriver:
    """The driver of a family fed blocks or records per key (sums, stream groups, learners, ERM), on a worker."""
    noise = noise_source_of(params, load_noise_source)  # the key is read here, on the worker
    mechanism = params.build_mechanism()
    if getattr(params, "stream_groups", None) is not None:
        driver = StepDriver.for_params(params, GroupPolicy(GroupedSum(mechanism), noise))
    else:
        driver = StepDriver.for_params(params, BlockPolicy(mechanism, noise))
    driver.legacy_noise = legacy_noise_of(params, load_noise_source)  # keys written before the binding
    return driver
