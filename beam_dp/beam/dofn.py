"""The one generic stateful DoFn that drives any continual mechanism, keyed by stream.

Per key it holds the mechanism's encoded state (``ReadModifyWriteState``), the next step to
close, a bag of buffered blocks of open steps, and one event-time timer.

* **Event-time steps.** Blocks are buffered by step. In streaming, the timer is set at the end of
  the next open step; when the watermark passes it, that step is fed to the mechanism (empty or
  not) and the timer moves on. In a batch replay one timer at the public ``end`` feeds every step
  ``1..last`` in order. A block for a step that is already closed is late: it goes to the
  ``dead_letter`` output and never touches state.
* **Count steps.** Blocks are buffered until ``block_size`` contributions have arrived, then fed
  as one step (arrival order within the key, which the docs say is public).
* **Declared streams** get a marker element so their state and timer exist from step 1 whether
  or not they ever see data.
* **The end of a stream.** A mechanism refuses a step (``ValueError``) only at its public end (a
  horizon or a budget fixed at construction, never the data). The stream then ends: one
  ``stream_ended`` dead letter, its state and buffers are freed, no later step is fed (so no step is
  ever fed late), and every later element is dead-lettered ``stream_ended`` with the element kept.

There is no privacy arithmetic here: clipping, noise and accounting happen in the mechanism.
Only ``Release``s leave, converted to ``ReleaseRow``s; raw state never does.

Contract with the other families: ``params`` must offer ``build_mechanism()``, ``clock`` (a
``StepClock`` or None), ``block_size`` (count steps, or None), ``streams`` and ``noise_key``; the
mechanism must offer ``init_state``/``step``/``encode_state``/``decode_state``, ``guarantee``,
``name``, ``merge_blocks(items) -> block`` (the items buffered for one step, in arrival order) and
``block_count(item) -> int`` (contributions in one item, for count steps). A family's own parse
stage feeds ``(stream, (step | None, item, original_element))``.
"""

from __future__ import annotations

from typing import Any, Iterator

import apache_beam as beam
from apache_beam.coders import BytesCoder, PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam.events import DeadLetter, Reason
from beam_dp.beam.parse import DEAD_LETTER
from beam_dp.io.schema import release_to_row

__all__ = ["ContinualReleaseDoFn"]


_ENDED = 0  # NEXT_STEP of a stream that has ended (steps count from 1)


