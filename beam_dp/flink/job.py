"""The PyFlink job: ``KeyedProcessFunction`` with ``ValueState`` and event-time timers.

    from beam_dp.flink.job import local_environment, release_stream
    env = local_environment()
    out = release_stream(env, env.from_collection(events, type_info=EVENT_TYPE), params)
    with out.execute_and_collect() as results: ...   # ("release" | "dead_letter", json)

``events`` are ``(stream_id, timestamp seconds, value list)``; ``params`` a
:class:`~beam_dp.flink.params.FlinkReleaseParams` (or a Beam params object). Watermarks follow
the event timestamps (monotonous, or bounded out-of-orderness with ``max_delay_ms``); a step is
released when the watermark passes its end. A bounded input needs a public ``end`` (the final
watermark would otherwise close every future step).
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from pyflink.common import Configuration, Duration, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from beam_dp.flink.steps import KeyedSteps

__all__ = ["EVENT_TYPE", "OUTPUT_TYPE", "ContinualReleaseFunction", "local_environment", "release_stream"]

EVENT_TYPE = Types.TUPLE([Types.STRING(), Types.DOUBLE(), Types.PICKLED_BYTE_ARRAY()])
OUTPUT_TYPE = Types.TUPLE([Types.STRING(), Types.STRING()])
_DECLARE = "beam_dp:declare-stream"  # Flink cannot carry a null value: the marker of a declared stream


class ContinualReleaseFunction(KeyedProcessFunction):
    """Keyed by stream. ``ValueState`` holds the pickled :class:`~beam_dp.flink.steps.KeyState`
    (the mechanism's versioned state encoding plus the open steps); one event-time timer per key."""

    def __init__(self, params: Any):
        self._params = params

    def open(self, runtime_context: RuntimeContext) -> None:
        self._steps = KeyedSteps(self._params)  # builds the mechanism and loads the noise key here
        self._state = runtime_context.get_state(ValueStateDescriptor("beam_dp_state", Types.PICKLED_BYTE_ARRAY()))

    def _save(self, state) -> None:
        if state is not None:
            self._state.update(state)  # PICKLED_BYTE_ARRAY: Flink pickles the KeyState

    def _load(self):
        return self._state.value()

    def process_element(self, value, ctx: KeyedProcessFunction.Context):
        stream, seconds, payload = value
        element = (stream, seconds, None if payload == _DECLARE else payload)  # None: a declared-stream marker
        state, outputs, timer = self._steps.on_element(self._load(), element)
        self._save(state)
        if timer is not None:
            ctx.timer_service().register_event_time_timer(timer)
        yield from outputs

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        state, outputs, timer = self._steps.on_timer(self._load(), timestamp)
        self._save(state)
        if timer is not None:
            ctx.timer_service().register_event_time_timer(timer)
        yield from outputs


class _EventTime(TimestampAssigner):
    """Record timestamp in ms from the event's seconds (0 for an unusable one; it is dead-lettered)."""

    def extract_timestamp(self, value, record_timestamp) -> int:
        seconds = value[1]
        if isinstance(seconds, float) and seconds == seconds and abs(seconds) < 1e13:
            return int(seconds * 1000)
        return 0


def local_environment(parallelism: int = 1) -> StreamExecutionEnvironment:
    """A local MiniCluster whose Python workers use this interpreter and see ``PYTHONPATH``."""
    config = Configuration()
    config.set_string("python.executable", sys.executable)  # else the workers use the system python
    config.set_string("python.client.executable", sys.executable)
    if os.environ.get("PYTHONPATH"):
        config.set_string("python.pythonpath", os.environ["PYTHONPATH"])
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    return env


def release_stream(env: StreamExecutionEnvironment, events, params: Any, max_delay_ms: int = 0):
    """``events`` (a DataStream of :data:`EVENT_TYPE`) -> a DataStream of ``(kind, json)``."""
    if params.clock is not None:
        strategy = (WatermarkStrategy.for_monotonous_timestamps() if max_delay_ms == 0
                    else WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(max_delay_ms)))
        events = events.assign_timestamps_and_watermarks(strategy.with_timestamp_assigner(_EventTime()))
    if params.streams:
        start = params.clock.start if params.clock is not None else 0.0
        markers = env.from_collection([to_event(s, start, None) for s in params.streams], type_info=EVENT_TYPE)
        if params.clock is not None:
            markers = markers.assign_timestamps_and_watermarks(
                WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_EventTime()))
        events = events.union(markers)
    return (events
            .key_by(lambda e: e[0] if isinstance(e[0], str) else "", key_type=Types.STRING())
            .process(ContinualReleaseFunction(params), output_type=OUTPUT_TYPE))


def to_event(stream_id: Any, seconds: float, value: Any) -> tuple:
    """A record of :data:`EVENT_TYPE` for ``env.from_collection`` (which wants the pickled bytes of a
    PICKLED_BYTE_ARRAY field; Python operators upstream emit the plain value instead). The value
    may have any shape (validated on the worker); ``None`` declares the stream."""
    return (stream_id, float(seconds), pickle.dumps(_DECLARE if value is None else value))
