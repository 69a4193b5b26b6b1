"""One privacy unit's steps on a streaming engine, engine-neutral: its keyed state and what it emits.

A streaming engine keys the unit stage by the unit's keyed hash (never a clear id) and keeps per unit one
:class:`UnitState` (bytes, :meth:`UnitState.encode`): the unit's :class:`~beam_dp.core.units.UnitLedger`
row for its **closed** steps (:class:`UnitRow`: a few int64), the candidate contributions of its **open**
steps, the sums it has emitted for them so far and how many of their contributions were dropped for good.

**Bounding** is :func:`~beam_dp.core.units.bound_block` on the unit's own rows, step by step in step order
from its ledger row (its one-unit path: :meth:`UnitRow.refusal`, :func:`~beam_dp.core.units.bound_unit`,
:meth:`UnitRow.advanced`): what the batch replay decides for the unit (its choices depend on the unit's
contributions and the key only), so streaming and batch keep the same contributions.

**Emission** (:meth:`UnitSteps.add`): every on-time contribution re-bounds the unit's open steps and
returns the change of each kept ``(stream, step)`` sum (the new sum minus the one emitted so far: a
contribution that enters a top ``c``, a step that a new earlier step makes too close, ...). The deltas of
a (stream, step) add up to the unit's final kept sum (norm at most ``R``); an engine emits them at once,
at the contribution's time, so they are never behind the watermark and need no timer to leave: the
release stage, which sums its input per step, has not closed any open step of the unit. A contribution
dropped by the stream or contribution choice (``over_streams``, ``over_contributions``) is never kept
again (more contributions only push it further out), and neither is a contribution to a step the unit's
closed steps refuse (later steps taken before it only add to its count): both leave the state, counted by
(step, stream), and are charged to the reason the batch replay gives them when their step closes.

**Closing** (:meth:`UnitSteps.closed`): the steps before ``first_open`` (the first step the engine has
proven the watermark has not closed: Beam's watermark-gate stamp, Flink's watermark) are folded into
the ledger row and leave the state; an engine calls it on every element and at a timer at
:meth:`UnitSteps.timer` so an idle unit's state shrinks to its row. **Lateness**: a contribution is late
when its step is before ``first_open`` or not after the last step folded into the row; it never enters
the state. Because the state is keyed state, a restore, a new worker or a rescale continues from it: a
unit never regains a step it used, and an exhausted unit stays exhausted.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from beam_dp.core.clock import StepClock
from beam_dp.core.units import DROP_REASONS, NO_STEP, UnitBlock, UnitBounds, UnitKeys, bound_unit

__all__ = ["STATE_VERSION", "Added", "Contribution", "Delta", "Folded", "UnitRow", "UnitState", "UnitSteps"]

STATE_VERSION = 1
_HEAD = 7  # version, max_steps, min_separation, window (0: forever), ledger step, taken, exhausted
_RECORD = struct.Struct("<qIq")  # step, stream id bytes, then d (float64s follow) or a count (none follow)
_OVER_STEPS, _TOO_CLOSE, _OVER_STREAMS, _OVER_CONTRIBUTIONS = (DROP_REASONS.index(r) + 1 for r in DROP_REASONS)


class Contribution(NamedTuple):
    """A unit's contribution of an open step: its step, stream and clipped value (float64 ``(d,)``)."""

    step: int
    stream: str
    value: np.ndarray


class Delta(NamedTuple):
    """The change of a unit's kept ``(stream, step)`` sum, to add to that step's input of the release stage.
    A unit's changes of one (stream, step) add up to its kept sum, so the changes of a step, one
    ``ClippedSum`` of count 1 each, have norm at most their count times ``R``, as the release stage checks."""

    stream: str
    step: int
    value: np.ndarray


