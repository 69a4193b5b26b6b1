"""The release stage of a bounded input (a batch replay): one key's items at once, after a ``GroupByKey``.

On a bounded input the stateful shell (:class:`~beam_dp.beam.shell.dofn.ContinualReleaseDoFn`) does nothing a
grouping does not: every key opens at step 1 (or after its restored snapshot), buffers all its items in
Beam state and closes every step through the public end at one timer, when the input has ended. Here
the same :class:`~beam_dp.steps.driver.StepDriver` gets a key's items from a ``GroupByKey`` in one call
(every shuffled element is still one item: for the sums one (key, step) block of the lifted combiner, or
of one parse bundle keyed by stream groups),
buffered in memory (``StepSumsBuffer``: a group's blocks of one step added as they come), and closes the
same steps with the same call:

* event-time steps: :meth:`StepDriver.advance` to :meth:`StepDriver.final_timer` (the close of the
  public last step), exactly the stateful shell's one timer; with no public end, :meth:`StepDriver.finish`;
* marker steps: :meth:`StepDriver.finish` (the stateful shell's end-of-input timer);
* count steps: each block closes the steps it completes as it is added (as in the stateful shell).

So the releases, the dead letters and their order per key are the stateful shell's, while no item is
encoded into a state bag and decoded back, and the runner holds each block once (the grouped input)
instead of twice (its input and its state store). Nothing is kept after the call: a bounded input has
no later element and no ``--update``. Unbounded inputs keep the stateful shell (:func:`release_stage`).
Metrics are the stateful shell's (``releases``, ``dead_letters``, ``unreadable_states``,
``last_closed_step``); a key is one call, so ``timer_firings`` and ``buffered_items`` stay 0.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import apache_beam as beam

from beam_dp.beam.shell.combine import MergeClippedSums
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn, DriverShell, WatermarkGate, continual_driver
from beam_dp.mechanisms.stream_groups import GroupBlock
from beam_dp.steps.coder import KeyState, UnreadableState
from beam_dp.steps.driver import CARRIED, ListBuffer, Output, StepDriver
from beam_dp.steps.events import DEAD_LETTER

__all__ = ["CHUNK", "KeyReleaseDoFn", "StepSumsBuffer", "release_stage"]

CHUNK = 64  # event-time steps a key closes per driver call (its releases leave between calls); the noise
#             a group policy draws ahead per call (GroupPolicy.AHEAD)


class KeyReleaseDoFn(DriverShell):
    """Input ``(key, [(step | None, item | None, original), ...])`` (a ``GroupByKey`` of what
    :class:`~beam_dp.beam.shell.dofn.ContinualReleaseDoFn` takes one by one); ``item=None`` declares the key."""

    def make_driver(self) -> StepDriver:
        return continual_driver(self._params)

    def process(self, element: tuple[str, Iterable[tuple[int | None, Any, Any]]]) -> Iterator:
        key, items = element
        driver, buffer = self._driver, StepSumsBuffer()
        try:
            state = driver.open(key)
        except UnreadableState as exc:  # a restored snapshot this version cannot read: the key ends
            self._unreadable.inc()
            state, outputs = driver.unreadable(key, buffer, str(exc))
            yield from self.emit(outputs)
        for step, item, original in items:
            if item is None:  # a declaration: a batch key releases from step 1 anyway
                continue
            if step == CARRIED:
                driver.carry(state, buffer, item)
                continue
            streams = getattr(item, "streams", None)  # a group's block: late letters carry the stream if one
            yield from self.emit(driver.add(state, buffer, step, item, original,
                                            streams[0] if streams is not None and len(streams) == 1 else None))
        before = state.next_step
        for outputs in self._close(state, buffer):
            yield from self.emit(outputs)
        if state.next_step > before:
            self.closed(state.next_step - 1)

    def _close(self, state: KeyState, buffer: "StepSumsBuffer") -> Iterator[list[Output]]:
        """What the stateful shell's timers close on a bounded input (module docstring); event-time steps
        :data:`CHUNK` at a time, so a key's releases leave as they are made (the same steps, the same
        releases: closing is step by step, and the keyed noise of a step does not depend on the chunk)."""
        driver = self._driver
        if driver.clock is not None:
            final = driver.final_timer()
            if final is None:
                yield driver.finish(state, buffer)
                return
            last = int(driver.clock.step_of_micros(final - driver.grace)) - 1  # what advance(final) closes
            while state.next_step + CHUNK <= last and not state.ended:
                yield driver.close_through(state, buffer, state.next_step + CHUNK - 1)
            yield driver.advance(state, buffer, final)
        elif driver.block_size is None:
            yield driver.finish(state, buffer)


class StepSumsBuffer(ListBuffer):
    """A key's items in memory, a group's blocks of one step added as they come (``MergeClippedSums``: one
    accumulator on the group's worker-local row map per step, a lookup per name) instead of kept one by
    one: the parse stage's bundles each send a block per (group, step), and the release stage holds one
    per step. Other items are kept as they are. Read back, each step's sum is one ``GroupBlock``."""

    def __init__(self) -> None:
        super().__init__()
        self._sums = MergeClippedSums()
        self._at: dict[int, int] = {}  # step -> the index of its sum in the list

    def add(self, entry: tuple[int, Any]) -> None:
        step, item = entry
        if step == CARRIED or not isinstance(item, GroupBlock):
            self.append(entry)
            return
        at = self._at.get(step)
        if at is None:
            self._at[step] = len(self)
            self.append((step, self._sums.add_input(None, item)))
        else:
            self[at] = (step, self._sums.add_input(self[at][1], item))

    def read(self) -> list[tuple[int, Any]]:
        for step, at in self._at.items():  # a later block of the step adds to this one again
            self[at] = (step, self._sums.extract_output(self[at][1]))
        return list(self)

    def clear(self) -> None:
        super().clear()
        self._at.clear()


def release_stage(items: beam.PCollection, params: Any, label: str, bounded: bool,
                  per_step_timers: bool | None = None, rows_type: Any = None) -> beam.pvalue.DoOutputsTuple:
    """``items`` keyed for the driver → ``(rows, dead_letter)`` outputs: on a bounded input a
    ``GroupByKey`` and :class:`KeyReleaseDoFn`, else the stateful :class:`ContinualReleaseDoFn`
    (``per_step_timers``: default True) behind a :class:`~beam_dp.beam.shell.dofn.WatermarkGate` on an event-time
    clock, so a new key's first step is one the watermark has not closed. ``label`` names the release step; ``rows_type``
    (optional) the type of its releases (``ReleaseColumns``: sized by the block coder, not pickled)."""
    if bounded:
        grouped = items | f"{label}: by key" >> beam.GroupByKey()
        release = beam.ParDo(KeyReleaseDoFn(params))
    else:
        timers = True if per_step_timers is None else per_step_timers
        gated = timers and getattr(params, "clock", None) is not None  # event time: a new key opens where proven
        grouped = items | f"{label}: watermark gate" >> WatermarkGate(params) if gated else items
        release = beam.ParDo(ContinualReleaseDoFn(params, per_step_timers=timers, gated=gated))
    if rows_type is not None:
        release = release.with_output_types(rows_type)
    return grouped | label >> release.with_outputs(DEAD_LETTER, main="rows")
