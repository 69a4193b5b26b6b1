"""What one step means for each family, for :class:`~beam_dp.steps.driver.StepDriver`.

A policy owns the ``mechanism`` and the noise source and answers four questions: how many
contributions an item holds (``count``), how a closed step is fed (``close``: returns the new
state, the releases and any dead letters), why a closed step's item is refused (``late``), and
what happens to items carried across steps when a call ends (``begin`` / ``end``).

* :class:`BlockPolicy` — one input, blocks merged per step (sums, counts, learners, ERM);
* :class:`TaskPolicy` — lifelong learning: step ``i`` is the ``i``-th declared task, closed by a
  task marker or the end of the input;
* :class:`GrowingPolicy` — growing databases: elements buffered by step, queries carried until the
  database reaches their size;
* :class:`GroupPolicy` — a group of streams under one key (``beam_dp.mechanisms.stream_groups``):
  ``admit`` joins the streams named by any buffered item before a call closes steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_ahead import NoiseAhead, StepsAhead
from beam_dp.steps.driver import SNAPSHOTS, Output
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, Reason
from beam_dp.steps.schema import release_to_row

__all__ = ["BlockPolicy", "GroupPolicy", "GrowingPolicy", "RecordRows", "TaskPolicy", "plan_block", "split_rows"]


@dataclass(frozen=True)
class RecordRows:
    """Records of one stream in arrival order, each already validated by the mechanism's ``record``:
    features ``(k, d)`` and labels ``(k,)``. A block of ``k`` count-step contributions for a mechanism
    that takes one record per contribution (the online learners, incremental regression): the driver
    cuts it at step boundaries and :class:`BlockPolicy` hands each step its records one by one."""

    features: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(np.shape(self.labels)[0])

    def records(self) -> list:
        return list(zip(self.features, self.labels.tolist()))


class BlockPolicy:
    """A continual mechanism fed one merged block per step (``None`` for an empty step); a
    :class:`RecordRows` item counts one contribution per record and is fed as its records. A call that
    closes several steps draws the noise of those a mechanism names per step (``NodeNoise.draw_step``:
    the window tree's nodes) ahead (:class:`~beam_dp.core.noise_ahead.StepsAhead`: the same values)."""

    timed_rows = True  # rows carry the step's public event-time interval
    #: steps whose named noise cells a call draws at once (~500 cells: the per-cell cost levels off there)
    AHEAD = 256

    def __init__(self, mechanism: Any, noise: NoiseSource):
        self.mechanism, self.noise = mechanism, noise

    def count(self, item: Any) -> int:
        return len(item) if isinstance(item, RecordRows) else self.mechanism.block_count(item)

    def split(self, item: Any, k: int) -> tuple[Any, Any]:
        """The first ``k`` contributions of a block of rows (count steps) and the rest."""
        return split_rows(item, k)

    def late(self, step: int) -> tuple[str, str]:
        return Reason.LATE, f"step {step} was already released"

    def close(self, key: str, state: Any, step: int, items: list, context: Any) -> tuple[Any, list, list]:
        if any(isinstance(item, RecordRows) for item in items):
            items = [record for item in items for record in (
                [self.mechanism.record(*r) for r in item.records()] if isinstance(item, RecordRows) else [item])]
        block = self.mechanism.merge_blocks(items) if items else None
        state, releases = self.mechanism.step(state, block, self.noise if context is None else context)
        return state, releases, []

    def begin(self, carried: list, steps: int = 1) -> StepsAhead:
        """The context of one call that closes ``steps`` steps (``carried``: the items kept across steps)."""
        return StepsAhead(self.noise, min(steps, self.AHEAD))

    def end(self, key: str, state: Any, context: Any, finished: bool) -> tuple[list, list]:
        return [], []


class GroupPolicy(BlockPolicy):
    """A :class:`~beam_dp.mechanisms.stream_groups.GroupedSum` fed one merged ``GroupBlock`` per step.

    The driver calls ``admit`` with every buffered item (blocks and carried declarations) before it
    closes steps, so a stream joins at the first step its group closes after its first item arrived;
    declarations are consumed there. A call that closes several steps draws their noise ahead
    (:class:`~beam_dp.core.noise_ahead.NoiseAhead`: the same values, fewer array draws)."""

    #: steps whose noise a call draws at once (``NoiseAhead``): 64 steps of a group's streams
    AHEAD = 64

    def admit(self, state: Any, items: list) -> Any:
        return self.mechanism.join(state, set().union(*(item.streams for item in items)))  # one C-level union

    def begin(self, carried: list, steps: int = 1) -> NoiseAhead:
        return NoiseAhead(self.noise, min(steps, self.AHEAD))

    def close(self, key: str, state: Any, step: int, items: list, noise: NoiseAhead) -> tuple[Any, list, list]:
        block = self.mechanism.merge_blocks(items) if items else None
        state, releases = self.mechanism.step(state, block, noise)
        return state, releases, []


class TaskPolicy(BlockPolicy):
    """Lifelong learning: step ``i`` trains on the ``i``-th of ``task_ids`` (rows of ``input_dim``)."""

    timed_rows = False
    TASK_BACKWARDS = "task_backwards"

    def __init__(self, mechanism: Any, noise: NoiseSource, task_ids: tuple[str, ...], input_dim: int):
        super().__init__(mechanism, noise)
        self.task_ids, self.input_dim = tuple(task_ids), input_dim

    def late(self, step: int) -> tuple[str, str]:
        return self.TASK_BACKWARDS, "the task is already closed"

    def close(self, key: str, state: Any, step: int, items: list, context: Any) -> tuple[Any, list, list]:
        from beam_dp.mechanisms.lifelong.config import TaskData

        task_id = self.task_ids[step - 1]
        items = items or [TaskData(task_id, np.zeros((0, self.input_dim)), np.zeros(0, np.int64))]
        state, releases = self.mechanism.step(state, self.mechanism.merge_blocks(items), self.noise)
        return state, releases, []


def split_rows(item: Any, k: int) -> tuple[Any, Any]:
    """A block of rows (a frozen dataclass of arrays sharing their first axis, e.g. ``LabelledRows``)
    cut after row ``k``: ``(rows[:k], rows[k:])``. A block that is not rows (a sum) cannot be cut:
    ``TypeError``."""
    if not dataclasses.is_dataclass(item) or not hasattr(item, "__len__"):
        raise TypeError(f"a {type(item).__name__} is not a block of rows: it cannot be split across count steps")
    parts = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    return (type(item)(**{name: value[:k] for name, value in parts.items()}),
            type(item)(**{name: value[k:] for name, value in parts.items()}))


def plan_block(size: int, items: Iterable[tuple[int, int]], queries: Iterable[tuple]) -> tuple[Any, list, list]:
    """One closed step of a growing database: elements ``(micros, index)`` (one element, or a block:
    two equal-length arrays) sorted by time then index; the queries ``(t, query_id, weights, ...)``
    with ``size ≤ t ≤ size + len(elements)`` in ``(t, query_id)`` order. Returns the block, the queries
    kept for later and those already passed."""
    from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query

    items = list(items)
    micros = np.concatenate([np.atleast_1d(np.asarray(m, dtype=np.int64)) for m, _ in items]) if items else np.zeros(0)
    index = np.concatenate([np.atleast_1d(np.asarray(i, dtype=np.int64)) for _, i in items]) if items else np.zeros(0)
    elements = index[np.lexsort((index, micros))].astype(np.int64)  # by time, ties by index
    top = size + len(elements)
    now, later, passed = [], [], []
    for q in queries:
        (now if size <= q[0] <= top else later if q[0] > top else passed).append(q)
    now.sort(key=lambda q: (q[0], q[1]))
    block = GrowingBlock(elements, tuple(Query(q[0], q[1], q[2]) for q in now))
    return block, later, passed


def _query_letter(reason: str, detail: str, key: str, query: tuple) -> DeadLetter:
    """A query's dead letter keeps the whole (public) query, so it can be submitted again."""
    return DeadLetter(reason, detail, key,
                      {"query_id": query[1], "t": query[0], "weights": np.asarray(query[2], dtype=float).tolist()})


class GrowingPolicy(BlockPolicy):
    """Elements ``(micros, index)`` by step; queries ``(t, query_id, weights)`` carried until answered."""

    timed_rows = False

    def __init__(self, mechanism: Any, noise: NoiseSource, snapshots: bool):
        super().__init__(mechanism, noise)
        self.snapshots = snapshots

    def late(self, step: int) -> tuple[str, str]:
        return Reason.LATE, f"step {step} was already absorbed"

    def begin(self, carried: list, steps: int = 1) -> list:
        return list(carried)  # the pending queries, consumed step by step

    def close(self, key: str, state: Any, step: int, items: list, pending: list) -> tuple[Any, list, list]:
        block, later, passed = plan_block(state.t, items, pending)
        state, releases = self.mechanism.step(state, block, self.noise)
        pending[:] = later
        letters = [_query_letter(Reason.LATE, f"size {q[0]} already passed", key, q) for q in passed]
        return state, releases, letters

    def end(self, key: str, state: Any, pending: list, finished: bool) -> tuple[list, list]:
        out = []
        if self.snapshots and state is not None:
            snap = self.mechanism.snapshot(state)
            if snap is not None:
                out.append(Output(SNAPSHOTS, release_to_row(snap, self.mechanism.guarantee)))
        if not finished:
            return out, pending
        out.extend(Output(DEAD_LETTER, _query_letter(Reason.AFTER_END, f"the database never reached size {q[0]}",
                                                     key, q)) for q in pending)
        return out, []
