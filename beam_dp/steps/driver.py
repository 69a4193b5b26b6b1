"""The one step driver: everything about steps, for every engine (Beam-free, Flink-free).

An engine (a Beam DoFn, a Flink ``KeyedProcessFunction``) only moves state and timers: per key it
stores one :class:`~beam_dp.steps.coder.KeyState` and a buffer of ``(step, item)`` entries (encoded
by :mod:`beam_dp.steps.coder`), and calls :meth:`StepDriver.add`, :meth:`advance` (a watermark),
:meth:`close_through` (an explicit marker) and :meth:`finish` (the watermark reached +infinity).
The driver returns :class:`Output` s: release rows, dead letters, snapshots.

Public rules (the same on every engine):

* **Event-time steps.** Step ``s`` closes when the watermark reaches ``end(s) + allowed_lateness``;
  one call closes *every* step the watermark has passed, in order, each releasing whether or not it
  has data. An item for a closed step is late: dead-lettered whole (``late``), never in state.
* **First step of a key.** A new key opens at the first step the watermark has not closed (its
  items of earlier steps are late), from a watermark the engine *proves*: Flink reads its own; Beam
  reads the time a watermark gate stamped on the key's first element (``beam_dp.beam.shell.dofn``:
  a stateful stage keyed by a fixed public set of buckets, seeded when the job starts, whose close
  timers track the watermark and hold its output below the stamp), so every worker (fresh,
  restarted, updated) decides the same and nothing is released behind the watermark. A key that
  has no proof (Flink before its first watermark after a start or restore; a Beam DoFn fed without
  the gate) opens *provisionally* (:meth:`StepDriver.open` ``provisional=True``): its first step is
  the lowest step of the items it receives before its first close timer fires, fixed by that firing.
  Declared streams and batch replays start at step 1. A key restored from a snapshot continues
  after the snapshot's step.
* **Release times.** A step's release rows carry the public time :meth:`StepDriver.release_time`:
  ``end(s) + allowed_lateness``, whichever timer, rung, restore or end of input closed the step.
* **End of input** (watermark at +infinity: drain, end of a bounded input, Flink ``stop --drain``):
  with ``b`` the first step the last finite watermark had not closed, the open steps through
  :meth:`StepDriver.end_step` ``(b)`` = the first multiple of :data:`END_RUNG` after ``b`` (capped at
  the clock's public ``end``) are released, in order; no later step is. This is the one rule an
  engine without a watermark (Beam: a ladder of close timers whose top rung is every
  :data:`END_RUNG` steps) applies whatever order its timers fire in at +infinity; an engine with
  the watermark (Flink) computes the same step. With no finite watermark ever seen and no ladder
  (a batch replay) the clock's public ``end`` is used. Buffered items of steps that are not
  released go to the dead letters (``unclosed``).
* **Count steps.** A block of ``block_size`` contributions in arrival order is one step; an
  incomplete block is never released.
* **The end of a stream.** A mechanism refuses a step (``ValueError``) only at its public end (a
  horizon or a budget fixed at construction, never the data). The stream then ends: one
  ``stream_ended`` dead letter, its state and buffers are freed, no later step is fed, and every
  later item is dead-lettered ``stream_ended`` with its element kept.
* **Idle streams** (``idle_steps`` k, ``idle_threshold`` τ): a stream also ends so after its own step
  ``t ≥ k`` when its released values moved little: ``‖release_t − release_{t−k}‖₂ ≤ τ`` (release_0 = 0,
  the empty sum). Decided from released values only (post-processing: no privacy cost), so anyone
  recomputes it from the release rows.

The driver holds no privacy arithmetic: clipping, noise and accounting are the mechanism's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from beam_dp.core.clock import StepClock
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.steps.coder import UNREADABLE_STATE, KeyState, UnreadableState
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, Reason
from beam_dp.steps.schema import ReleaseColumns, ReleaseRow, release_to_row

__all__ = ["CARRIED", "END_RUNG", "RELEASE", "SNAPSHOTS", "Buffer", "ListBuffer", "Output", "StepDriver", "release_step"]

RELEASE, SNAPSHOTS = "release", "snapshots"
CARRIED = 0  # the step of buffered items that wait across steps (a growing database's queries)
END_RUNG = 16  # the end rule releases through the first multiple of END_RUNG after the first unclosed step


class Output(NamedTuple):
    """``tag``: ``RELEASE`` / ``SNAPSHOTS`` (a ``ReleaseRow``, or ``ReleaseColumns`` for a group of
    streams) or ``DEAD_LETTER`` (a ``DeadLetter``)."""

    tag: str
    value: ReleaseRow | ReleaseColumns | DeadLetter


class Buffer(Protocol):
    """An engine's per-key store of ``(step, item)`` entries (Beam ``BagState``, Flink ``ListState``)."""

    def add(self, entry: tuple[int, Any]) -> None: ...
    def read(self) -> Iterable[tuple[int, Any]]: ...
    def clear(self) -> None: ...