@dataclass(frozen=True)
class UnitRow:
    """One unit's row of the ledger under ``rule`` (its closed steps; ``docs/privacy_units.md``).

    ``step``: the last step folded (0: none); ``taken``: steps taken while in the ledger (0: no active
    row); ``exhausted``: it took ``max_steps`` (forever rule; kept for good); ``steps``: its last
    ``slots`` steps taken (:data:`~beam_dp.core.units.NO_STEP` in front while fewer).
    """

    rule: tuple[int, int, int | None]
    step: int
    taken: int
    exhausted: bool
    steps: tuple[int, ...]

    @classmethod
    def empty(cls, bounds: UnitBounds) -> "UnitRow":
        return cls(bounds.rule, 0, 0, False, (NO_STEP,) * bounds.slots)

    def refusal(self, step: int) -> int:
        """0 when the row lets its unit take part in ``step`` (after its step), else the index + 1 in
        :data:`~beam_dp.core.units.DROP_REASONS` of why not: :meth:`~beam_dp.core.units.UnitLedger.refusals` of one unit."""
        k, b, w = self.rule
        over = (self.exhausted or self.taken >= k) if w is None else self.steps[0] > step - w
        return _OVER_STEPS if over else _TOO_CLOSE if step - self.steps[-1] < b else 0

    def advanced(self, step: int, taken: bool) -> "UnitRow":
        """The row after ``step`` (the unit took part in it or not): :meth:`~beam_dp.core.units.UnitLedger.advanced` of one unit."""
        k, b, w = self.rule
        if taken and self.taken + 1 >= k and w is None:  # exhausted: kept for good
            return UnitRow(self.rule, step, 0, True, (NO_STEP,) * len(self.steps))
        if taken:
            return UnitRow(self.rule, step, self.taken + 1, self.exhausted, (*self.steps[1:], step))
        if w is not None and self.taken and step - self.steps[-1] >= max(w, b):  # inactive: the row expires
            return UnitRow(self.rule, step, 0, False, (NO_STEP,) * len(self.steps))
        return UnitRow(self.rule, step, self.taken, self.exhausted, self.steps)


@dataclass
class UnitState:
    """A unit's keyed state (module docstring): its ledger row, the candidate contributions of its open
    steps, the sums emitted for them (by (stream, step)) and the rows dropped for good (by (step, stream))."""

    row: UnitRow
    rows: list[Contribution] = field(default_factory=list)
    emitted: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    pruned: dict[tuple[int, str], int] = field(default_factory=dict)

    def encode(self) -> bytes:
        k, b, w = self.row.rule
        head = [STATE_VERSION, k, b, w or 0, self.row.step, self.row.taken, int(self.row.exhausted),
                *self.row.steps, len(self.rows), len(self.emitted), len(self.pruned)]
        parts = [np.array(head, "<i8").tobytes()]
        parts += [_record(c.step, c.stream, c.value) for c in self.rows]
        parts += [_record(step, stream, value) for (stream, step), value in self.emitted.items()]
        parts += [_record(step, stream, count=n) for (step, stream), n in self.pruned.items()]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes, bounds: UnitBounds) -> "UnitState":
        """The state ``data`` encodes; ``ValueError`` when it is not a state of this version kept under ``bounds``."""
        size = 8 * (_HEAD + bounds.slots + 3)
        words = np.frombuffer(data[:size], "<i8") if len(data) >= size else np.zeros(1, np.int64)
        if len(words) * 8 != size or words[0] != STATE_VERSION:
            raise ValueError(f"a unit state of {len(data)} bytes is not a version-{STATE_VERSION} state of "
                             f"{bounds.slots} slots")
        rule = (int(words[1]), int(words[2]), int(words[3]) or None)
        if rule != bounds.rule:
            raise ValueError(f"the unit state was kept under (max_steps, min_separation, window) = {rule}, "
                             f"not {bounds.rule}: the bounds are fixed for a job's life")
        slots = _HEAD + bounds.slots
        row = UnitRow(rule, int(words[4]), int(words[5]), bool(words[6]), tuple(map(int, words[_HEAD:slots])))
        n_rows, n_emitted, n_pruned = map(int, words[slots:])
        records, at = [], size
        for i in range(n_rows + n_emitted + n_pruned):
            record, at = _read_record(data, at, counted=i >= n_rows + n_emitted)
            records.append(record)
        if at != len(data):
            raise ValueError(f"a unit state has {len(data) - at} bytes after its records")
        rows = [Contribution(*r) for r in records[:n_rows]]
        emitted = {(stream, step): value for step, stream, value in records[n_rows:n_rows + n_emitted]}
        pruned = {(step, stream): n for step, stream, n in records[n_rows + n_emitted:]}
        return cls(row, rows, emitted, pruned)


