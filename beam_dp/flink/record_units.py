"""Privacy units of the per-record families on native Flink: at most ``k`` records per unit, ahead of the family.

    releases, snapshots, dead = family_stream(env, events, with_record_unit(params, RecordUnit("user", 8)))

::

    events (stream, seconds, Elements: raw elements with the unit field) ─ RecordUnitIds (hash the id, strip it;
        one element per record; bad id → dead letter) ─ key_by(unit hash) ─ KeepRecordsFunction (ValueState
        count per unit) ─ (stream, seconds, Elements without the id) ─ the family's operator (keyed by stream)

The Beam stage's rules (:mod:`beam_dp.beam.shell.unit_records`, whose ``DoFn`` objects run here, one element
at a time): the unit id is read from each raw element (a mapping key, a row attribute or a tuple's last item),
hashed under the job's secret key and dropped before the shuffle, so the clear id never reaches a shuffle,
state, a checkpoint or a dead letter (``bad_unit_id``, stage ``parse``, the id slot emptied). Per unit the
first ``max_records`` records by arrival at the keyed operator are kept and the rest dropped (metric
``beam_dp.dropped_over_records``), never released nor written. The count is keyed ``ValueState``: kept in
checkpoints and savepoints and moved with its key group on a rescale, so a unit that used its ``k`` records
never regains one after a restore. A growing database's queries carry no unit and pass by. The records keep
their ``seconds``; the family's operator assigns the watermarks after this stage (on Kafka the shuffle by
unit may reorder a stream's records: give ``--max-delay-ms`` for it).
"""

from __future__ import annotations

from typing import Any, Iterator

from apache_beam.pvalue import TaggedOutput
from pyflink.common import Types
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from beam_dp.beam.shell.unit_records import KeepUnitRecords, UnitRecordIds
from beam_dp.flink.job import DEAD_LETTERS, EVENT_TYPE, _Counts, dead_json

__all__ = ["HASHED_TYPE", "KeepRecordsFunction", "RecordUnitIds", "bound_unit_records"]

#: one element with its unit hashed: (unit hash as int64, stream, seconds, Elements of that one element)
HASHED_TYPE = Types.TUPLE([Types.LONG(), Types.STRING(), Types.DOUBLE(), Types.PICKLED_BYTE_ARRAY()])
QUERIES = "queries"  # the second input of a growing database: its queries, public, no unit


class _Metric:
    """A Beam counter of the unit stage's ``DoFn`` counted in the operator's ``beam_dp`` metrics (PyFlink's
    harness would report a Beam metric under a namespace Flink cannot parse)."""

    def __init__(self, counts: _Counts, name: str) -> None:
        self._counts, self._name = counts, name

    def inc(self, n: int = 1) -> None:
        self._counts.add(self._name, n)


def _flink_metrics(dofn: Any, runtime_context: RuntimeContext) -> _Counts:
    """``dofn``'s Beam counters (set by its ``setup``) -> this operator's ``beam_dp`` metrics."""
    counts = _Counts(runtime_context.get_metrics_group().add_group("beam_dp"), ())
    for name, metric in list(vars(dofn).items()):
        if hasattr(metric, "metric_name"):
            setattr(dofn, name, _Metric(counts, metric.metric_name.name))
    return counts


class RecordUnitIds(ProcessFunction):
    """``(stream, seconds, Elements)`` -> one :data:`HASHED_TYPE` record per element (its unit hashed, the id
    dropped: Beam's :class:`~beam_dp.beam.shell.unit_records.UnitRecordIds`); a bad id to the dead letters."""

    def __init__(self, params: Any):
        self._unit, self._noise_key = params.privacy_unit, params.noise_key

    def open(self, runtime_context: RuntimeContext) -> None:
        self._ids = UnitRecordIds(self._unit, self._noise_key)
        self._ids.setup()
        self._counts = _flink_metrics(self._ids, runtime_context)

    def process_element(self, value, ctx: ProcessFunction.Context) -> Iterator:
        stream, seconds, records = value
        for element in records.elements:
            for out in self._ids.process(element):
                if isinstance(out, TaggedOutput):
                    self._counts.add(f"dead_letters_{out.value.reason}")
                    yield DEAD_LETTERS, dead_json(out.value, "parse")
                else:
                    unit, rest = out
                    yield unit, stream, seconds, records._replace(elements=(rest,))


class _Count:
    """A Flink ``ValueState`` as the Beam state ``KeepUnitRecords`` reads and writes."""

    def __init__(self, state) -> None:
        self._state = state

    def read(self) -> int | None:
        return self._state.value()

    def write(self, count: int) -> None:
        self._state.update(count)


class KeepRecordsFunction(KeyedProcessFunction):
    """Keyed by unit hash: each unit's first ``max_records`` records (Beam's
    :class:`~beam_dp.beam.shell.unit_records.KeepUnitRecords` over a checkpointed ``ValueState`` count),
    emitted as :data:`~beam_dp.flink.job.EVENT_TYPE` records for the family's operator."""

    def __init__(self, max_records: int):
        self._max = max_records

    def open(self, runtime_context: RuntimeContext) -> None:
        self._keep = KeepUnitRecords(self._max)
        self._keep.setup()
        _flink_metrics(self._keep, runtime_context)
        self._count = _Count(runtime_context.get_state(ValueStateDescriptor("beam_dp_unit_records", Types.INT())))

    def process_element(self, value, ctx: KeyedProcessFunction.Context) -> Iterator:
        unit, stream, seconds, records = value
        for _ in self._keep.process((unit, None), records=self._count):
            yield stream, seconds, records


def _is_query(event: tuple) -> bool:
    return getattr(event[2], "kind", None) == QUERIES


def bound_unit_records(events, params: Any, operator: str):
    """``events`` of a family with ``params.privacy_unit`` -> ``(events bounded to max_records per unit, without
    the unit field; their dead letters)``. ``operator``: the family's operator uid; the unit stages' are it plus
    ``/units/ids`` and ``/units`` (a savepoint restores each unit's count into them)."""
    units = f"{operator}/units"
    ids = (events.filter(lambda event: not _is_query(event))
           .process(RecordUnitIds(params), output_type=HASHED_TYPE).uid(f"{units}/ids").name(f"{units}/ids"))
    kept = (ids.key_by(lambda record: record[0], key_type=Types.LONG())
            .process(KeepRecordsFunction(params.privacy_unit.max_records), output_type=EVENT_TYPE)
            .uid(units).name(units))
    return kept.union(events.filter(_is_query)), ids.get_side_output(DEAD_LETTERS)