class ContinualReleaseDoFn(beam.DoFn):
    """Input ``(stream, (step | None, block | None, original))``; ``block=None`` declares the stream."""

    MECHANISM_STATE = ReadModifyWriteStateSpec("mechanism_state", BytesCoder())
    NEXT_STEP = ReadModifyWriteStateSpec("next_step", VarIntCoder())
    BUFFERED = ReadModifyWriteStateSpec("buffered", VarIntCoder())
    PENDING = BagStateSpec("pending", PickleCoder())
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)

    def __init__(self, params: Any, per_step_timers: bool):
        self._params = params
        self._per_step_timers = per_step_timers

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._noise = self._params.noise_key.load()  # read on the worker, never pickled
        self._clock = self._params.clock
        restore = getattr(self._params, "restore_states", None) or ()
        self._restored = {stream: self._mechanism.decode_state(data) for stream, data in restore}
        namespace = f"beam_dp/{self._mechanism.name}"
        self._releases = Metrics.counter(namespace, "releases")
        self._late = Metrics.counter(namespace, "dead_letters")

    # -- helpers ------------------------------------------------------------------------------
    def _rows(self, releases, step_start=None, step_end=None) -> Iterator:
        for release in releases:
            self._releases.inc()
            yield release_to_row(release, self._mechanism.guarantee, step_start, step_end)

    def _timer_micros(self, next_step: int) -> int:
        if self._per_step_timers:
            return self._clock.step_end_micros(next_step)
        return self._clock.step_end_micros(self._clock.last_step)

    # -- elements -----------------------------------------------------------------------------
    def process(
        self,
        element,
        mechanism_state=beam.DoFn.StateParam(MECHANISM_STATE),
        next_step_state=beam.DoFn.StateParam(NEXT_STEP),
        buffered_state=beam.DoFn.StateParam(BUFFERED),
        pending=beam.DoFn.StateParam(PENDING),
        close=beam.DoFn.TimerParam(CLOSE),
    ) -> Iterator:
        stream, (step, block, original) = element
        next_step = next_step_state.read()
        if next_step is None:
            state = self._restored.get(stream)
            if state is None:
                state, next_step = self._mechanism.init_state(stream), 1
            else:
                next_step = int(state.t) + 1  # a restored stream continues after its snapshot's step
            next_step_state.write(next_step)
            mechanism_state.write(self._mechanism.encode_state(state))
            if self._clock is not None:
                close.set(Timestamp(micros=self._timer_micros(next_step)))
        if block is None:
            return
        if next_step == _ENDED:
            self._late.inc()
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER, DeadLetter(Reason.STREAM_ENDED, "the stream has ended at its public horizon", stream,
                                        original))
            return
        if self._clock is not None:
            if step < next_step:
                self._late.inc()
                yield beam.pvalue.TaggedOutput(
                    DEAD_LETTER, DeadLetter(Reason.LATE, f"step {step} was already released", stream, original)
                )
                return
            pending.add((step, block))
            return
        yield from self._count_step(stream, block, mechanism_state, next_step_state, buffered_state, pending)

    def _count_step(self, stream, block, mechanism_state, next_step_state, buffered_state, pending) -> Iterator:
        buffered = (buffered_state.read() or 0) + self._mechanism.block_count(block)
        pending.add(block)
        if buffered < self._params.block_size:
            buffered_state.write(buffered)
            return
        merged = self._mechanism.merge_blocks(list(pending.read()))
        pending.clear()
        buffered_state.write(0)
        state = self._mechanism.decode_state(mechanism_state.read())
        state, releases, refused = self._step(stream, state, merged, next_step_state.read())
        if refused is not None:
            yield self._end_stream(stream, refused, mechanism_state, next_step_state, pending)
            return
        mechanism_state.write(self._mechanism.encode_state(state))
        next_step_state.write(next_step_state.read() + 1)
        yield from self._rows(releases)

    def _step(self, stream, state, block, step: int):
        """Feed one step; a mechanism that refuses it (``ValueError``: at its public horizon or
        budget) returns the reason instead of failing the bundle forever."""
        try:
            new_state, releases = self._mechanism.step(state, block, self._noise)
        except ValueError as exc:
            return state, [], f"step {step} refused by {self._mechanism.name}: {str(exc)[:200]}"
        return new_state, releases, None

    def _end_stream(self, stream, reason: str, mechanism_state, next_step_state, pending):
        """The stream's one ``stream_ended`` dead letter; its state and buffers are freed."""
        self._late.inc()
        mechanism_state.clear()
        pending.clear()
        next_step_state.write(_ENDED)
        detail = f"the stream ended: {reason}; buffered contributions of later steps are discarded"
        return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(Reason.STREAM_ENDED, detail, stream, None))

    # -- closing event-time steps ---------------------------------------------------------------
    @on_timer(CLOSE)
    def close_steps(
        self,
        stream=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        mechanism_state=beam.DoFn.StateParam(MECHANISM_STATE),
        next_step_state=beam.DoFn.StateParam(NEXT_STEP),
        pending=beam.DoFn.StateParam(PENDING),
        close=beam.DoFn.TimerParam(CLOSE),
    ) -> Iterator:
        clock, last = self._clock, self._clock.last_step
        next_step = next_step_state.read()
        if next_step == _ENDED:
            return
        upto = int(clock.step_of_micros(fired.micros)) - 1  # steps whose end <= the fired time
        if last is not None:
            upto = min(upto, last)
        if upto < next_step:
            return
        by_step, keep = {}, []
        for step, block in pending.read():
            if step <= upto:
                by_step.setdefault(step, []).append(block)
            else:
                keep.append((step, block))
        blocks = {step: self._mechanism.merge_blocks(items) for step, items in by_step.items()}
        state = self._mechanism.decode_state(mechanism_state.read())
        for step in range(next_step, upto + 1):  # every step releases, empty ones included
            state, releases, refused = self._step(stream, state, blocks.get(step), step)
            if refused is not None:
                yield self._end_stream(stream, refused, mechanism_state, next_step_state, pending)
                return
            yield from self._rows(releases, clock.step_start_micros(step), clock.step_end_micros(step))
        mechanism_state.write(self._mechanism.encode_state(state))
        next_step_state.write(upto + 1)
        pending.clear()
        for item in keep:
            pending.add(item)
        if self._per_step_timers and (last is None or upto + 1 <= last):
            close.set(Timestamp(micros=clock.step_end_micros(upto + 1)))