def _record(step: int, stream: str, value: np.ndarray | None = None, count: int = 0) -> bytes:
    raw = stream.encode("utf-8")
    if value is None:
        return _RECORD.pack(int(step), len(raw), int(count)) + raw
    value = np.asarray(value, "<f8").reshape(-1)
    return _RECORD.pack(int(step), len(raw), len(value)) + raw + value.tobytes()


def _read_record(data: bytes, at: int, counted: bool) -> tuple[tuple, int]:
    step, size, n = _RECORD.unpack_from(data, at)
    at += _RECORD.size
    stream = data[at:at + size].decode("utf-8")
    at += size
    if counted:
        return (step, stream, n), at
    return (step, stream, np.frombuffer(data[at:at + 8 * n], "<f8").copy()), at + 8 * n


class Added(NamedTuple):
    """:meth:`UnitSteps.add`'s result: ``late`` (the contribution was refused, nothing changed but the
    fold), the unit's state after it, the deltas to emit and the fold's :class:`Folded` counts."""

    late: bool
    state: UnitState
    deltas: list[Delta]
    folded: "Folded"


class Folded(NamedTuple):
    """Contributions dropped per reason (:data:`~beam_dp.core.units.DROP_REASONS`) and (unit, stream)
    sums kept, in the steps a fold closed."""

    drops: dict[str, int]
    kept: int


