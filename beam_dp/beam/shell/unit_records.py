"""Privacy units for the per-record families: at most ``k`` records per unit.

::

    records ─ UnitRecordIds (hash the unit id, strip it) ─┬─ dead_letter (bad_unit_id; no clear id)
                                                          └─ KeepUnitRecords (keyed by unit hash) ─ records

A per-record family (ERM, growing databases, online learners, incremental regression, lifelong
learners) protects one record; bounded to at most ``max_records`` records per privacy unit, it protects
one unit by group privacy (:mod:`beam_dp.core.group_privacy`), calibrated at the record-level budget
:func:`~beam_dp.core.group_privacy.record_budget` gives. The unit id is read from each record (a mapping
key, a row attribute, or a tuple's last item), hashed under the job's secret key and dropped: the family
gets its records as they would come without a unit, and the clear id never reaches a shuffle, state or a
dead letter. Per unit the first ``max_records`` records in the order the engine delivers them are kept
(arrival order: it does not depend on the records' values, so which *positions* a unit keeps is the same
in two inputs that differ in its values only); the rest are dropped, counted (Beam counter
``beam_dp/units:dropped_over_records``), never released nor written. A kept record keeps its event
timestamp; the stage holds no timers, so it delays nothing on a streaming job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Iterator, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_dp.beam.shell.units import unit_key
from beam_dp.core.budget import JobBudget, composition_of
from beam_dp.core.group_privacy import RecordUnit
from beam_dp.core.units import UnitKeys, unit_id_problems
from beam_dp.steps.events import DEAD_LETTER, DETAIL, DeadLetter, Reason

__all__ = ["BoundUnitRecords", "KeepUnitRecords", "RecordUnit", "UnitRecordIds", "with_record_unit"]

_NAMESPACE = "beam_dp/units"


def _split(element: Any, column: str) -> tuple[Any, Any, Any]:
    """``(unit id, the record without it, the record with the id slot emptied for a dead letter)``."""
    if isinstance(element, tuple) and not hasattr(element, "_fields"):
        if not element:
            return None, element, element
        return element[-1], element[:-1], element[:-1] + (None,)
    if isinstance(element, Mapping):
        rest = {k: v for k, v in element.items() if k != column}
        return element.get(column), rest, dict(rest, **{column: None})
    if hasattr(element, "_asdict") or hasattr(element, "as_dict"):
        fields = element._asdict() if hasattr(element, "_asdict") else element.as_dict()
        rest = {k: v for k, v in fields.items() if k != column}
        return fields.get(column), beam.Row(**rest), dict(rest, **{column: None})
    return None, element, None


class UnitRecordIds(beam.DoFn):
    """Records → ``(unit hash as int64, record without the id)``; a bad id to ``dead_letter``."""

    def __init__(self, unit: RecordUnit, noise_key: Any):
        self._unit = unit
        self._noise_key = noise_key

    def setup(self) -> None:
        self._keys = UnitKeys(unit_key(self._noise_key))
        self._dead = Metrics.counter(_NAMESPACE, "dead_letters")
        self._elements = Metrics.counter(_NAMESPACE, "elements")  # accepted records (what a job counts as read)

    def process(self, element: Any) -> Iterator:
        unit, rest, redacted = _split(element, self._unit.column)
        problems = unit_id_problems([unit])
        if problems:
            self._dead.inc()
            detail = f"{DETAIL[Reason.BAD_UNIT_ID]}: {problems[0][1].replace('unit_id', self._unit.column)}"
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(Reason.BAD_UNIT_ID, detail, None, redacted))
            return
        self._elements.inc()
        yield int(self._keys.hash([unit]).view(np.int64)[0]), rest


class KeepUnitRecords(beam.DoFn):
    """Records keyed by unit hash → each unit's first ``max_records`` (at their own timestamps); the rest
    counted, never emitted. State per unit: one count, kept for good (a unit that used its ``k`` records
    never regains one: across bundles, restarts, restores and rescales, as the runner keeps keyed state)."""

    RECORDS = ReadModifyWriteStateSpec("records", VarIntCoder())

    def __init__(self, max_records: int):
        self._max = max_records

    def setup(self) -> None:
        self._kept = Metrics.counter(_NAMESPACE, "kept")
        self._dropped = Metrics.counter(_NAMESPACE, "dropped_over_records")

    def process(self, keyed: tuple[int, Any], records=beam.DoFn.StateParam(RECORDS)) -> Iterator:
        count = records.read() or 0
        if count >= self._max:
            self._dropped.inc()
            return
        records.write(count + 1)
        self._kept.inc()
        yield keyed[1]


class BoundUnitRecords(beam.PTransform):
    """Records with a unit field → ``(records bounded to max_records per unit, without the field;
    dead letters)``, on a batch replay and on a streaming job alike (first records by arrival)."""

    def __init__(self, unit: RecordUnit, noise_key: Any, label: str | None = None):
        super().__init__(label)
        if not isinstance(unit, RecordUnit):
            raise TypeError(f"privacy_unit must be a RecordUnit, got {type(unit).__name__}")
        self.unit = unit
        self.noise_key = noise_key

    def expand(self, records):
        ids = records | "UnitIds" >> beam.ParDo(UnitRecordIds(self.unit, self.noise_key)).with_output_types(
            Tuple[int, Any]).with_outputs(
            DEAD_LETTER, main="records")
        kept = ids.records | "KeepRecords" >> beam.ParDo(KeepUnitRecords(self.unit.max_records))
        return kept, ids[DEAD_LETTER]


def with_record_unit(params: Any, unit: RecordUnit, composition: str | None = None) -> Any:
    """``params`` (a per-record family's: ``epsilon``, ``delta``, ``budget`` and ``privacy_unit`` fields)
    protecting one privacy unit of at most ``unit.max_records`` records as they protected one record: their
    budget share (one for the transform alone if they have none) becomes the unit's
    (:meth:`~beam_dp.core.budget.BudgetShare.per_unit`) and the mechanism is calibrated at its record-level
    budget, so every row reports the unit's spend as the job's and declares ``privacy_unit`` and
    ``max_records`` in its meta. ``composition``: how the family's releases compose (default: its mechanism's)."""
    if not isinstance(unit, RecordUnit):
        raise TypeError(f"privacy_unit must be a RecordUnit, got {type(unit).__name__}")
    if getattr(params, "privacy_unit", None) is not None:
        raise ValueError("these params protect a privacy unit already")
    share = params.budget
    if share is None:
        comp = composition or composition_of(params.build_mechanism())
        share = JobBudget(params.epsilon, params.delta).plan({"transform": (comp, params.epsilon, params.delta)})[
            "transform"]
    return dataclasses.replace(params, privacy_unit=unit, **share.per_unit(unit.max_records).params())
