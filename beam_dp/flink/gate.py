"""The Flink watermark gate: a keyed stage ahead of the release function that carries the watermark across a restore.

Flink does not checkpoint watermarks: after a restore a key seen for the first time cannot read one, and
would open provisionally (docs/steps.md rule 3). The gate is keyed by :data:`GATE_BUCKETS` public buckets
(``group_of`` of the stream), each seeded when the job starts; per bucket it keeps in keyed state the
highest watermark its close timers proved (one timer at the close of the first step not yet proven
closed), and forwards each event with it (:class:`Gated`). A new key of the release function opens at
the higher of that and Flink's own watermark, so after a restore it still dead-letters a late first item
and never releases behind a watermark already passed downstream. For on-time data nothing changes: the
gate's watermark is never above the one the event met.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

from pyflink.common import Types
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from beam_dp.beam.shell.dofn import GATE_BUCKETS
from beam_dp.mechanisms.stream_groups import group_of
from beam_dp.steps.driver import StepDriver

__all__ = ["GATE_BUCKETS", "MIN_WATERMARK", "Gated", "GateSeed", "WatermarkGateFunction", "gate_bucket"]

MIN_WATERMARK, MAX_WATERMARK = -(2 ** 63), 2 ** 63 - 1  # Flink's (ms): none yet, and the end of the input


class Gated(NamedTuple):
    """An event's payload with ``watermark``, the highest Flink watermark (ms) its gate bucket proved."""

    watermark: int
    payload: Any


class GateSeed(NamedTuple):
    """The payload that seeds gate bucket ``bucket`` when the job starts (never forwarded)."""

    bucket: int


def gate_bucket(event: tuple) -> int:
    """The gate bucket of an event: its seed's, or ``group_of`` of its stream."""
    stream, _, payload = event
    if isinstance(payload, GateSeed):
        return payload.bucket
    return group_of(stream if isinstance(stream, str) else "", GATE_BUCKETS)


class WatermarkGateFunction(KeyedProcessFunction):
    """Keyed by gate bucket: events ``(stream, seconds, payload)`` -> ``(stream, seconds, Gated(w, payload))``,
    ``w`` the highest watermark (ms) the bucket's close timers proved (kept in keyed state, so it outlives a
    restore), or Flink's current one if higher.

    Args:
        params: the release function's params: ``clock`` (a ``StepClock``) and ``allowed_lateness`` (seconds).
    """

    def __init__(self, params: Any):
        self._params = params

    def open(self, runtime_context: RuntimeContext) -> None:
        clock = self._params.clock
        self._driver = StepDriver(None, clock=clock, last_step=clock.last_step,
                                  allowed_lateness=self._params.allowed_lateness)
        self._proven = runtime_context.get_state(ValueStateDescriptor("beam_dp_gate_watermark", Types.LONG()))

    def process_element(self, value, ctx: KeyedProcessFunction.Context) -> Iterator:
        stream, seconds, payload = value
        proven = self._proven.value()
        if proven is None:
            proven = MIN_WATERMARK
            self._proven.update(proven)
            self._arm(ctx, proven)
        if not isinstance(payload, GateSeed):
            yield stream, seconds, Gated(max(proven, ctx.timer_service().current_watermark()), payload)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator:
        proven = max(self._proven.value() or MIN_WATERMARK, ctx.timer_service().current_watermark(), timestamp)
        self._proven.update(proven)
        self._arm(ctx, proven)
        yield from ()

    def _arm(self, ctx, proven: int) -> None:
        """A timer at the close (ms) of the first step ``proven`` has not closed; none past the last step."""
        if proven >= MAX_WATERMARK:
            return
        step = 1 if proven == MIN_WATERMARK else max(1, self._driver.first_open((proven + 1) * 1000))
        if self._driver.last_step is not None and step > self._driver.last_step:
            return
        ctx.timer_service().register_event_time_timer(-(-self._driver.release_time(step) // 1000) - 1)