class UnitSteps:
    """The per-unit step logic every streaming unit stage calls (module docstring); build it on the worker
    (``keys`` holds the job's secret key).

    Args:
        bounds: the units' :class:`~beam_dp.core.units.UnitBounds`.
        keys: the job's :class:`~beam_dp.core.units.UnitKeys`.
        clip_bound: ``R``, each kept (unit, stream, step) sum's L2 bound.
        clock: the params' :class:`~beam_dp.core.clock.StepClock`.
        allowed_lateness: the grace in seconds: step ``s`` closes when the watermark reaches ``end(s) + grace``.
    """

    def __init__(self, bounds: UnitBounds, keys: UnitKeys, clip_bound: float, clock: StepClock,
                 allowed_lateness: float = 0.0):
        self.bounds, self._keys, self._clip, self.clock = bounds, keys, float(clip_bound), clock
        self.grace = round(allowed_lateness * 1_000_000)

    def state(self, data: bytes | None) -> UnitState:
        """The unit's state from its bytes (None: a unit seen for the first time)."""
        return UnitState(UnitRow.empty(self.bounds)) if data is None else UnitState.decode(data, self.bounds)

    def first_open(self, watermark: int) -> int:
        """The first step a proven watermark (µs) has not closed: ``end(s) + grace > watermark``."""
        return int(self.clock.step_of_micros(watermark - self.grace))

    def timer(self, state: UnitState) -> int | None:
        """When (µs) the unit's lowest open step closes (``end + grace``); None when it has none."""
        steps = [c.step for c in state.rows] + [step for step, _ in state.pruned]
        return None if not steps else self.clock.step_end_micros(min(steps)) + self.grace

    def closed(self, state: UnitState, unit: np.uint64, first_open: int) -> tuple[UnitState, Folded]:
        """Fold the unit's open steps before ``first_open`` (closed) into its row, in step order."""
        done = sorted({c.step for c in state.rows if c.step < first_open}
                      | {step for step, _ in state.pruned if step < first_open})
        drops, kept = dict.fromkeys(DROP_REASONS, 0), 0
        if not done:
            return state, Folded(drops, kept)
        row = state.row
        for step in done:
            rows = [c for c in state.rows if c.step == step]
            refused, streams = row.refusal(step), set()
            if rows and refused:
                drops[DROP_REASONS[refused - 1]] += len(rows)
            elif rows:
                block = self._bound(unit, step, rows)
                for code in block.row_drops[block.row_drops > 0].tolist():
                    drops[DROP_REASONS[code - 1]] += 1
                kept += len(block.streams)
                streams = set(block.streams)
            if rows:
                row = row.advanced(step, not refused)
            for (at, stream), count in state.pruned.items():
                if at == step:  # the reason the batch replay gives these rows (the first that applies)
                    code = refused or (_OVER_CONTRIBUTIONS if stream in streams else _OVER_STREAMS)
                    drops[DROP_REASONS[code - 1]] += count
        last = done[-1]
        return UnitState(row, [c for c in state.rows if c.step > last],
                         {k: v for k, v in state.emitted.items() if k[1] > last},
                         {k: n for k, n in state.pruned.items() if k[0] > last}), Folded(drops, kept)

    def add(self, state: UnitState, unit: np.uint64, contribution: Contribution, first_open: int) -> Added:
        """An element of the unit: fold what ``first_open`` closed, then (on time) add ``contribution``,
        re-bound the open steps and return the deltas of its kept sums."""
        state, folded = self.closed(state, unit, first_open)
        step, stream = int(contribution.step), contribution.stream
        if step < first_open or step <= state.row.step:
            return Added(True, state, [], folded)
        if state.row.refusal(step):  # refused by the closed steps: for good, nothing changes
            pruned = dict(state.pruned)
            pruned[(step, stream)] = pruned.get((step, stream), 0) + 1
            return Added(False, UnitState(state.row, state.rows, state.emitted, pruned), [], folded)
        value = np.asarray(contribution.value, np.float64).reshape(-1)
        rows = state.rows + [Contribution(step, stream, value)]
        row, kept, pruned = state.row, [], dict(state.pruned)
        desired: dict[tuple[str, int], np.ndarray] = {}
        for step in sorted({c.step for c in rows}):
            mine = [c for c in rows if c.step == step]
            refused = row.refusal(step)
            row = row.advanced(step, not refused)
            if refused:  # refused by an earlier open step: kept, that step may still lose rows
                kept.extend(mine)
                continue
            block = self._bound(unit, step, mine)
            for one, drop in zip(mine, block.row_drops.tolist()):
                if drop:  # over_streams or over_contributions: never kept again, out of the state
                    pruned[(step, one.stream)] = pruned.get((step, one.stream), 0) + 1
                else:
                    kept.append(one)
            desired.update({(s, step): v for s, v in zip(block.streams, block.sums)})
        deltas = []
        for key in sorted(set(desired) | set(state.emitted), key=lambda k: (k[1], k[0])):
            new, old = desired.get(key), state.emitted.get(key)
            if old is None or new is None or not np.array_equal(new, old):
                change = (new if new is not None else 0.0) - (old if old is not None else 0.0)
                deltas.append(Delta(key[0], key[1], np.asarray(change, np.float64).reshape(value.shape)))
        return Added(False, UnitState(state.row, kept, desired, pruned), deltas, folded)

    def _bound(self, unit: np.uint64, step: int, rows: list[Contribution]) -> UnitBlock:
        return bound_unit(unit, step, [c.stream for c in rows], np.stack([c.value for c in rows]), self.bounds,
                          self._keys, clip_bound=self._clip)