class ListBuffer(list):
    """A :class:`Buffer` in memory (pure replays, tests)."""

    def add(self, entry: tuple[int, Any]) -> None:
        self.append(entry)

    def read(self) -> list[tuple[int, Any]]:
        return list(self)


def release_step(value: ReleaseRow | ReleaseColumns) -> int:
    """The schedule step of a release output's value."""
    return value.batch.step if isinstance(value, ReleaseColumns) else value.step


def _dead(reason: str, detail: str, key: str | None, element: Any = None) -> Output:
    return Output(DEAD_LETTER, DeadLetter(reason, detail, key, element))


class StepDriver:
    """Drives one ``policy`` (see :mod:`beam_dp.steps.policies`) for many keys.

    ``clock`` (event-time steps) or ``block_size`` (count steps) or neither (marker steps: the engine
    calls :meth:`close_through`); ``last_step`` the public end (None: open-ended);
    ``allowed_lateness`` the grace in seconds; ``restored`` encoded mechanism states by key; ``binding``
    the calibration the policy's noise is bound to (recorded in every key's state, ``KeyState.noise_binding``).

    A key whose state was written before the binding (``noise_binding`` None) continues under the legacy
    derivation it was released with: ``legacy_noise`` (a zero-argument loader of that source, set by the
    shell) replaces the policy's noise while the driver works on that key, so its open noise cells keep
    the draws its earlier releases used. Without a loader such a key is :class:`UnreadableState`.
    """

    def __init__(self, policy: Any, clock: StepClock | None = None, block_size: int | None = None,
                 last_step: int | None = None, allowed_lateness: float = 0.0,
                 restored: Iterable[tuple[str, bytes]] | None = None, idle_steps: int | None = None,
                 idle_threshold: float = 0.0, binding: str | None = None):
        self.policy = policy
        self.binding = binding
        self.legacy_noise: Callable[[], Any] | None = None
        self.clock = clock
        self.block_size = block_size
        self.last_step = last_step
        self.grace = round(allowed_lateness * 1_000_000)
        self._restored = dict(restored or ())
        self.idle_steps, self.idle_threshold = idle_steps, idle_threshold

    @classmethod
    def for_params(cls, params: Any, policy: Any) -> "StepDriver":
        """A driver for a step-params object (``clock``, ``block_size``, ``allowed_lateness``, ``restore_states``,
        and where the family has them ``idle_steps`` / ``idle_threshold``)."""
        clock = params.clock
        return cls(policy, clock=clock, block_size=params.block_size,
                   last_step=None if clock is None else clock.last_step,
                   allowed_lateness=params.allowed_lateness, restored=params.restore_states,
                   idle_steps=getattr(params, "idle_steps", None),
                   idle_threshold=getattr(params, "idle_threshold", None) or 0.0,
                   binding=calibration_binding(params))

    # -- keys and timers ------------------------------------------------------------------------
    def open(self, key: str, watermark: int | None = None, provisional: bool = False) -> KeyState:
        """The state of a key seen for the first time (see the module rules for its first step):
        ``watermark`` (µs), a proven watermark: the key opens at :meth:`first_open` of it.

        ``provisional`` (no proof of the watermark, event-time steps): the key has no step yet;
        :meth:`add` places it at the lowest step of its items until :meth:`advance` (its first close
        timer) or :meth:`declare` fixes it. Arm no close timer before it has a step
        (:meth:`timer` returns None)."""
        restored = self._restored.get(key)
        if restored is not None:
            state = self._decode(restored)
            return KeyState(key, _as_array(restored), int(state.t) + 1, watermark=watermark, noise_binding=self.binding)
        if provisional and self.clock is not None:
            encoded = self.policy.mechanism.encode_state(self.policy.mechanism.init_state(key))
            return KeyState(key, _as_array(encoded), 0, provisional=True, noise_binding=self.binding)
        first = 1
        if self.clock is not None and watermark is not None:
            first = max(1, self.first_open(watermark))
        encoded = self.policy.mechanism.encode_state(self.policy.mechanism.init_state(key))
        return KeyState(key, _as_array(encoded), first, watermark=watermark, offset=first - 1,
                        noise_binding=self.binding)

    def first_open(self, watermark: int) -> int:
        """The first step a watermark (µs, event-time steps) has not closed: ``end(s) + grace > watermark``
        (0 or less before the clock's start)."""
        return int(self.clock.step_of_micros(watermark - self.grace))

    def declare(self, state: KeyState) -> None:
        """A declared stream (or a group with one) releases from step 1: fixes a provisional key there."""
        if state.provisional:
            state.next_step, state.offset, state.provisional = 1, 0, False

    def unreadable(self, key: str, buffer: Buffer, detail: str) -> tuple[KeyState, list[Output]]:
        """A key whose state (or buffer) this version cannot read ends: its buffer is cleared and it gets
        an ended state (later items are dead-lettered ``stream_ended``) and one ``unreadable_state``
        dead letter; nothing is released for it again."""
        buffer.clear()
        state = KeyState(key, np.zeros(0, dtype=np.uint8), 0, ended=True, stream_ended=True,
                         noise_binding=self.binding)
        return state, [_dead(UNREADABLE_STATE, f"the key's state cannot be read ({detail[:200]}); its stream ends", key)]

    def release_time(self, step: int) -> int | None:
        """The public time (µs) of step ``step``'s releases: its end plus the grace (None without a clock)."""
        return None if self.clock is None else self.clock.step_end_micros(step) + self.grace

    def _decode(self, encoded: bytes) -> Any:
        """A mechanism state; :class:`UnreadableState` when this version cannot read it."""
        try:
            return self.policy.mechanism.decode_state(encoded)
        except ValueError as exc:
            raise UnreadableState(f"mechanism state: {exc}") from exc

    def timer(self, state: KeyState, every: int = 1) -> int | None:
        """When (µs) the engine should next report the watermark: the close of the first open step whose
        number is a multiple of ``every`` (1: the first open step; capped at the public last step);
        None when no step is open.

        An engine that cannot read the watermark (Beam) arms one timer per ``every`` (its ladder, e.g.
        1, 4, 16): after a watermark jump of N steps the firings prove it in about N/16 rounds, not N."""
        if self.clock is None or state.ended or state.next_step < 1:
            return None
        step = -(-state.next_step // every) * every
        if self.last_step is not None:
            if state.next_step > self.last_step:
                return None
            step = min(step, self.last_step)
        return self.clock.step_end_micros(step) + self.grace

    def end_step(self, first_open: int) -> int:
        """The last step the end of input releases when ``first_open`` is the first step the last
        finite watermark had not closed: the first multiple of :data:`END_RUNG` after it, capped at
        the public last step. A public function of the schedule and the watermark, never the data.

        Why this step (docs/steps.md, rule 4): a Beam key at rest has its ladder's rungs at
        ``first_open`` and the next multiples of 4 and 16; at +infinity they fire (in timestamp
        order) before the end timer and close through the top rung, and when ``first_open`` is itself
        a multiple of 16 the state they leave is exactly that of a key at rest one step later, whose
        top rung is 16 steps on; so the only rule the end timer can apply in every order is this one."""
        upto = (first_open // END_RUNG + 1) * END_RUNG
        return upto if self.last_step is None else min(upto, self.last_step)

    def final_timer(self) -> int | None:
        """A batch replay's single timer: the close of the public last step."""
        if self.clock is None or self.last_step is None:
            return None
        return self.clock.step_end_micros(self.last_step) + self.grace

    # -- items ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _noise_of(self, state: KeyState) -> Iterator[None]:
        """The policy draws with the noise ``state`` was released under while the block runs: the bound
        source, or for a state written before the binding the legacy one (``legacy_noise``)."""
        if state.noise_binding is not None or self.binding is None:
            yield
            return
        if self.legacy_noise is None:
            raise UnreadableState("the state was written before noise was bound to the privacy parameters and "
                                  "this engine cannot load the legacy noise")
        bound, self.policy.noise = self.policy.noise, self.legacy_noise()
        try:
            yield
        finally:
            self.policy.noise = bound

    def add(self, state: KeyState, buffer: Buffer, step: int | None, item: Any, original: Any = None,
            stream: str | None = None) -> list[Output]:
        """Buffer ``item`` for ``step`` (None: the next count step); a closed step's item is dead-lettered
        (with ``stream`` as its key when the engine key is a group of streams)."""
        key = state.key if stream is None else stream
        if state.stream_ended:
            return [_dead(Reason.STREAM_ENDED, "the stream has ended at its public horizon", key, original)]
        if self.block_size is not None:
            with self._noise_of(state):
                return self._add_count(state, buffer, item)
        if state.provisional and step >= 1 and (state.next_step < 1 or step < state.next_step):
            state.next_step, state.offset = step, step - 1  # nothing closed yet: open at the lowest item
        if state.ended or step < state.next_step:
            reason, detail = self.policy.late(step)
            return [_dead(reason, detail, key, original)]
        buffer.add((step, item))
        state.lowest = step if state.lowest is None else min(state.lowest, step)
        return []

    def carry(self, state: KeyState, buffer: Buffer, item: Any) -> None:
        """Buffer an item that waits across steps until the policy consumes it (a query)."""
        buffer.add((CARRIED, item))
        state.lowest = CARRIED

    def _add_count(self, state: KeyState, buffer: Buffer, item: Any) -> list[Output]:
        """Count steps: ``item`` may hold many contributions (a block of rows in arrival order). Every
        step it completes is closed here, in order, with the mechanism state decoded once and encoded
        once and the policy's context begun once (noise drawn ahead) for the whole item; a block that
        overfills a step is split (``policy.split``) and its rest carried into the next steps, its tail
        left in the buffer."""
        out: list[Output] = []
        mech_state = context = None
        while item is not None:
            count, need = self.policy.count(item), self.block_size - state.buffered
            if count < need:
                buffer.add((state.next_step, item))
                state.buffered += count
                break
            head, item = (item, None) if count == need else self._split(item, need)
            items = [head]
            if state.buffered:
                items = [it for _, it in buffer.read()] + items
                buffer.clear()
                state.buffered = 0
            if mech_state is None:
                mech_state = self._decode(_as_bytes(state.mechanism))
                context = self.policy.begin([], (count - need) // self.block_size + 1)  # the steps it closes
            mech_state = self._close_one(state, buffer, mech_state, state.next_step, items, context, out)
            if mech_state is None:  # the stream ended at its public end: the rest is discarded
                return out
            state.next_step += 1
        if mech_state is not None:
            state.mechanism = _as_array(self.policy.mechanism.encode_state(mech_state))
        return out

    def _split(self, item: Any, k: int) -> tuple[Any, Any]:
        """``item`` cut after ``k`` contributions; an item that is not rows (a sum) closes a step whole."""
        try:
            return self.policy.split(item, k)
        except TypeError:
            return item, None

    # -- closing --------------------------------------------------------------------------------
    def advance(self, state: KeyState, buffer: Buffer, watermark: int) -> list[Output]:
        """The watermark (µs) reached ``watermark``: close every step whose end + grace it passed."""
        state.watermark = watermark if state.watermark is None else max(state.watermark, watermark)
        state.provisional = False
        return self.close_through(state, buffer, self.first_open(watermark) - 1)

    def close_marked(self, state: KeyState, buffer: Buffer, step: int, original: Any = None) -> list[Output]:
        """A marker (a lifelong task's end) closes ``step`` and every earlier open step now; a marker of
        a closed step is late."""
        if state.ended or step < state.next_step:
            reason, detail = self.policy.late(step)
            return [_dead(reason, detail, state.key, original)]
        return self.close_through(state, buffer, step)

    def close_through(self, state: KeyState, buffer: Buffer, upto: int) -> list[Output]:
        """Close the open steps ``next_step..upto`` (clipped to the public end) in order, in one call."""
        with self._noise_of(state):
            return self._close_through(state, buffer, upto)

    def _close_through(self, state: KeyState, buffer: Buffer, upto: int) -> list[Output]:
        if self.last_step is not None:
            upto = min(upto, self.last_step)
        if state.ended or upto < state.next_step:
            return []
        by_step: dict[int, list] = {}
        keep, carried = [], []
        admits = hasattr(self.policy, "admit")  # a group of streams: every buffered item names members
        consumed = state.lowest is not None and (state.lowest <= upto or admits)  # else never read the buffer
        for step, item in buffer.read() if consumed else ():
            if step == CARRIED:
                carried.append(item)
            elif step <= upto:
                by_step.setdefault(step, []).append(item)
            else:
                keep.append((step, item))
        mechanism = self.policy.mechanism
        mech_state = self._decode(_as_bytes(state.mechanism))
        context = self.policy.begin(carried, upto - state.next_step + 1)
        if admits and consumed:
            mech_state = self.policy.admit(mech_state, [item for _, item in keep] + carried +
                                           [item for items in by_step.values() for item in items])
        out: list[Output] = []
        for step in range(state.next_step, upto + 1):  # every step releases, empty ones included
            mech_state = self._close_one(state, buffer, mech_state, step, by_step.get(step, []), context, out)
            if mech_state is None:  # the stream ended at its public end
                return out
        finished = self.last_step is not None and upto >= self.last_step
        outputs, carried = self.policy.end(state.key, mech_state, context, finished)
        out.extend(outputs)
        state.mechanism = _as_array(mechanism.encode_state(mech_state))
        state.next_step = upto + 1
        state.ended = state.ended or finished
        if consumed and state.lowest <= upto:
            buffer.clear()
            for entry in keep:
                buffer.add(entry)
            for item in carried:
                buffer.add((CARRIED, item))
            steps = [step for step, _ in keep] + ([CARRIED] if carried else [])
            state.lowest = min(steps) if steps else None
        return out

    def _close_one(self, state: KeyState, buffer: Buffer, mech_state: Any, step: int, items: list, context: Any,
                   out: list[Output]) -> Any | None:
        """Feed one step. A ``ValueError`` from the mechanism (its public end) ends the stream: one
        ``stream_ended`` dead letter, state and buffers freed; returns None."""
        try:
            new, releases, letters = self.policy.close(state.key, mech_state, step, items, context)
        except ValueError as exc:
            reason = f"step {step} refused by {self.policy.mechanism.name}: {str(exc)[:200]}"
            return self._end_stream(state, buffer, reason, out)
        out.extend(Output(DEAD_LETTER, letter) for letter in letters)
        times = (None, None)
        if self.clock is not None and self.policy.timed_rows:
            times = (self.clock.step_start_micros(step), self.clock.step_end_micros(step))
        guarantee = self.policy.mechanism.guarantee
        if state.offset:  # the mechanism counts the key's own steps; rows carry the schedule's
            releases = [dataclasses.replace(release, step=release.step + state.offset) for release in releases]
        out.extend(Output(RELEASE, ReleaseColumns(release, guarantee, *times) if isinstance(release, ReleaseBatch)
                          else release_to_row(release, guarantee, *times)) for release in releases)
        if self.idle_steps is not None and self._idle(state, releases):
            moved = f"its releases moved by at most {self.idle_threshold:g} over its last {self.idle_steps} steps"
            return self._end_stream(state, buffer, f"idle after step {step}: {moved}", out)
        return new

    def _idle(self, state: KeyState, releases: list) -> bool:
        """The idle rule after one step's releases (one prefix-sum release per step): appends the released
        value to ``state.recent`` (the last ``idle_steps + 1`` values, the first the empty sum) and tells
        whether ``‖release_t − release_{t−k}‖₂ ≤ idle_threshold``. Reads released values only."""
        value = np.concatenate([np.asarray(release.value, dtype=np.float64).ravel() for release in releases])
        recent = state.recent if state.recent is not None and state.recent.size else np.zeros((1, value.size))
        state.recent = np.vstack([recent, value[None, :]])[-(self.idle_steps + 1):]
        return (len(state.recent) == self.idle_steps + 1
                and float(np.linalg.norm(state.recent[-1] - state.recent[0])) <= self.idle_threshold)

    def _end_stream(self, state: KeyState, buffer: Buffer, reason: str, out: list[Output]) -> None:
        """Rule 6: one ``stream_ended`` dead letter, the key's state and buffers freed; returns None."""
        detail = f"the stream ended: {reason}; buffered contributions of later steps are discarded"
        out.append(_dead(Reason.STREAM_ENDED, detail, state.key))
        state.mechanism = np.zeros(0, dtype=np.uint8)
        state.ended = state.stream_ended = True
        state.lowest = state.recent = None
        buffer.clear()
        return None

    def finish(self, state: KeyState, buffer: Buffer) -> list[Output]:
        """The watermark reached +infinity: release what the end rule allows, dead-letter the rest."""
        if state.ended:
            return []
        streaming, state.provisional = state.provisional, False  # a provisional key is streaming, even unfired
        if self.clock is not None and state.next_step < 1:  # a provisional key that never got a step
            upto = -1
        elif self.clock is None:
            upto = self.last_step if self.block_size is None and self.last_step is not None else state.next_step - 1
        elif state.watermark is None and state.first_rung is None and not streaming:  # a replay
            upto = self.last_step if self.last_step is not None else state.next_step - 1
        elif state.first_rung in (None, state.next_step):  # at rest: next_step is the first step W_last left open
            upto = self.end_step(state.next_step)
        else:  # a rung closed steps since the first rung was set: the ladder already closed what the rule allows
            upto = state.next_step - 1
        out = self.close_through(state, buffer, upto)
        if self.block_size is None:  # an incomplete count block is simply never released
            unclosed = sorted({step for step, _ in buffer.read() if step != CARRIED})
            out.extend(_dead(Reason.UNCLOSED, f"step {step} never closed: the input ended first", state.key)
                       for step in unclosed)
            if not state.ended:
                carried = [item for step, item in buffer.read() if step == CARRIED]
                with self._noise_of(state):
                    out.extend(self.policy.end(state.key, None, self.policy.begin(carried), True)[0])
            buffer.clear()
            state.lowest = None
        state.ended = True
        return out


def _as_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


def _as_bytes(array: np.ndarray) -> bytes:
    return np.asarray(array, dtype=np.uint8).tobytes()
