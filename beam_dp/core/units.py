"""Privacy units: keyed unit hashes and contribution bounding per unit (user-level DP), engine-neutral.

A *privacy unit* (a user, a device) may send many events. :func:`unit_hash` turns each unit id into a
64-bit keyed hash (BLAKE2b under the job's secret key, personalisation :data:`UNIT_PERSON`, distinct from
every noise derivation); only hashes are kept in state, never a clear id. Two ids sharing a hash
(probability about ``n²/2⁶⁵`` for ``n`` units) are bounded as one unit: fewer contributions, never more.

:func:`bound_block` bounds one closed step's contributions, given :class:`UnitBounds` ``(m, c, k, b, W)``
and the :class:`UnitLedger` of the units' past steps. After it, for every unit:

* it takes part in this step only if its ledger allows: fewer than ``k`` steps taken over the ledger's
  life (``window=None``) or within the last ``W`` steps ``(step − W, step]`` (the window rule), and at
  least ``b`` steps after its last one; a refused unit's contributions are all dropped;
* it contributes to at most ``m`` streams of the step and at most ``c`` contributions to each;
* its contributions to one (stream, step) are summed and the sum clipped to L2 norm ``clip_bound``:
  one value of norm at most ``R`` per (unit, stream, step).

Which contributions are kept is a function of the unit's own contributions (as a multiset: not their
arrival order, which an engine's buffers do not fix across retries) and the secret key, never of other
units: the ``m`` streams and ``c`` contributions with the smallest keyed 64-bit priorities of
``(unit, stream, step)`` and ``(unit, stream, step, value)`` (splitmix64 finaliser rounds over the keyed
unit and stream hashes and two words keyed under :data:`BOUND_PERSON`). The guarantee needs no more: any
choice that depends on one unit's data alone bounds that unit; the key only keeps a unit from steering
it. Equal values share a priority (which of them is kept changes nothing). Every dropped contribution has
exactly one reason (:data:`DROP_REASONS`, the first that applies); drops are counted, never released.

:func:`bound_sorted` (rows already sorted by unit and stream, streams as indices: the batch replay's) and
:func:`bound_unit` (one unit the ledger admits: a streaming stage's) make the same choices and sums.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Sequence

import numpy as np

from beam_dp.core.clipping import clip_l2
from beam_dp.core.limits import MAX_COUNT, MAX_SCALE, MIN_SCALE, check_count, check_number, is_utf8

__all__ = [
    "BOUND_PERSON", "DROP_REASONS", "MAX_UNIT_ID_BYTES", "MAX_WINDOW_STEPS", "NO_STEP", "UNIT_PERSON",
    "BoundedBlock", "SortedBlock", "UnitBlock", "UnitBounds", "UnitKeys", "UnitLedger", "bound_block", "bound_sorted",
    "bound_unit", "unit_hash", "unit_id_problems",
]

# BLAKE2b personalisations (<= 16 bytes), the versions of the derivations: unit hashes, and the keys of
# the bounding choices. Distinct from the noise derivations (beam_dp-cells-v2, beam_dp-noise-v1, ...).
UNIT_PERSON = b"beam_dp-unit-v1"
BOUND_PERSON = b"beam_dp-bound-v1"
MAX_UNIT_ID_BYTES = 1024
#: the largest ``max_steps`` under the window rule: the ledger keeps that many step numbers per unit
MAX_WINDOW_STEPS = 64
#: the step number of an empty ledger slot (a unit with fewer steps taken than slots)
NO_STEP = -(2**62)
#: drop reasons, in the order they are tried (a contribution gets the first that applies)
DROP_REASONS = ("over_steps", "too_close", "over_streams", "over_contributions")
_OVER_STEPS, _TOO_CLOSE, _OVER_STREAMS, _OVER_CONTRIBUTIONS = 1, 2, 3, 4
_MIN_KEY_BYTES = 16
_SCALE_BITS = 64  # a sum that overflows float64 is recomputed on values scaled by 2**-64 (exact)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


class UnitKeys:
    """The keyed hashes of privacy units and of the bounding choices under one secret key (the job's).

    Like ``NoiseSource`` it never shows the key (``repr``) and cannot be pickled: build it on the worker.
    """

    MAX_CACHED = 1 << 16

    def __init__(self, secret: bytes):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < _MIN_KEY_BYTES:
            raise ValueError(f"the unit key must be at least {_MIN_KEY_BYTES} bytes")
        secret = bytes(secret)
        self._key = secret if len(secret) <= 64 else hashlib.blake2b(secret, digest_size=64).digest()
        self._units = hashlib.blake2b(key=self._key, digest_size=8, person=UNIT_PERSON)
        self._streams: dict[str, int] = {}
        self._contribution_words = self._key_words(b"contributions")
        self._stream_words = self._key_words(b"streams")

    def __repr__(self) -> str:
        return "UnitKeys(<secret key>)"

    def __reduce__(self):
        raise TypeError("UnitKeys holds a secret key and must not be pickled; build it on the worker")

    def _digest(self, message: bytes, size: int) -> bytes:
        return hashlib.blake2b(message, key=self._key, digest_size=size, person=BOUND_PERSON).digest()

    def _key_words(self, purpose: bytes) -> np.ndarray:
        return np.frombuffer(self._digest(purpose, 16), dtype="<u8").astype(np.uint64)

    def stream_hashes(self, names: Sequence[str]) -> np.ndarray:
        """The keyed 64-bit hash of each stream id (cached): what the choices see of a stream."""
        known = list(map(self._streams.get, names))  # the usual case once the streams are known: one C-level pass
        if None in known:
            fresh = {}
            for name in {name for name, h in zip(names, known) if h is None}:
                raw = name.encode("utf-8")
                message = b"stream" + struct.pack("<I", len(raw)) + raw
                fresh[name] = int(np.frombuffer(self._digest(message, 8), dtype="<u8")[0])
            if len(self._streams) + len(fresh) > self.MAX_CACHED:
                self._streams.clear()
            self._streams.update(fresh)
            known = [fresh[name] if h is None else h for name, h in zip(names, known)]
        return np.array(known, dtype=np.uint64)

    def hash(self, ids: Sequence[Any]) -> np.ndarray:
        """The keyed 64-bit hash (uint64) of each unit id; ``ValueError`` naming the first bad row and why
        (never the id itself): filter with :func:`unit_id_problems` first."""
        try:
            encoded = list(map(str.encode, ids))
            sizes = list(map(len, encoded))
            valid = not sizes or (min(sizes) > 0 and max(sizes) <= MAX_UNIT_ID_BYTES)
        except (TypeError, UnicodeEncodeError):
            valid = False
        if not valid:
            row, detail = unit_id_problems(ids)[0]
            raise ValueError(f"unit id at row {row}: {detail}")
        base = self._units

        def digest(raw: bytes) -> bytes:
            h = base.copy()
            h.update(raw)
            return h.digest()

        return np.frombuffer(b"".join(map(digest, encoded)), dtype="<u8").astype(np.uint64)


def _keys(key: bytes | UnitKeys) -> UnitKeys:
    return key if isinstance(key, UnitKeys) else UnitKeys(key)


def unit_id_problems(ids: Sequence[Any]) -> list[tuple[int, str]]:
    """``(row, detail)`` of every id :func:`unit_hash` refuses (not a string, empty, not UTF-8, over
    :data:`MAX_UNIT_ID_BYTES` bytes); the detail never contains the id. All valid (the usual case): one
    C-level pass over the ids (encode, then lengths), no Python per id."""
    try:
        sizes = np.fromiter(map(len, map(str.encode, ids)), np.int64, len(ids))
        if not len(sizes) or (sizes.min() > 0 and sizes.max() <= MAX_UNIT_ID_BYTES):
            return []
    except (TypeError, UnicodeEncodeError):
        pass
    problems = []
    for row, unit in enumerate(ids):
        if not isinstance(unit, str):
            problems.append((row, "unit_id must be a string"))
        elif not unit:
            problems.append((row, "unit_id must not be empty"))
        elif not is_utf8(unit):
            problems.append((row, "unit_id must be encodable as UTF-8"))
        elif len(unit.encode("utf-8")) > MAX_UNIT_ID_BYTES:
            problems.append((row, f"unit_id must be at most {MAX_UNIT_ID_BYTES} bytes in UTF-8"))
    return problems


def unit_hash(key: bytes | UnitKeys, ids: Sequence[Any]) -> np.ndarray:
    """The keyed 64-bit hashes (uint64 ``(n,)``) of ``n`` unit ids under the job's secret key: BLAKE2b-64 of
    the id's UTF-8 bytes, keyed, personalisation :data:`UNIT_PERSON`. ``ValueError`` for a bad id."""
    return _keys(key).hash(ids)


@dataclass(frozen=True)
class UnitBounds:
    """How much one privacy unit may contribute.

    Args:
        max_streams_per_step: ``m``: per step a unit contributes to at most this many streams.
        max_contributions_per_step: ``c``: per (stream, step) at most this many of a unit's contributions
            are summed (the sum is then clipped).
        max_steps: ``k``: a unit takes part in at most this many steps over the stream's life, or within
            any ``window`` consecutive steps (then at most :data:`MAX_WINDOW_STEPS`).
        min_separation: ``b``: two steps a unit takes part in are at least this many steps apart (1: any).
        window: ``W`` for window-DP families (the rule counts steps in ``(step − W, step]``); ``None``:
            the forever rule.
    """

    max_streams_per_step: int
    max_contributions_per_step: int
    max_steps: int
    min_separation: int = 1
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_streams_per_step", "max_contributions_per_step", "min_separation"):
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        high = MAX_COUNT if self.window is None else MAX_WINDOW_STEPS  # the window rule keeps k steps per unit
        object.__setattr__(self, "max_steps", check_count("max_steps", self.max_steps, 1, high))
        if self.window is not None:
            object.__setattr__(self, "window", check_count("window", self.window))

    @property
    def rule(self) -> tuple[int, int, int | None]:
        """``(max_steps, min_separation, window)``: what a ledger is kept under."""
        return self.max_steps, self.min_separation, self.window

    @property
    def slots(self) -> int:
        """Step numbers a ledger keeps per unit: the last one (forever rule) or the last ``k`` (window)."""
        return 1 if self.window is None else self.max_steps


def _find(table: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, found)``: where each of ``values`` lies in the ascending ``table``, and whether it is there."""
    pos = np.searchsorted(table, values)
    found = pos < len(table)
    found[found] = table[pos[found]] == values[found]
    return pos, found


@dataclass(frozen=True, eq=False)
class UnitLedger:
    """The steps privacy units took part in, by unit hash (never a clear id).

    ``units`` (uint64, ascending) are the units that may still be refused; ``steps[i]`` their most recent
    steps taken, ascending (``slots`` of them, :data:`NO_STEP` in front while fewer); ``taken[i]`` their
    steps taken while in the ledger (the forever rule's count). Under the forever rule a unit that took
    ``k`` steps leaves ``units`` for ``exhausted`` (uint64, ascending): its hash alone, kept for good, so
    it never takes part again, across restores too. Under the window rule a unit's row is dropped after
    ``max(W, b)`` steps of inactivity. ``step``: the last step bounded (0: none). State: 8·(slots + 2)
    bytes per active unit, 8 per exhausted one.
    """

    STATE_VERSION: ClassVar[int] = 1
    max_steps: int
    min_separation: int
    window: int | None
    step: int
    units: np.ndarray
    steps: np.ndarray
    taken: np.ndarray
    exhausted: np.ndarray

    def __post_init__(self) -> None:
        bounds = UnitBounds(1, 1, self.max_steps, self.min_separation, self.window)
        check_count("step", self.step, 0, MAX_COUNT - 1)
        n = len(self.units) if isinstance(self.units, np.ndarray) else -1
        arrays_ok = (
            n >= 0 and self.units.dtype == np.uint64 and self.units.ndim == 1
            and isinstance(self.steps, np.ndarray) and self.steps.dtype == np.int64
            and self.steps.shape == (n, bounds.slots)
            and isinstance(self.taken, np.ndarray) and self.taken.dtype == np.int64 and self.taken.shape == (n,)
            and isinstance(self.exhausted, np.ndarray) and self.exhausted.dtype == np.uint64
            and self.exhausted.ndim == 1
        )
        if not arrays_ok:
            raise ValueError("a unit ledger needs uint64 units (n,), int64 steps (n, slots) and taken (n,), "
                             "uint64 exhausted (e,)")
        if (self.units[1:] <= self.units[:-1]).any() or (self.exhausted[1:] <= self.exhausted[:-1]).any():
            raise ValueError("a unit ledger's units and exhausted units must be ascending and distinct")
        if self.window is not None and len(self.exhausted):
            raise ValueError("a window-rule unit ledger has no exhausted units")
        if n and ((self.taken < 1).any() or (self.steps[:, -1] > self.step).any()
                  or (self.steps[:, -1] < 1).any() or (self.window is None and (self.taken >= self.max_steps).any())):
            raise ValueError("a unit ledger row has a step after the ledger's step or an impossible count")

    @classmethod
    def empty(cls, bounds: UnitBounds) -> "UnitLedger":
        """The ledger of no units yet, kept under ``bounds.rule``."""
        return cls(bounds.max_steps, bounds.min_separation, bounds.window, 0, np.zeros(0, np.uint64),
                   np.zeros((0, bounds.slots), np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64))

    def __len__(self) -> int:
        return len(self.units)

    @property
    def rule(self) -> tuple[int, int, int | None]:
        """``(max_steps, min_separation, window)``: the :attr:`UnitBounds.rule` it is kept under."""
        return self.max_steps, self.min_separation, self.window

    def refusals(self, units: np.ndarray, step: int) -> np.ndarray:
        """Per unit hash (``units`` ascending, distinct): 0 if it may take part in ``step``, else the
        index + 1 in :data:`DROP_REASONS` of why not (``over_steps`` or ``too_close``)."""
        pos, found = _find(self.units, units)
        last = np.full(len(units), NO_STEP, np.int64)
        last[found] = self.steps[pos[found], -1]
        if self.window is None:
            taken = np.zeros(len(units), np.int64)
            taken[found] = self.taken[pos[found]]
            over = (taken >= self.max_steps) | _find(self.exhausted, units)[1]
        else:  # the oldest of the last k steps taken lies inside the window: k steps in (step - W, step]
            oldest = np.full(len(units), NO_STEP, np.int64)
            oldest[found] = self.steps[pos[found], 0]
            over = oldest > step - self.window
        close = step - last < self.min_separation
        return np.where(over, _OVER_STEPS, np.where(close, _TOO_CLOSE, 0)).astype(np.int8)

    def advanced(self, step: int, admitted: np.ndarray) -> "UnitLedger":
        """The ledger after ``step``: the units ``admitted`` (ascending, distinct, all allowed by
        :meth:`refusals`) took part; exhausted units moved out (forever rule) and inactive rows expired
        (window rule)."""
        step = check_count("step", step, self.step + 1, MAX_COUNT - 1)
        units, steps, taken, exhausted = self.units, self.steps, self.taken, self.exhausted
        pos, found = _find(units, admitted)
        if found.all():
            steps, taken = steps.copy(), taken.copy()
        else:  # fresh rows (no step taken yet) inserted in place, then advanced with the others
            fresh = admitted[~found]
            at = np.searchsorted(units, fresh)
            units = np.insert(units, at, fresh)
            steps = np.insert(steps, at, np.full((len(fresh), steps.shape[1]), NO_STEP, np.int64), axis=0)
            taken = np.insert(taken, at, np.zeros(len(fresh), np.int64))
            pos = np.searchsorted(units, admitted)
        steps[pos, :-1], steps[pos, -1] = steps[pos, 1:], step
        taken[pos] += 1
        if self.window is None:  # only the rows that took this step can have reached k
            done = pos[taken[pos] >= self.max_steps]
            exhausted = np.insert(exhausted, np.searchsorted(exhausted, units[done]), units[done])
        else:
            done = np.flatnonzero(step - steps[:, -1] >= max(self.window, self.min_separation))
        if len(done):
            units, steps, taken = np.delete(units, done), np.delete(steps, done, axis=0), np.delete(taken, done)
        return dataclasses.replace(self, step=step, units=units, steps=steps, taken=taken, exhausted=exhausted)


class BoundedBlock(NamedTuple):
    """One step's contributions after :func:`bound_block`.

    ``units`` (uint64), ``streams`` (str) and ``sums`` ((p, d) or (p,) as the values, L2 norm at most
    ``clip_bound``) are the kept (unit, stream) pairs, ordered by (unit hash, stream id); ``clipped`` marks
    the sums that were clipped (a sum of several rows is taken in their order in the block, which can
    move its last bits). ``row_drops`` (int8 per input row): 0 kept, else the index + 1 in
    :data:`DROP_REASONS` of why the row was dropped (to route its raw value to the private dead letters
    only); ``drops``: dropped contributions per reason. ``ledger``: the ledger after this step.
    """

    units: np.ndarray
    streams: np.ndarray
    sums: np.ndarray
    clipped: np.ndarray
    row_drops: np.ndarray
    drops: dict[str, int]
    ledger: UnitLedger


def _stream_codes(streams: Any, n: int, names: Sequence[str] | None) -> tuple[list[str], np.ndarray]:
    """The distinct stream ids, sorted, and each row's index into them (``streams`` are ids, or indices
    into ``names``)."""
    if names is None:
        try:
            names = list(dict.fromkeys(streams))
        except TypeError:
            raise ValueError("stream ids must be non-empty UTF-8 strings") from None
        codes = None
    else:
        names = list(names)
        codes = np.asarray(streams)
        if codes.shape != (n,) or codes.dtype.kind not in "iu" or (n and not 0 <= codes.min() <= codes.max() < len(names)):
            raise ValueError(f"streams must be {n} indices into stream_names")
    try:  # every name non-empty UTF-8 text, in C-level passes
        valid = min(map(len, map(str.encode, names)), default=1) > 0 and len(set(names)) == len(names)
    except (TypeError, UnicodeEncodeError):
        valid = False
    if not valid:
        raise ValueError("stream ids must be distinct non-empty UTF-8 strings")
    ranked = sorted(names)
    if codes is None:
        index = {s: i for i, s in enumerate(ranked)}
        return ranked, np.fromiter(map(index.__getitem__, streams), np.int64, n)
    if ranked == names:  # names given in order (the usual case)
        return ranked, codes.astype(np.int64)
    rank = np.argsort(np.argsort(np.array(names, dtype=object)))  # each name's place among the sorted names
    return ranked, rank[codes.astype(np.int64)]


def _runs(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in ``sorted_keys`` (non-empty)."""
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])


