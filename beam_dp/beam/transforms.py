"""Public transforms: ``ContinualSum``, ``ContinualCount``, ``WindowedSum``.

Each takes a frozen params dataclass and returns a :class:`ContinualOutputs` with two
PCollections: ``releases`` (schema'd :class:`~beam_dp.io.ReleaseRow`, one per stream per step)
and ``dead_letter`` (:class:`~beam_dp.beam.events.DeadLetter`: reason, value-free detail, element).

Shape of the pipeline::

    events ─ Parse (validate, step, clip) ─┬─ dead_letter
                                            └─ [batch: CombinePerKey((stream, step))] ─ stateful DoFn ─ releases

On a bounded input (batch replay) contributions are pre-aggregated per (stream, step) by a
lifted combiner (keyed by stream groups: summed per bundle in Parse itself, and the bundles' blocks of
a step added as the release stage takes them), so the mechanism sees one block per step. On an unbounded input each contribution
reaches the stateful DoFn on its own, so a late one can be dead-lettered whole; an on-time one is
merged into its step's sum in state as it arrives (``beam_dp.beam.dofn.SummingBuffer``: one sum per
open step, O(d), whatever the number of events).

With ``params.stream_groups`` the stateful DoFn is keyed by group of streams
(``beam_dp.mechanisms.stream_groups``): blocks are per (group, step), each group steps in one numpy
operation, and ``releases`` is a PCollection of :class:`~beam_dp.io.ReleaseColumns` (one per group and
step; the same releases and values as keyed by stream). Write them with the sinks' ``columnar=True``,
turn them into rows with ``beam.FlatMap(ReleaseColumns.rows)`` or into Arrow tables with
:func:`~beam_dp.io.release_table`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import PCollection

from beam_dp.beam.batch_release import release_stage
from beam_dp.beam.domains import bind_noise_domain, release_labels
from beam_dp.beam.params import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.beam.parse import DEAD_LETTER, MergeClippedSums, ParseEvents
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of
from beam_dp.steps.events import EventBatch
from beam_dp.steps.schema import ReleaseColumns, ReleaseRow

__all__ = ["ContinualCount", "ContinualOutputs", "ContinualSum", "WindowedSum"]

beam.coders.registry.register_coder(ReleaseRow, beam.coders.RowCoder)


class ContinualOutputs(NamedTuple):
    releases: PCollection
    dead_letter: PCollection


def _by_stream(keyed_block):
    (stream, step), block = keyed_block
    return stream, (step, block, None)


class _ContinualRelease(beam.PTransform):
    """Shared expansion of the continual transforms (see the module docstring)."""

    def __init__(self, params: Any, pre_aggregate: bool | None = None, label: str | None = None):
        super().__init__(label)
        self.params = params
        self.pre_aggregate = pre_aggregate

    def expand(self, events: PCollection) -> ContinualOutputs:
        params = bind_noise_domain(self.params, events)
        bounded = bool(getattr(events, "is_bounded", True))
        if params.event_time and bounded and params.clock.last_step is None:
            raise ValueError("a batch replay with event-time steps needs a public end: StepClock(..., end=...)")
        aggregate = params.event_time and (bounded if self.pre_aggregate is None else self.pre_aggregate)
        groups = getattr(params, "stream_groups", None)
        block_type = ClippedSum if groups is None else GroupBlock
        # typed keys get deterministic coders; typed blocks the block coder (beam_dp.io.coders)
        parsed = events | "Parse" >> beam.ParDo(ParseEvents(params, aggregate)).with_output_types(
            Tuple[Tuple[str, int], block_type] if aggregate else Tuple[str, Any]).with_outputs(
            DEAD_LETTER, main="blocks")
        blocks = parsed.blocks
        if aggregate:
            # keyed by stream: a lifted combiner; keyed by groups: Parse summed each bundle already
            # (BundleGroupSums), and the release stage adds a group's blocks of one step as they come
            # (batch_release: one shuffle, not one per (group, step) and one per group)
            if groups is None:
                blocks = blocks | "PreAggregate" >> beam.CombinePerKey(MergeClippedSums()).with_output_types(
                    Tuple[Tuple[str, int], block_type])
            blocks = blocks | "ByStream" >> beam.Map(_by_stream).with_output_types(
                Tuple[str, Tuple[int, block_type, Any]])
        restored = [stream for stream, _ in (getattr(params, "restore_states", None) or ())]
        declared_streams = sorted(set(params.streams or ()) | set(restored))
        if declared_streams:  # declared and restored streams release every step, data or not
            declared = events.pipeline | "DeclareStreams" >> beam.Create(
                _declarations(declared_streams, groups, params.dim)).with_output_types(Tuple[str, Any])
            blocks = (blocks, declared) | "WithDeclared" >> beam.Flatten()
        # the group count is in the stateful step's label: Dataflow refuses an --update that drops a
        # step (a changed count) unless mapped; a mapped one meets the count recorded in each key's state
        release = "Release" if groups is None else f"Release {groups} stream groups"
        # a batch replay: a GroupByKey and each key released in one call (every shuffled element stays one
        # (key, step) block); a stream: the stateful shell
        released = release_stage(blocks, params, release, bounded,
                                 rows_type=None if groups is None else ReleaseColumns)
        labels = release_labels(params)
        if groups is None:
            rows = released.rows | "Rows" >> beam.Map(labels).with_output_types(ReleaseRow)
        else:
            rows = released.rows | "Labels" >> beam.Map(lambda columns: columns._replace(labels=labels)).with_output_types(
                ReleaseColumns)
        dead = (parsed[DEAD_LETTER], released[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return ContinualOutputs(rows, dead)


def _declarations(streams: list[str], groups: int | None, dim: int) -> list[tuple[str, Any]]:
    """The elements that declare ``streams``: one per stream, or one ``GroupBlock`` per group."""
    if groups is None:
        return [(s, (0, None, None)) for s in streams]
    by_group: dict[int, list[str]] = {}
    for stream in streams:
        by_group.setdefault(group_of(stream, groups), []).append(stream)
    return [(group_key(g), (0, GroupBlock.declaring(names, dim), None)) for g, names in sorted(by_group.items())]


class ContinualSum(_ContinualRelease):
    """Private running sum of vector contributions per stream, released at every step.

    Guarantee: each contribution (event level, replace-one) is epsilon-DP (Gamma/K-norm noise) or
    (epsilon, delta)-DP (Gaussian) over the whole, unbounded release sequence. Contributions are
    clipped to L2 norm ``clip_bound``. Public: the step schedule, the stream set, release times.
    """

    def __init__(self, params: ContinualSumParams, pre_aggregate: bool | None = None, label: str | None = None):
        if not isinstance(params, ContinualSumParams):
            raise TypeError("ContinualSum takes a ContinualSumParams")
        super().__init__(params, pre_aggregate, label)


class WindowedSum(_ContinualRelease):
    """Private running sum with privacy expiration (window tree): each contribution is protected
    while fewer than ``window`` (rounded up to a power of two) later steps have been released;
    afterwards it appears un-noised in later releases (window DP)."""

    def __init__(self, params: WindowedSumParams, pre_aggregate: bool | None = None, label: str | None = None):
        if not isinstance(params, WindowedSumParams):
            raise TypeError("WindowedSum takes a WindowedSumParams")
        super().__init__(params, pre_aggregate, label)


def _as_unit_event(element: Any, event_time: bool) -> Any:
    """Replace an event's value by 1.0; leave anything unrecognisable for Parse to dead-letter."""
    if isinstance(element, EventBatch):
        return EventBatch(element.stream_ids, element.timestamps, np.ones((len(element), 1)))
    if isinstance(element, tuple) and not hasattr(element, "_fields") and len(element) in (2, 3):
        if len(element) == 3 or event_time:
            return (element[0], element[1], 1.0)
        return (element[0], 1.0)
    if isinstance(element, dict) and "stream_id" in element:
        return {"stream_id": element["stream_id"], "timestamp": element.get("timestamp"), "value": 1.0}
    if hasattr(element, "stream_id"):
        return {"stream_id": element.stream_id, "timestamp": getattr(element, "timestamp", None), "value": 1.0}
    return element


class ContinualCount(beam.PTransform):
    """Private running count of events per stream (a ``ContinualSum`` of 1 per event).

    Elements: ``(stream_id, timestamp)``, ``(stream_id, timestamp, anything)``, mappings/rows with
    ``stream_id`` and ``timestamp``, or ``EventBatch``. Same guarantee as ``ContinualSum`` with
    sensitivity 2 (replace-one).
    """

    def __init__(self, params: ContinualCountParams, pre_aggregate: bool | None = None, label: str | None = None):
        super().__init__(label)
        if not isinstance(params, ContinualCountParams):
            raise TypeError("ContinualCount takes a ContinualCountParams")
        self.params = params
        self.pre_aggregate = pre_aggregate

    def expand(self, events: PCollection) -> ContinualOutputs:
        units = events | "AsUnit" >> beam.Map(_as_unit_event, self.params.event_time)
        return units | "Sum" >> _ContinualRelease(self.params.as_sum_params(), self.pre_aggregate)
