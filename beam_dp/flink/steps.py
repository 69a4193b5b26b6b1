"""Per-key step logic of the Flink adapter, free of PyFlink (unit-tested in the main venv).

The same semantics as the Beam adapter's ``ContinualReleaseDoFn``:

* **event-time steps**: contributions are buffered by step; a timer at the end of the next open
  step (``step_end - 1 ms``: a Flink watermark ``W`` means no more records with timestamp ``<= W``)
  closes that step when the watermark passes it, feeding it to the mechanism whether empty or not,
  then moves on to the next step; a contribution for a closed step is late and goes to the dead
  letters whole, never into state; with a public ``end`` nothing after the last step is released;
* **count steps**: blocks of ``block_size`` contributions in arrival order;
* **declared streams**: a marker ``(stream, None, None)`` creates the stream's state and timer.

Elements are ``(stream_id, timestamp seconds | None, value)``. Only ``Release``s leave, as rows of
``beam_dp.io.ReleaseRow`` (JSON); raw state never does. No privacy arithmetic here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KeyState", "KeyedSteps"]

# Dead-letter reasons: the same stable strings as beam_dp.beam.Reason (not imported: that package needs Beam 2.77).
MALFORMED, BAD_STREAM_ID, UNDECLARED_STREAM = "malformed", "bad_stream_id", "undeclared_stream"
BAD_TIMESTAMP, BEFORE_START, AFTER_END = "bad_timestamp", "before_start", "after_end"
BAD_VALUE, WRONG_SHAPE, NON_FINITE, LATE = "bad_value", "wrong_shape", "non_finite", "late"


@dataclass
class KeyState:
    """One stream's adapter state: the mechanism's versioned encoding and the open steps."""

    mechanism_state: bytes
    next_step: int = 1
    pending: list = field(default_factory=list)  # [(step, block)] (event time) or [block] (count steps)
    buffered: int = 0


class KeyedSteps:
    """Drive one mechanism for many keys; the engine stores the :class:`KeyState` per key."""

    def __init__(self, params: Any):
        from beam_dp.io.schema import release_to_row  # the one release schema

        self._to_row = release_to_row
        self.mechanism = params.build_mechanism()
        self.clock = params.clock
        self.block_size = params.block_size
        self.streams = frozenset(params.streams) if params.streams is not None else None
        self.noise = params.noise_key.load()  # on the worker, never shipped

    # -- timers in Flink milliseconds -----------------------------------------------------------
    def timer_ms(self, step: int) -> int | None:
        last = self.clock.last_step
        if last is not None and step > last:
            return None
        return self.clock.step_end_micros(step) // 1000 - 1

    # -- validation -----------------------------------------------------------------------------
    def _dead(self, reason: str, detail: str, stream: Any, element: Any) -> tuple[str, str]:
        return "dead_letter", json.dumps({"reason": reason, "detail": detail,
                                          "stream": stream if isinstance(stream, str) else None,
                                          "element": repr(element)[:2000]})

    def parse(self, element: Any) -> tuple[str, int | None, Any] | tuple[str, str]:
        """``(stream, step | None, block)`` or a ``("dead_letter", json)`` output."""
        try:
            stream, seconds, value = element
        except (TypeError, ValueError):
            return self._dead(MALFORMED, "expected (stream_id, timestamp, value)", None, element)
        if not isinstance(stream, str) or not stream:
            return self._dead(BAD_STREAM_ID, "stream_id must be a non-empty string", None, element)
        if self.streams is not None and stream not in self.streams:
            return self._dead(UNDECLARED_STREAM, "stream_id is not among the declared streams", stream, element)
        step = None
        if self.clock is not None:
            try:
                micros = round(float(seconds) * 1_000_000)
            except (TypeError, ValueError, OverflowError):
                return self._dead(BAD_TIMESTAMP, "timestamp must be finite epoch seconds", stream, element)
            where = int(self.clock.classify_micros(np.asarray([micros]))[0])
            if where:
                reason = BEFORE_START if where < 0 else AFTER_END
                return self._dead(reason, "timestamp outside the public schedule", stream, element)
            step = int(self.clock.step_of_micros(micros))
        try:
            vec = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            return self._dead(BAD_VALUE, "value is not numeric", stream, element)
        if vec.shape != (self.mechanism.dim,):
            return self._dead(WRONG_SHAPE, f"expected {self.mechanism.dim} coordinates", stream, element)
        if not np.all(np.isfinite(vec)):
            return self._dead(NON_FINITE, "non-finite coordinate", stream, element)
        return stream, step, self.mechanism.clip_and_sum(vec)

    # -- the two callbacks ----------------------------------------------------------------------
    def new_state(self, stream: str) -> KeyState:
        return KeyState(self.mechanism.encode_state(self.mechanism.init_state(stream)))

    def on_element(self, state: KeyState | None, element: Any) -> tuple[KeyState | None, list, int | None]:
        """Returns ``(state, outputs, timer to register in ms or None)``."""
        if isinstance(element, tuple) and len(element) == 3 and element[2] is None and isinstance(element[0], str):
            if self.streams is not None and element[0] in self.streams and state is None:  # declared stream marker
                return self.new_state(element[0]), [], self.timer_ms(1) if self.clock is not None else None
            return state, [], None
        parsed = self.parse(element)
        if len(parsed) == 2:
            return state, [parsed], None
        stream, step, block = parsed
        timer = None
        if state is None:
            state = self.new_state(stream)
            timer = self.timer_ms(1) if self.clock is not None else None
        if self.clock is None:
            return (*self._count_step(state, block), timer)
        if step < state.next_step:
            return state, [self._dead(LATE, f"step {step} was already released", stream, element)], timer
        state.pending.append((step, block))
        return state, [], timer

    def _count_step(self, state: KeyState, block: Any) -> tuple[KeyState, list]:
        state.pending.append(block)
        state.buffered += self.mechanism.block_count(block)
        if state.buffered < self.block_size:
            return state, []
        merged = self.mechanism.merge_blocks(state.pending)
        mech_state, releases = self.mechanism.step(self.mechanism.decode_state(state.mechanism_state), merged,
                                                   self.noise)
        state = KeyState(self.mechanism.encode_state(mech_state), state.next_step + 1)
        return state, [self._row(r) for r in releases]

    def on_timer(self, state: KeyState, fired_ms: int) -> tuple[KeyState, list, int | None]:
        """Close every step whose end is at or before ``fired_ms + 1``; returns the next timer."""
        clock, last = self.clock, self.clock.last_step
        upto = int(clock.step_of_micros((fired_ms + 1) * 1000)) - 1
        if last is not None:
            upto = min(upto, last)
        if upto < state.next_step:
            return state, [], self.timer_ms(state.next_step)
        by_step: dict[int, list] = {}
        keep = []
        for step, block in state.pending:
            if step <= upto:
                by_step.setdefault(step, []).append(block)
            else:
                keep.append((step, block))
        mech_state = self.mechanism.decode_state(state.mechanism_state)
        outputs = []
        for step in range(state.next_step, upto + 1):  # every step releases, empty ones included
            block = self.mechanism.merge_blocks(by_step[step]) if step in by_step else None
            mech_state, releases = self.mechanism.step(mech_state, block, self.noise)
            outputs.extend(self._row(r, clock.step_start_micros(step), clock.step_end_micros(step)) for r in releases)
        state = KeyState(self.mechanism.encode_state(mech_state), upto + 1, keep)
        return state, outputs, self.timer_ms(upto + 1)

    def _row(self, release, start=None, end=None) -> tuple[str, str]:
        row = self._to_row(release, self.mechanism.guarantee, start, end)
        return "release", json.dumps(row._asdict(), sort_keys=True)