def _beyond(segments: np.ndarray, priority: np.ndarray, limit: int) -> np.ndarray:
    """Whether each element ranks ``limit`` or later (0 = smallest ``priority``) within its segment
    (``segments`` non-decreasing, non-empty; equal priorities in any order): one sort of (segment, top bits
    of priority), or of both words where the top bits of two different priorities tie."""
    new = np.r_[True, segments[1:] != segments[:-1]]
    dense = np.cumsum(new, dtype=np.uint64) - np.uint64(1)
    bits = max(1, int(dense[-1]).bit_length())
    packed = (dense << np.uint64(64 - bits)) | (priority >> np.uint64(bits))
    order = np.argsort(packed)
    tie = np.flatnonzero(packed[order[1:]] == packed[order[:-1]])
    if len(tie) and (priority[order[tie]] != priority[order[tie + 1]]).any():
        order = np.lexsort((priority, dense))
    starts = np.flatnonzero(new)  # the segments hold the same places in sorted order
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    out = np.empty(len(order), bool)
    out[order] = rank >= limit
    return out


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser (a bijection of uint64 with full avalanche), in place."""
    z ^= z >> np.uint64(30)
    z *= _MIX[1]
    z ^= z >> np.uint64(27)
    z *= _MIX[2]
    z ^= z >> np.uint64(31)
    return z


def _words(key: np.ndarray, distinct: np.ndarray, stream_hash: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The keyed words of each distinct unit and of each stream at ``step``, under one purpose's ``key``: a
    priority is ``mix(unit word ^ stream word)`` (then ``mix(· ^ value digest)`` for a contribution)."""
    step_word = _mix(np.array([step], np.uint64) ^ key[1])
    return _mix(distinct ^ key[0]), _mix(stream_hash ^ step_word)


