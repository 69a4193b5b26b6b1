"""Beam shells over the one step driver (:mod:`beam_dp.steps.driver`): they only move state and timers.

Per key a shell keeps the driver's :class:`~beam_dp.steps.coder.KeyState` (``ReadModifyWriteState``,
bytes), a bag of buffered ``(step, item)`` entries (:class:`EncodedBuffer`: the driver's explicit,
versioned encoding, never pickled classes) and two event-time timers: ``close`` (the close of the
next open step, or in a batch replay the public end) and ``end`` (the end of the global window: the
watermark reached +infinity, so the driver's end rule applies).

Beam gives a DoFn no access to the watermark: a shell reports the time of each fired ``close``
timer (a lower bound of the watermark) and, for a key seen for the first time, the latest such time
any key of the same transform reported in this worker process. So a new stream's first step is the
first step not yet closed as far as this worker knows (Flink reports the exact watermark). In
streaming a key arms one ``close`` timer per rung of a ladder (:data:`LADDER`): the close of its first
open step, and of the first open step numbered a multiple of 4 and of 16 (capped at the clock's last
step). Each firing closes every step up to its time and re-arms its own rung, so a watermark jump
of N steps takes about N/16 + 6 firing rounds instead of N, for 1/3 more (no-op) firings when the
watermark moves one step at a time.

**Beam's end rule.** At +infinity every armed timer fires, and a rung cannot tell the last finite
watermark from the end. Runners that fire a key's timers in timestamp order (the DirectRunner
does) fire the rungs before ``end``, so the end of input releases every step up to the furthest
rung: the first step numbered a multiple of 16 at or after the first step the watermark had not
closed (capped at the clock's last step); a runner that fired ``end`` first would release only what
the driver's exact rule allows. Either way at most 15 steps more than the exact rule, which Flink
applies (it reports the exact watermark); the schedule stays public and data-independent.
Outputs of that final round carry timestamps behind the global window's end (a downstream
``GroupByKey`` in the global window may drop them; per-element sinks see them).

Contract with the families: ``params`` offers ``build_mechanism()``, ``clock``, ``block_size``,
``allowed_lateness``, ``restore_states`` and ``noise_key``; a family's parse stage feeds
``(stream, (step | None, item, original_element))``, ``item=None`` declaring the stream. With
``params.stream_groups`` the key is a group of streams (``beam_dp.mechanisms.stream_groups``), items are
``GroupBlock`` s, a declaration is ``(group, (0, GroupBlock.declaring(streams), None))``, and releases
leave as one ``ReleaseColumns`` per group and step.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import apache_beam as beam
from apache_beam.coders import BytesCoder, Coder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from beam_dp.steps.coder import KeyState, decode_entry, decode_key_state, encode_entry, encode_key_state
from beam_dp.mechanisms.stream_groups import GroupedSum
from beam_dp.steps.driver import CARRIED, RELEASE, Output, StepDriver
from beam_dp.steps.events import DEAD_LETTER
from beam_dp.steps.policies import BlockPolicy, GroupPolicy
from beam_dp.steps.schema import ReleaseColumns
from beam_dp.io.keys import load_noise_source

__all__ = ["BufferCoder", "ContinualReleaseDoFn", "DriverDoFn", "EncodedBuffer"]

_END_OF_INPUT = GlobalWindow().max_timestamp()
LADDER = (1, 4, 16)  # rungs of close timers: every k-th step (dynamic timer tags); the top bounds the end rule
_watermark_floor: dict[str, int] = {}  # per transform instance: the latest close time its timers proved


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
    """The driver's :class:`~beam_dp.steps.driver.Buffer` over a Beam bag of entry bytes."""

    def __init__(self, bag):
        self._bag = bag

    def add(self, entry: tuple[int, Any]) -> None:
        self._bag.add(encode_entry(*entry))

    def read(self) -> Iterator[tuple[int, Any]]:
        return (decode_entry(data) for data in self._bag.read())

    def clear(self) -> None:
        self._bag.clear()


