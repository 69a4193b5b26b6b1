"""Privacy units for the continual sums on native Flink (user-level DP; ``docs/privacy_units.md``).

    from beam_dp.flink.units import unit_event, unit_release_stream
    events = env.from_collection([unit_event("page", 61.0, [1.0], "ann"), ...], type_info=EVENT_TYPE)
    releases, dead = unit_release_stream(env, events, params.with_privacy_unit(unit), uid="sums")

::

    events (stream, seconds, UnitValue(value, unit id)) ─ [streaming: watermark gate]
        ─ hash units (keyed hash, validate, step; no clear id after it) ─ key_by(unit hash)
        ─ UnitStepsFunction ─ (stream, seconds, StepBlock(step, ClippedSum)) ─ release_stream (keyed by stream)

The per-unit logic is Beam's (:class:`~beam_dp.core.unit_steps.UnitSteps`): per unit hash a
``ValueState`` of the unit's state bytes (its ledger row for its closed steps and the candidate
contributions of its open steps), the batch replay's bounding, and at each on-time contribution the
changes of the unit's kept sums, sent at once with the contribution's record timestamp: Flink forwards
a watermark after the records before it, so the release function has not closed their step. The first
open step is the higher of Flink's watermark and the one the gate proved (kept across a restore:
:mod:`beam_dp.flink.gate`); a contribution before it, or not after the unit's last folded step, is a
``late`` dead letter holding the unit's hash, never its id. A timer at the unit's lowest open step folds
closed steps into the row. The state is checkpointed keyed state: a restore, a new TaskManager or a
rescale (key groups move with their state) continues from it, so a unit never regains a step it used.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import numpy as np
from pyflink.common import Types
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from beam_dp.beam.shell.units import unit_key
from beam_dp.beam.shell.units_streaming import unit_steps
from beam_dp.core.unit_steps import Contribution, Folded, UnitState
from beam_dp.core.units import DROP_REASONS, UnitKeys, unit_id_problems
from beam_dp.flink.blocks import StepBlock
from beam_dp.flink.domains import operator_uid
from beam_dp.flink.gate import MAX_WATERMARK, MIN_WATERMARK, Gated
from beam_dp.flink.job import (
    BYTES_TYPE,
    DEAD_LETTERS,
    EVENT_TYPE,
    _Counts,
    check_sums,
    dead_json,
    gated,
    release_stream,
    to_event,
    watermarks,
)
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.steps.events import DETAIL, DeadLetter, Reason, parse_contribution

__all__ = ["UNIT_TYPE", "UnitStepsFunction", "UnitValue", "unit_event", "unit_release_stream"]

#: a hashed contribution: (unit hash as int64, stream, seconds, (step, clipped value, proven watermark ms))
UNIT_TYPE = Types.TUPLE([Types.LONG(), Types.STRING(), Types.DOUBLE(), Types.PICKLED_BYTE_ARRAY()])
_ALL_CLOSED = 2**62  # the first open step at the watermark +infinity


class UnitValue(NamedTuple):
    """The payload of a unit-level event: its value and its unit id (hashed at the first stage)."""

    value: Any
    unit: Any


def unit_event(stream_id: Any, seconds: float, value: Any, unit_id: Any) -> tuple:
    """A unit-level record of :data:`~beam_dp.flink.job.EVENT_TYPE` for ``env.from_collection``."""
    return to_event(stream_id, seconds, UnitValue(value, unit_id))


def _hex(unit: int) -> str:
    return f"{unit & (2**64 - 1):016x}"


class _HashUnits(ProcessFunction):
    """Events -> :data:`UNIT_TYPE` records (the unit id hashed under the job's key, read in ``open``);
    a bad id or a bad event to the dead letters, the id replaced by its hash (or None when it is the id
    that is bad), as on Beam (:class:`~beam_dp.beam.shell.units.UnitEvents`)."""

    def __init__(self, params: Any):
        self._params = params

    def open(self, runtime_context: RuntimeContext) -> None:
        params = self._params
        self._mechanism, self._clock = params.build_mechanism(), params.clock
        self._streams = frozenset(params.streams) if params.streams is not None else None
        self._keys = UnitKeys(unit_key(params.noise_key))
        self._column = params.privacy_unit.column
        self._counts = _Counts(runtime_context.get_metrics_group().add_group("beam_dp"), ("dead_letters",))

    def _letter(self, letter: DeadLetter) -> tuple:
        self._counts.letter(letter.reason)
        return DEAD_LETTERS, dead_json(letter, "parse")

    def process_element(self, value, ctx: ProcessFunction.Context) -> Iterator:
        stream, seconds, payload = value
        proven = MIN_WATERMARK
        if isinstance(payload, Gated):
            proven, payload = payload.watermark, payload.payload
        if not isinstance(payload, UnitValue):
            yield self._letter(DeadLetter(Reason.BAD_UNIT_ID, f"{DETAIL[Reason.BAD_UNIT_ID]}: the event has no "
                                          f"{self._column}", None, (stream, seconds, None, None)))
            return
        problems = unit_id_problems([payload.unit])
        if problems:
            detail = f"{DETAIL[Reason.BAD_UNIT_ID]}: {problems[0][1].replace('unit_id', self._column)}"
            yield self._letter(DeadLetter(Reason.BAD_UNIT_ID, detail, None, (stream, seconds, payload.value, None)))
            return
        unit = int(self._keys.hash([payload.unit]).view(np.int64)[0])
        parsed = parse_contribution((stream, seconds, payload.value), self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            yield self._letter(parsed._replace(element=(stream, seconds, payload.value, _hex(unit))))
            return
        stream, step, block = parsed
        yield unit, stream, seconds, (step, block.vector, proven)


def _first_open(steps: Any, watermark: int) -> int:
    """The first open step at a Flink watermark (ms): none yet (1: nothing is late), +infinity, or a step."""
    if watermark == MIN_WATERMARK:
        return 1
    if watermark >= MAX_WATERMARK:
        return _ALL_CLOSED
    return steps.first_open((watermark + 1) * 1000)


class UnitStepsFunction(KeyedProcessFunction):
    """Keyed by unit hash: :data:`UNIT_TYPE` records -> the changes of the unit's kept sums as
    ``(stream, seconds, StepBlock(step, ClippedSum))`` records; late contributions to the dead letters."""

    def __init__(self, params: Any):
        self._params = params

    def open(self, runtime_context: RuntimeContext) -> None:
        self._steps = unit_steps(self._params)
        self._column = self._params.privacy_unit.column
        self._state = runtime_context.get_state(ValueStateDescriptor("beam_dp_unit_state", BYTES_TYPE))
        self._counts = _Counts(runtime_context.get_metrics_group().add_group("beam_dp_units"),
                               ("kept", "dead_letters", *(f"dropped_{r}" for r in DROP_REASONS)))

    def _load(self) -> UnitState:
        data = self._state.value()
        return self._steps.state(None if data is None else bytes(data))

    def _store(self, state: UnitState, ctx) -> None:
        self._state.update(state.encode())
        if (timer := self._steps.timer(state)) is not None:
            ctx.timer_service().register_event_time_timer(-(-timer // 1000) - 1)

    def _count(self, folded: Folded) -> None:
        for reason, count in folded.drops.items():
            self._counts.add(f"dropped_{reason}", count)
        self._counts.add("kept", folded.kept)

    def process_element(self, value, ctx: KeyedProcessFunction.Context) -> Iterator:
        unit, stream, seconds, (step, vector, proven) = value
        watermark = max(ctx.timer_service().current_watermark(), proven)
        added = self._steps.add(self._load(), np.array([unit], np.int64).view(np.uint64)[0],
                                Contribution(step, stream, vector), _first_open(self._steps, watermark))
        self._count(added.folded)
        self._store(added.state, ctx)
        if added.late:
            self._counts.letter(Reason.LATE)
            letter = DeadLetter(Reason.LATE, f"step {step} was already closed for this unit", stream,
                                (stream, seconds, np.asarray(vector).tolist(), _hex(unit)))
            yield DEAD_LETTERS, dead_json(letter, "release")
        for delta in added.deltas:  # with this record's timestamp: never behind the watermark
            yield delta.stream, seconds, StepBlock(delta.step, ClippedSum(delta.value, 1, 0))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Iterator:
        watermark = max(ctx.timer_service().current_watermark(), timestamp)
        state, folded = self._steps.closed(self._load(), np.array([ctx.get_current_key()], np.int64).view(np.uint64)[0],
                                           _first_open(self._steps, watermark))
        self._count(folded)
        self._store(state, ctx)
        yield from ()


def check_units(params: Any) -> None:
    """Refuse (``ValueError``, one line) params that are not unit-level continual sums with a clock."""
    check_sums(params)
    if getattr(params, "privacy_unit", None) is None:
        raise ValueError("unit_release_stream takes unit-level params: ContinualSumParams(...).with_privacy_unit(unit)")


def unit_release_stream(env: StreamExecutionEnvironment, events, params: Any, *, uid: str | None = None,
                        max_delay_ms: int = 0, idle_ms: int | None = None, stamp: bool = True):
    """Unit-level ``events`` (:func:`unit_event` records) -> ``(releases, dead_letters)``, JSON strings, as
    :func:`~beam_dp.flink.job.release_stream` (its ``uid``, ``max_delay_ms``, ``idle_ms`` and ``stamp``);
    ``params``: Beam unit-level sum params (``ContinualSumParams`` or ``WindowedSumParams`` ``.with_privacy_unit``).
    The unit stages' operator uids are the release function's plus ``/units`` (``/units/gate``,
    ``/units/hash``): a savepoint restores each unit's state into them."""
    check_units(params)
    operator = operator_uid(params.noise_key.domain or uid or "") + "/units"
    events = events.assign_timestamps_and_watermarks(watermarks(max_delay_ms, idle_ms))
    if env.get_config().get_auto_watermark_interval() > 0:  # streaming: a new unit opens where proven
        events = gated(env, events, params, operator, idle_ms)
    hashed = events.process(_HashUnits(params), output_type=UNIT_TYPE).uid(f"{operator}/hash").name(f"{operator}/hash")
    blocks = (hashed.key_by(lambda record: record[0], key_type=Types.LONG())
              .process(UnitStepsFunction(params), output_type=EVENT_TYPE).uid(operator).name(operator))
    releases, dead = release_stream(env, blocks, params, uid=uid, idle_ms=idle_ms, stamp=stamp, units=True)
    return releases, dead.union(hashed.get_side_output(DEAD_LETTERS), blocks.get_side_output(DEAD_LETTERS))
