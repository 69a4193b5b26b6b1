"""The privacy-unit stage of a continual sum on Beam streaming (user-level DP; ``docs/privacy_units.md``).

::

    UnitEvents ─ (unit hash, (stream, step, value)) ─ WatermarkGate (by stream) ─ UnitStepsDoFn (by unit hash)
        ─┬─ ((stream, step), ClippedSum): each unit's kept sums, as changes ─ the release stage
         └─ dead_letter (late, with the unit's hash, never its id)

Per unit (keyed by its keyed hash, an int64) :class:`UnitStepsDoFn` keeps one
:class:`~beam_dp.core.unit_steps.UnitState` in Beam state (its ledger row for its closed steps and the
candidate contributions of its open steps: bytes, never a clear id) and calls
:class:`~beam_dp.core.unit_steps.UnitSteps`, the logic the Flink stage shares: the batch replay's
bounding, unit by unit, in step order. Each on-time contribution re-bounds the unit's open steps and the
changes of its kept sums leave at once, with the contribution's own timestamp (the gate's stamp): an
element in flight holds the release stage's watermark below that stamp, so the release stage has not
closed any step they belong to, on every runner, with no timer hold (the DirectRunner has none). The
release stage sums them per (stream, step) into the units' bounded sums.

The gate's stamp ``close(f)`` proves the watermark passed every step before ``f``: those steps of the
unit are folded into its row (and by an event-time timer at its lowest open step's close, so an idle
unit keeps only its row), and a contribution to a step before ``f`` or not after the last folded step
is a ``late`` dead letter (a unit key new on this worker opens where the watermark is proven, as a
stream key does). The state is keyed state: it outlives restarts, new workers and rescales, so a unit
never regains a step it used. Drops are counted when their step closes, as the batch stage counts them
(``beam_dp/units``).
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam.shell.dofn import WatermarkGate
from beam_dp.beam.shell.units import unit_key
from beam_dp.core.unit_steps import Contribution, Folded, UnitState, UnitSteps
from beam_dp.core.units import DROP_REASONS, UnitKeys
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, Reason

__all__ = ["BoundUnitStream", "UnitStepsDoFn"]

_NAMESPACE = "beam_dp/units"


def unit_steps(params: Any) -> UnitSteps:
    """The per-unit step logic of unit-level sum ``params``, on the worker (reads the job's secret key)."""
    return UnitSteps(params.unit_bounds(), UnitKeys(unit_key(params.noise_key)), params.clip_bound, params.clock,
                     params.allowed_lateness)


def _as_uint64(unit: int) -> np.uint64:
    return np.array([unit], np.int64).view(np.uint64)[0]


class UnitStepsDoFn(beam.DoFn):
    """``(unit hash, (stream, step, value))`` stamped by a :class:`WatermarkGate` → the changes of the unit's
    kept ``((stream, step), ClippedSum)``; late contributions to ``dead_letter`` (module docstring)."""

    STATE = ReadModifyWriteStateSpec("unit_state", BytesCoder())
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)

    def __init__(self, params: Any):
        self._params = params

    def setup(self) -> None:
        self._steps = unit_steps(self._params)
        self._period = self._params.clock.period_micros
        self._column = self._params.privacy_unit.column
        self._drops = {reason: Metrics.counter(_NAMESPACE, f"dropped_{reason}") for reason in DROP_REASONS}
        self._kept = Metrics.counter(_NAMESPACE, "kept")
        self._late = Metrics.counter(_NAMESPACE, "dead_letters")

    def process(self, element: tuple[int, Any], timestamp=beam.DoFn.TimestampParam,
                state=beam.DoFn.StateParam(STATE), close=beam.DoFn.TimerParam(CLOSE)) -> Iterator:
        unit, (stream, step, value) = element
        steps = self._steps
        # the gate's stamp close(f) proves the watermark passed close(f - 1): f is the first open step
        added = steps.add(steps.state(state.read()), _as_uint64(unit), Contribution(step, stream, value),
                          steps.first_open(timestamp.micros - self._period))
        self._count(added.folded)
        self._store(added.state, state, close)
        if added.late:
            self._late.inc()
            letter = {"stream_id": stream, "step": step, "value": np.asarray(value).tolist(),
                      self._column: f"{unit & (2**64 - 1):016x}"}
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(Reason.LATE, f"step {step} was already closed "
                                                                   "for this unit", stream, letter))
        for delta in added.deltas:  # at the element's own timestamp: never behind the watermark
            yield (delta.stream, delta.step), ClippedSum(delta.value, 1, 0)

    @on_timer(CLOSE)
    def on_close(self, fired=beam.DoFn.TimestampParam, key=beam.DoFn.KeyParam,
                 state=beam.DoFn.StateParam(STATE), close=beam.DoFn.TimerParam(CLOSE)) -> None:
        steps = self._steps
        folded, counts = steps.closed(steps.state(state.read()), _as_uint64(key), steps.first_open(fired.micros))
        self._count(counts)
        self._store(folded, state, close)

    def _store(self, unit_state: UnitState, state, close) -> None:
        state.write(unit_state.encode())
        if (timer := self._steps.timer(unit_state)) is not None:
            close.set(Timestamp(micros=timer))

    def _count(self, folded: Folded) -> None:
        for reason, count in folded.drops.items():
            if count:
                self._drops[reason].inc(count)
        if folded.kept:
            self._kept.inc(folded.kept)


def _by_stream(element: tuple[int, Any]) -> tuple[str, Any]:
    unit, (stream, step, value) = element
    return stream, (unit, step, value)


def _by_unit(element: tuple[str, Any]) -> tuple[int, Any]:
    stream, (unit, step, value) = element
    return unit, (stream, step, value)


class BoundUnitStream(beam.PTransform):
    """Streaming: :class:`~beam_dp.beam.shell.units.UnitEvents`' ``(unit hash, (stream, step, value))`` →
    ``(blocks, dead_letter)``: the changes of each unit's kept ``((stream, step), ClippedSum)``, whose sum
    per (stream, step) is the units' bounded sum (module docstring)."""

    def __init__(self, params: Any, label: str | None = None):
        super().__init__(label)
        self._params = params

    def expand(self, events: beam.PCollection):
        gated = (events | "By stream" >> beam.Map(_by_stream).with_output_types(Tuple[str, Any])
                 | "Unit watermark gate" >> WatermarkGate(self._params))
        out = (gated | "By unit" >> beam.Map(_by_unit).with_output_types(Tuple[int, Any])
               | "Unit steps" >> beam.ParDo(UnitStepsDoFn(self._params)).with_outputs(DEAD_LETTER, main="blocks"))
        return out.blocks, out[DEAD_LETTER]