class DriverDoFn(beam.DoFn):
    """The shared shell: state and timer plumbing; subclasses build the driver and read elements."""

    KEY_STATE = ReadModifyWriteStateSpec("key_state", BytesCoder())
    BUFFER = BagStateSpec("buffer", BufferCoder())
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)
    END = TimerSpec("end", TimeDomain.WATERMARK)

    def __init__(self, params: Any, per_step_timers: bool):
        self._params = params
        self._per_step_timers = per_step_timers
        self._uid = uuid.uuid4().hex  # shared by every copy of this transform's DoFn

    def make_driver(self) -> StepDriver:
        raise NotImplementedError

    def setup(self) -> None:
        self._driver = self.make_driver()
        namespace = f"beam_dp/{self._driver.policy.mechanism.name}"
        self._releases = Metrics.counter(namespace, "releases")
        self._dead = Metrics.counter(namespace, "dead_letters")

    # -- moving state and timers ----------------------------------------------------------------
    def key_state(self, key: str, key_state, close, end) -> KeyState:
        """The key's driver state; a new key is opened (and its timers set) at the known watermark."""
        data = key_state.read()
        if data is not None:
            return decode_key_state(data)
        state = self._driver.open(key, _watermark_floor.get(self._uid))
        key_state.write(encode_key_state(state))
        if self._driver.clock is None:
            if self._driver.block_size is None:  # marker steps: the end of the input closes the rest
                end.set(_END_OF_INPUT)
        elif self._per_step_timers:
            for every in LADDER:
                self.arm(close, state, every)
            end.set(_END_OF_INPUT)
        else:
            close.set(Timestamp(micros=self._driver.final_timer()))
        return state

    def arm(self, close, state: KeyState, every: int) -> None:
        """Set the ladder rung ``every`` to the close of the next open step numbered a multiple of it."""
        if (timer := self._driver.timer(state, every)) is not None:
            close.set(Timestamp(micros=timer), dynamic_timer_tag=str(every))

    def emit(self, outputs: list[Output]) -> Iterator:
        for tag, value in outputs:
            if tag == RELEASE:
                self._releases.inc(len(value.batch) if isinstance(value, ReleaseColumns) else 1)
                yield value
            else:
                if tag == DEAD_LETTER:
                    self._dead.inc()
                yield beam.pvalue.TaggedOutput(tag, value)

    def add(self, state: KeyState, key_state, buffer, step: int | None, item: Any, original: Any,
            stream: str | None = None) -> Iterator:
        """Hand one item to the driver (``step`` ``CARRIED``: an item that waits across steps); the key's
        state is written back only when it can have changed (count steps, or a new lowest buffered step)."""
        lowest, buffer = state.lowest, EncodedBuffer(buffer)
        if step == CARRIED:
            self._driver.carry(state, buffer, item)
            outputs = []
        else:
            outputs = self._driver.add(state, buffer, step, item, original, stream)
        if self._driver.block_size is not None or state.lowest != lowest:
            key_state.write(encode_key_state(state))
        yield from self.emit(outputs)

    @on_timer(CLOSE)
    def on_close(self, fired=beam.DoFn.TimestampParam, rung=beam.DoFn.DynamicTimerTagParam,
                 key_state=beam.DoFn.StateParam(KEY_STATE), buffer=beam.DoFn.StateParam(BUFFER),
                 close=beam.DoFn.TimerParam(CLOSE)) -> Iterator:
        state = decode_key_state(key_state.read())
        _watermark_floor[self._uid] = max(_watermark_floor.get(self._uid, fired.micros), fired.micros)
        outputs = self._driver.advance(state, EncodedBuffer(buffer), fired.micros)  # nothing if another rung did
        key_state.write(encode_key_state(state))
        if self._per_step_timers:  # an untagged timer was set by a version before the ladder: arm every rung
            for every in (int(rung),) if rung else LADDER:
                self.arm(close, state, every)
        yield from self.emit(outputs)

    @on_timer(END)
    def on_end(self, key_state=beam.DoFn.StateParam(KEY_STATE), buffer=beam.DoFn.StateParam(BUFFER)) -> Iterator:
        state = decode_key_state(key_state.read())
        outputs = self._driver.finish(state, EncodedBuffer(buffer))
        key_state.write(encode_key_state(state))
        yield from self.emit(outputs)


class ContinualReleaseDoFn(DriverDoFn):
    """Input ``(stream, (step | None, block | None, original))``; ``block=None`` declares the stream
    (with stream groups: ``(group, ...)`` and ``GroupBlock`` s, see the module docstring)."""

    def make_driver(self) -> StepDriver:
        noise = self._params.noise_key.load(load_noise_source)  # the key is read here, on the worker
        mechanism = self._params.build_mechanism()
        if getattr(self._params, "stream_groups", None) is not None:
            policy = GroupPolicy(GroupedSum(mechanism), noise)
        else:
            policy = BlockPolicy(mechanism, noise)
        return StepDriver.for_params(self._params, policy)

    def process(self, element, key_state=beam.DoFn.StateParam(DriverDoFn.KEY_STATE),
                buffer=beam.DoFn.StateParam(DriverDoFn.BUFFER), close=beam.DoFn.TimerParam(DriverDoFn.CLOSE),
                end=beam.DoFn.TimerParam(DriverDoFn.END)) -> Iterator:
        stream, (step, block, original) = element
        state = self.key_state(stream, key_state, close, end)
        if block is None:
            return
        streams = getattr(block, "streams", None)  # a group's block: late letters carry the stream if one
        yield from self.add(state, key_state, buffer, step, block, original,
                            streams[0] if streams is not None and len(streams) == 1 else None)