def _value_digests(values: np.ndarray) -> np.ndarray:
    """A 64-bit digest of each row's float64 bits (-0.0 read as 0.0): equal values, equal digests."""
    z = _mix((values + 0.0).view(np.uint64) ^ (np.arange(1, values.shape[1] + 1, dtype=np.uint64) * _MIX[0]))
    return np.bitwise_xor.reduce(z, axis=1)


def _clipped_sums(values: np.ndarray, starts: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The sums of the runs of rows starting at ``starts``, clipped to L2 norm ``bound``. A sum beyond
    float64 is recomputed on the values times 2**-64 (exact), clipped to ``bound``·2**-64, scaled back."""
    if not len(starts):
        return np.zeros((0, values.shape[1])), np.zeros(0, bool)
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.add.reduceat(values, starts, axis=0)
    bad = np.flatnonzero(~np.isfinite(sums).all(axis=1))
    if len(bad):
        sums[bad] = 0.0
    out, clipped = clip_l2(sums, bound)
    if len(bad):
        lengths = np.diff(np.r_[starts, len(values)])
        rows = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in bad])
        small = np.add.reduceat(values[rows] * 2.0**-_SCALE_BITS, np.r_[0, np.cumsum(lengths[bad])[:-1]], axis=0)
        fixed, clipped[bad] = clip_l2(small, bound * 2.0**-_SCALE_BITS)
        out[bad] = fixed * 2.0**_SCALE_BITS
    return out, clipped


class SortedBlock(NamedTuple):
    """One step's contributions after :func:`bound_sorted` (as :class:`BoundedBlock`, streams as indices).

    ``units`` (uint64) and ``codes`` (int64 indices into the caller's stream table) are the kept (unit,
    stream) pairs, ordered by (unit hash, code); ``sums``, ``clipped``, ``drops`` and ``ledger`` as in
    :class:`BoundedBlock`; ``row_drops`` (int8) per input row, in the input's (sorted) order.
    """

    units: np.ndarray
    codes: np.ndarray
    sums: np.ndarray
    clipped: np.ndarray
    row_drops: np.ndarray
    drops: dict[str, int]
    ledger: UnitLedger


def _checked(ledger: UnitLedger, step: int, unit_hashes: Any, values: Any, bounds: UnitBounds,
             clip_bound: float) -> tuple[int, float, np.ndarray, np.ndarray]:
    """``(step, clip bound, unit hashes, values as (n, d) rows)`` once checked (``ValueError`` why not)."""
    if ledger.rule != bounds.rule:
        raise ValueError(f"the unit ledger is kept under (max_steps, min_separation, window) = {ledger.rule}, "
                         f"not {bounds.rule}")
    step = check_count("step", step, ledger.step + 1, MAX_COUNT - 1)
    bound = check_number("clip_bound", clip_bound, MIN_SCALE, MAX_SCALE)
    units = np.asarray(unit_hashes)
    if units.dtype != np.uint64 or units.ndim != 1:
        raise ValueError("unit_hashes must be a uint64 array (n,) from unit_hash")
    vals = np.asarray(values, dtype=np.float64)
    rows = vals[:, None] if vals.ndim == 1 else vals
    if rows.ndim != 2 or len(rows) != len(units):
        raise ValueError(f"values must be (n,) or (n, d) with n = {len(units)} rows, got shape {vals.shape}")
    if not np.isfinite(rows).all():
        raise ValueError("values must be finite (dead-letter NaN and inf first)")
    return step, bound, units, rows


def _shift(n: int, streams: int) -> int:
    """Bits of a stream index in a group key ``(unit rank << shift) | stream`` (``ValueError`` past 62 in all)."""
    shift = max(1, (streams - 1).bit_length())
    if n and (n - 1).bit_length() + shift > 62:
        raise ValueError(f"a block of {n:,} rows and {streams:,} streams is too large: split it by unit")
    return shift


def _bound_sorted(ledger: UnitLedger, step: int, units: np.ndarray, by_group: np.ndarray, new_unit: np.ndarray,
                  shift: int, rows: np.ndarray, stream_hash: np.ndarray, bounds: UnitBounds, keys: UnitKeys,
                  bound: float) -> SortedBlock:
    """The bounding of rows sorted by group key ``by_group`` ((unit rank << shift) | stream index, n > 0):
    every pass on the sorted rows, no sort but the priority ranks'."""
    n = len(units)
    distinct = units[new_unit]
    refused = ledger.refusals(distinct, step)
    starts = _runs(by_group)
    group_key = by_group[starts]
    group_unit, group_stream = group_key >> shift, group_key & ((1 << shift) - 1)
    group_size = np.diff(np.r_[starts, n])
    group_drop = refused[group_unit]
    # at most m streams per admitted unit: the m of smallest keyed priority
    open_ = np.flatnonzero(group_drop == 0)
    per_unit = np.bincount(group_unit[open_], minlength=len(distinct))
    many = open_[per_unit[group_unit[open_]] > bounds.max_streams_per_step]
    if len(many):
        unit_word, stream_word = _words(keys._stream_words, distinct, stream_hash, step)
        priority = _mix(unit_word[group_unit[many]] ^ stream_word[group_stream[many]])
        group_drop[many[_beyond(group_unit[many], priority, bounds.max_streams_per_step)]] = _OVER_STREAMS
    row_drop = np.repeat(group_drop, group_size)
    # at most c contributions per kept (unit, stream): the c of smallest keyed priority of their values
    full = np.flatnonzero((group_drop == 0) & (group_size > bounds.max_contributions_per_step))
    if len(full):
        in_full = np.zeros(len(starts), bool)
        in_full[full] = True
        full_rows = np.flatnonzero(np.repeat(in_full, group_size))
        row_group = np.repeat(np.arange(len(starts)), group_size)[full_rows]
        unit_word, stream_word = _words(keys._contribution_words, distinct, stream_hash, step)
        priority = _mix(unit_word[group_unit[row_group]] ^ stream_word[group_stream[row_group]])
        priority ^= _value_digests(rows[full_rows])
        over = _beyond(row_group, _mix(priority), bounds.max_contributions_per_step)
        row_drop[full_rows[over]] = _OVER_CONTRIBUTIONS
    kept = row_drop == 0
    every = bool(kept.all())
    kept_groups = by_group if every else by_group[kept]
    kept_starts = (starts if every else _runs(kept_groups)) if len(kept_groups) else np.zeros(0, np.int64)
    sums, clipped = _clipped_sums(rows if every else rows[kept], kept_starts, bound)
    kept_groups = kept_groups[kept_starts]
    counts = np.bincount(row_drop, minlength=len(DROP_REASONS) + 1)[1:]
    return SortedBlock(distinct[kept_groups >> shift], kept_groups & ((1 << shift) - 1), sums, clipped, row_drop,
                       dict(zip(DROP_REASONS, map(int, counts))), ledger.advanced(step, distinct[refused == 0]))


def bound_sorted(ledger: UnitLedger, step: int, unit_hashes: np.ndarray, codes: np.ndarray, values: Any,
                 stream_hashes: np.ndarray, bounds: UnitBounds, key: bytes | UnitKeys, *,
                 clip_bound: float) -> SortedBlock:
    """:func:`bound_block` of rows already sorted by (unit hash, stream), the streams as indices: the same
    choices and sums, without its sorts and its stream table (the batch replay's path).

    Args:
        unit_hashes: uint64 ``(n,)``, ascending.
        codes: int ``(n,)``: each row's index into ``stream_hashes``, ascending within a unit; the
            indices must follow the stream ids' order (index ``i`` < ``j`` when id ``i`` < id ``j``).
        stream_hashes: uint64: :meth:`UnitKeys.stream_hashes` of the (sorted) stream ids.
        ledger, step, values, bounds, key, clip_bound: as :func:`bound_block`.
    """
    keys = _keys(key)
    step, bound, units, rows = _checked(ledger, step, unit_hashes, values, bounds, clip_bound)
    stream_hash = np.asarray(stream_hashes)
    codes = np.asarray(codes)
    n, flat = len(units), np.ndim(values) == 1
    if stream_hash.dtype != np.uint64 or stream_hash.ndim != 1:
        raise ValueError("stream_hashes must be a uint64 array from UnitKeys.stream_hashes")
    if codes.shape != (n,) or codes.dtype.kind not in "iu" or (n and not 0 <= codes.min() <= codes.max() < len(stream_hash)):
        raise ValueError(f"codes must be {n} indices into stream_hashes")
    if n == 0:
        return SortedBlock(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros((0,) if flat else (0, rows.shape[1])),
                           np.zeros(0, bool), np.zeros(0, np.int8), dict.fromkeys(DROP_REASONS, 0),
                           ledger.advanced(step, units))
    shift = _shift(n, len(stream_hash))
    new_unit = np.r_[True, units[1:] != units[:-1]]
    by_group = ((np.cumsum(new_unit) - 1) << shift) | codes.astype(np.int64)
    if (units[1:] < units[:-1]).any() or (by_group[1:] < by_group[:-1]).any():
        raise ValueError("bound_sorted needs rows sorted by (unit hash, stream index)")
    out = _bound_sorted(ledger, step, units, by_group, new_unit, shift, rows, stream_hash, bounds, keys, bound)
    return out._replace(sums=out.sums[:, 0]) if flat else out


def bound_block(ledger: UnitLedger, step: int, unit_hashes: np.ndarray, streams: Any, values: Any,
                bounds: UnitBounds, key: bytes | UnitKeys, *, clip_bound: float,
                stream_names: Sequence[str] | None = None) -> BoundedBlock:
    """Bound the contributions of one closed ``step`` per privacy unit (see the module docstring).

    Args:
        ledger: the units' past steps, kept under ``bounds.rule``; ``step`` must come after its step.
        step: the step (1-based) all rows belong to; every row of a unit for this step must be in this call.
        unit_hashes: uint64 ``(n,)``, from :func:`unit_hash`.
        streams: ``n`` stream ids, or (with ``stream_names``) ``n`` integer indices into ``stream_names``.
        values: ``(n,)`` or ``(n, d)`` finite numbers.
        bounds: the per-unit bounds.
        key: the job's secret key (bytes) or its :class:`UnitKeys`.
        clip_bound: ``R``: the L2 norm each kept (unit, stream) sum is clipped to.
        stream_names: the distinct stream ids ``streams`` index, or ``None`` (``streams`` are ids).
    """
    keys = _keys(key)
    step, bound, units, rows = _checked(ledger, step, unit_hashes, values, bounds, clip_bound)
    n, flat = len(units), np.ndim(values) == 1
    names, codes = _stream_codes(streams, n, stream_names)
    if n == 0:
        empty = np.zeros((0,) if flat else (0, rows.shape[1]))
        return BoundedBlock(np.zeros(0, np.uint64), np.zeros(0, object), empty, np.zeros(0, bool),
                            np.zeros(0, np.int8), dict.fromkeys(DROP_REASONS, 0), ledger.advanced(step, units))
    shift = _shift(n, len(names))
    by_unit = np.argsort(units)
    sorted_units = units[by_unit]
    new_unit = np.r_[True, sorted_units[1:] != sorted_units[:-1]]
    # groups (unit, stream), ordered by (unit hash, stream id): key (unit's rank << shift) | stream
    by_group = ((np.cumsum(new_unit) - 1) << shift) | codes[by_unit]
    within = np.argsort(by_group, kind="stable")
    order = by_unit[within]
    out = _bound_sorted(ledger, step, units[order], by_group[within], new_unit, shift, rows[order],
                        keys.stream_hashes(names), bounds, keys, bound)
    row_drops = np.empty(n, np.int8)
    row_drops[order] = out.row_drops
    return BoundedBlock(out.units, np.array(names, dtype=object)[out.codes], out.sums[:, 0] if flat else out.sums,
                        out.clipped, row_drops, out.drops, out.ledger)


class UnitBlock(NamedTuple):
    """One admitted unit's step after :func:`bound_unit`: its kept ``streams`` (ids, sorted), their
    ``sums`` ((p, d), L2 norm at most ``clip_bound``) and ``clipped`` marks, and ``row_drops`` (int8 per
    input row, as :attr:`BoundedBlock.row_drops`: 0, ``over_streams`` or ``over_contributions``)."""

    streams: list[str]
    sums: np.ndarray
    clipped: np.ndarray
    row_drops: np.ndarray


def bound_unit(unit: np.uint64, step: int, streams: Sequence[str], values: np.ndarray, bounds: UnitBounds,
               keys: UnitKeys, *, clip_bound: float) -> UnitBlock:
    """:func:`bound_block`'s choices and sums for one unit its ledger admits to ``step`` (the caller checks
    the ledger): the same streams, contributions and sums, in a few small passes (a streaming unit
    stage's path). ``streams``: the rows' ids (non-empty UTF-8); ``values``: ``(n, d)`` finite, ``n > 0``."""
    names = sorted(set(streams))
    index = {name: i for i, name in enumerate(names)}
    codes = np.fromiter(map(index.__getitem__, streams), np.int64, len(streams))
    stream_hash = keys.stream_hashes(names)
    unit_hash = np.array([unit], np.uint64)
    row_drops = np.zeros(len(codes), np.int8)
    if len(names) > bounds.max_streams_per_step:  # the m streams of smallest keyed priority
        unit_word, stream_word = _words(keys._stream_words, unit_hash, stream_hash, step)
        out = np.zeros(len(names), bool)
        out[np.argsort(_mix(unit_word ^ stream_word))[bounds.max_streams_per_step:]] = True
        row_drops[out[codes]] = _OVER_STREAMS
    per_stream = np.bincount(codes[row_drops == 0], minlength=len(names))
    if (per_stream > bounds.max_contributions_per_step).any():  # the c of smallest keyed priority
        full = np.flatnonzero((per_stream > bounds.max_contributions_per_step)[codes] & (row_drops == 0))
        full = full[np.argsort(codes[full], kind="stable")]
        unit_word, stream_word = _words(keys._contribution_words, unit_hash, stream_hash, step)
        priority = _mix(unit_word ^ stream_word[codes[full]])
        priority ^= _value_digests(values[full])
        row_drops[full[_beyond(codes[full], _mix(priority), bounds.max_contributions_per_step)]] = _OVER_CONTRIBUTIONS
    kept = np.flatnonzero(row_drops == 0)
    kept = kept[np.argsort(codes[kept], kind="stable")]
    starts = _runs(codes[kept])
    sums, clipped = _clipped_sums(values[kept], starts, float(clip_bound))
    return UnitBlock([names[i] for i in codes[kept[starts]].tolist()], sums, clipped, row_drops)
