"""Streams keyed by group: one state for a group of streams that step together (engine-neutral).

An engine that keys by stream pays its per-key costs (state reads and writes, timers, one element per
release) once per stream and step. Keyed by group, it pays them once per group and step, and the
mechanism steps the whole group in one numpy operation
(:class:`~beam_dp.mechanisms.base.GroupSteppedSum`).

* **Membership is public.** A stream's group is ``group_of(stream, stream_groups)``: a stable keyed-free
  hash of its name (BLAKE2b), the same on every worker, engine and run. Noise cells stay keyed per
  stream, so a stream's releases do not depend on its group or on ``stream_groups``.
* **Joining.** :class:`GroupedSum` keeps *cohorts*: streams that joined the group at the same group
  step share one :class:`~beam_dp.mechanisms.base.GroupState`. A stream joins at the first step the
  group closes after its first item (or its declaration) arrived; its mechanism counts its own steps
  from there, exactly as a stream keyed alone that was first seen at that step. In a batch replay every
  stream joins at step 1.
* **Blocks.** :class:`GroupBlock` holds the clipped step sums of several streams of one group and
  step (made by the mechanism's ``clip_and_sum_groups``); blocks merge by stream.

The guarantee is the wrapped mechanism's, per stream: grouping changes no noise and no sensitivity.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import sys
from dataclasses import dataclass
from typing import ClassVar, Iterable, Sequence

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import GroupState, GroupSteppedSum

__all__ = ["MAX_STREAM_GROUPS", "GroupBlock", "GroupedSum", "StreamGroupsState", "group_key", "group_of",
           "groups_for"]

MAX_STREAM_GROUPS = 1 << 20
_PERSON = b"beam_dp-group-1"  # versioned: changing the hash moves streams between groups


def group_of(stream: str, stream_groups: int) -> int:
    """The group (``0 .. stream_groups − 1``) of ``stream``: a stable public hash of its name."""
    digest = hashlib.blake2b(stream.encode("utf-8"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "little") % stream_groups


def groups_for(mechanism: object, requested: int | None) -> int | None:
    """``requested`` groups where ``mechanism`` steps groups of streams, else None (key by stream):
    what a job's ``--stream-groups`` means for each of its transforms."""
    return requested if requested and isinstance(mechanism, GroupSteppedSum) else None


def group_key(group: int) -> str:
    """The engine key of a group (a string, like a stream's key)."""
    return f"stream-group-{group}"


@dataclass(frozen=True)
class GroupBlock:
    """Clipped step sums of several streams of one group at one step, sorted by stream name.

    ``sums[i]`` is stream ``streams[i]``'s sum of clipped contributions, ``counts[i]`` their number,
    ``clipped[i]`` how many were clipped (metrics only). A block with zero counts declares streams.
    """

    streams: tuple[str, ...]
    sums: np.ndarray
    counts: np.ndarray
    clipped: np.ndarray

    def __reduce__(self):
        """Pickled compactly (engines shuffle blocks by pickle): the names as one NUL-joined string (a
        tuple when a name holds a NUL), read back as interned strings, so that the blocks of a group
        decoded on one worker share one string object per stream instead of one per (stream, step) cell
        (about 56 bytes each)."""
        joined = "\0".join(self.streams)
        names = joined if len(self.streams) > 1 and joined.count("\0") == len(self.streams) - 1 else self.streams
        return _unpickle_group_block, (names, self.sums, self.counts, self.clipped)

    @classmethod
    def declaring(cls, streams: Iterable[str], dim: int) -> "GroupBlock":
        """A block that only declares ``streams`` (no contributions)."""
        names = tuple(sorted(set(streams)))
        zeros = np.zeros(len(names), dtype=np.int64)
        return cls(names, np.zeros((len(names), dim)), zeros, zeros.copy())

    @property
    def count(self) -> int:
        return int(np.sum(self.counts))

    def merge(self, other: "GroupBlock") -> "GroupBlock":
        return GroupBlock.combine([self, other])

    @staticmethod
    def combine(blocks: Sequence["GroupBlock"]) -> "GroupBlock":
        """One block summing ``blocks`` stream by stream (one sort of all their streams; a block and a
        one-stream block, an engine adding one contribution to a step's sums: one binary search)."""
        if len(blocks) == 1:
            return blocks[0]
        if len(blocks) == 2 and len(blocks[1].streams) == 1:
            return blocks[0]._with_row(blocks[1])
        names, where = np.unique(np.array([s for b in blocks for s in b.streams], dtype=str), return_inverse=True)
        n = len(names)
        sums = np.zeros((n, blocks[0].sums.shape[1]))
        np.add.at(sums, where, np.concatenate([b.sums for b in blocks]))
        counts = np.bincount(where, np.concatenate([b.counts for b in blocks]), minlength=n).astype(np.int64)
        clipped = np.bincount(where, np.concatenate([b.clipped for b in blocks]), minlength=n).astype(np.int64)
        return GroupBlock(tuple(names.tolist()), sums, counts, clipped)

    def _with_row(self, row: "GroupBlock") -> "GroupBlock":
        """This block plus a one-stream block (the stream's row added, or inserted in name order)."""
        stream = row.streams[0]
        i = bisect.bisect_left(self.streams, stream)
        if i < len(self.streams) and self.streams[i] == stream:
            sums, counts, clipped = self.sums.copy(), self.counts.copy(), self.clipped.copy()
            sums[i] += row.sums[0]
            counts[i] += row.counts[0]
            clipped[i] += row.clipped[0]
            return GroupBlock(self.streams, sums, counts, clipped)
        return GroupBlock(self.streams[:i] + (stream,) + self.streams[i:], np.insert(self.sums, i, row.sums[0], axis=0),
                          np.insert(self.counts, i, row.counts[0]), np.insert(self.clipped, i, row.clipped[0]))


_NAME_TUPLES: dict[str, tuple[str, ...]] = {}  # joined names -> their tuple, for the blocks read back here
_NAME_TUPLES_KEPT = 64  # distinct name lists remembered (a group's steps mostly repeat one list)


def _unpickle_group_block(names: str | tuple[str, ...], sums: np.ndarray, counts: np.ndarray,
                          clipped: np.ndarray) -> GroupBlock:
    """A block read back; blocks naming the same streams share one tuple of them (a memo of the names
    read here, never state: the block is the same without it)."""
    if not isinstance(names, str):
        return GroupBlock(names, sums, counts, clipped)
    streams = _NAME_TUPLES.get(names)
    if streams is None:
        streams = tuple(map(sys.intern, names.split("\0")))
        if len(_NAME_TUPLES) >= _NAME_TUPLES_KEPT:
            _NAME_TUPLES.clear()
        _NAME_TUPLES[names] = streams
    return GroupBlock(streams, sums, counts, clipped)


_POSITIONS: dict[tuple[str, ...], dict[str, int]] = {}  # a cohort's streams -> each one's position
_POSITIONS_KEPT = 64  # cohorts remembered (a worker steps a few groups, each mostly one cohort)


def _positions(streams: tuple[str, ...]) -> dict[str, int]:
    """Each stream's position in ``streams`` (a memo of the cohorts stepped here, never state: the
    answer is the same without it)."""
    positions = _POSITIONS.get(streams)
    if positions is None:
        positions = {name: i for i, name in enumerate(streams)}
        if len(_POSITIONS) >= _POSITIONS_KEPT:
            _POSITIONS.clear()
        _POSITIONS[streams] = positions
    return positions


@dataclass(frozen=True)
class StreamGroupsState:
    """A group's state: ``t`` group steps closed; each cohort a dict ``{"start": group step before its
    first, "streams": names, "arrays": the mechanism's stacked state fields}`` (see ``GroupState``)."""

    STATE_VERSION: ClassVar[int] = 1
    key: str
    t: int
    cohorts: tuple


class GroupedSum:
    """A :class:`GroupSteppedSum` presented to the step driver as one mechanism per *group* key.

    ``step`` feeds one :class:`GroupBlock` (or None) to every cohort and returns one
    :class:`ReleaseBatch` per cohort (step numbers in the group's steps). Guarantee, name, dimension
    and clipping are the wrapped mechanism's.
    """

    def __init__(self, mechanism: GroupSteppedSum):
        if not isinstance(mechanism, GroupSteppedSum):
            raise TypeError(f"stream groups need a group-stepped mechanism, got {type(mechanism).__name__}")
        self.inner = mechanism
        self.name, self.guarantee, self.dim = mechanism.name, mechanism.guarantee, mechanism.dim

    # -- the driver's mechanism interface -------------------------------------------------------
    def init_state(self, key: str) -> StreamGroupsState:
        return StreamGroupsState(key, 0, ())

    def encode_state(self, state: StreamGroupsState) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> StreamGroupsState:
        return decode_state(StreamGroupsState, data)

    def merge_blocks(self, items: list[GroupBlock]) -> GroupBlock:
        return GroupBlock.combine(items)

    @staticmethod
    def block_count(item: GroupBlock) -> int:
        return item.count

    def join(self, state: StreamGroupsState, streams: Iterable[str]) -> StreamGroupsState:
        """Add the streams not yet in the group as a cohort starting at the group's next step."""
        new = list(streams)
        for cohort in state.cohorts:  # one lookup per stream and cohort (the usual case: all known)
            if not new:
                break
            known = _positions(tuple(cohort["streams"]))
            new = [name for name in new if name not in known]
        new = sorted(set(new))
        if not new:
            return state
        cohorts = list(state.cohorts)
        if cohorts and cohorts[-1]["start"] == state.t:  # a cohort not stepped yet: rebuild it larger
            new = sorted(set(new) | set(cohorts.pop()["streams"]))
        fresh = self.inner.init_group(new)
        cohorts.append({"start": state.t, "streams": fresh.streams, "arrays": dict(fresh.arrays)})
        return dataclasses.replace(state, cohorts=tuple(cohorts))

    def step(self, state: StreamGroupsState, block: GroupBlock | None, noise: NoiseSource) -> tuple[StreamGroupsState, list[ReleaseBatch]]:
        """Step every cohort once; a block's streams not yet in the group join first."""
        if block is not None:
            state = self.join(state, block.streams)
        t = state.t + 1
        cohorts, batches = [], []
        for cohort in state.cohorts:
            group = GroupState(tuple(cohort["streams"]), t - 1 - cohort["start"], cohort["arrays"])
            sums, counts = self._rows_of(group.streams, block)
            new, batch = self.inner.step_group(group, sums, counts, noise)
            cohorts.append({"start": cohort["start"], "streams": new.streams, "arrays": dict(new.arrays)})
            batches.append(dataclasses.replace(batch, step=t))
        return StreamGroupsState(state.key, t, tuple(cohorts)), batches

    def _rows_of(self, streams: tuple[str, ...], block: GroupBlock | None) -> tuple[np.ndarray, np.ndarray]:
        """The block's sums and counts laid out in a cohort's stream order (zeros for streams without data)."""
        sums, counts = np.zeros((len(streams), self.dim)), np.zeros(len(streams), dtype=np.int64)
        if block is None or not block.streams:
            return sums, counts
        at = np.fromiter(map(_positions(streams).get, block.streams, itertools.repeat(-1)), np.int64,
                         len(block.streams))
        hit = at >= 0
        sums[at[hit]] = block.sums[hit]
        counts[at[hit]] = block.counts[hit]
        return sums, counts
