"""File replays as blocks: CSV event files read in byte-range splits, parsed and reduced in numpy to one
record per (key, step) before they reach Flink's keyed state (no PyFlink import: testable anywhere).

The per-line input crosses from the JVM to Python once per CSV line and again at the keyed function;
here a split (a file and a byte range, :func:`file_splits`) crosses once, and leaves as one record per
(stream group, step) (or per (stream, step) when the job keys by stream): a :class:`StepBlock` of the
mechanism's clipped sums (``clip_and_sum_groups``, the same clipping and merge rules as the Beam batch
path, which sums its Parquet blocks with the same :mod:`beam_dp.steps.batch`).

**The same lines, the same reasons.** A split owns the lines that start in its byte range; lines end at
``\\n``, ``\\r\\n`` or ``\\r`` (as Flink's text-line format reads them) and blank lines are skipped. A
line of the plain form ``stream,number,...`` with exactly ``dim`` values (numbers as ``[+-]digits[.digits]
[e±digits]``, the stream not starting with whitespace) is parsed in bulk by Arrow (the same doubles as
Python's ``float``) and validated by :func:`beam_dp.steps.batch.row_reasons`; every other line (wrong
width, text, ``nan``, spaces, ...) goes through the per-line path of the job
(:func:`beam_dp.flink.run.parse_line` and :func:`beam_dp.steps.events.parse_contribution`), so a
rejected line gets exactly the reason it gets there. A dead letter's element is the raw line.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of
from beam_dp.steps.batch import ROW_REASONS, key_step_parts, row_reasons, step_sums
from beam_dp.steps.events import DETAIL, DeadLetter, parse_contribution

__all__ = ["MAX_PARALLELISM", "MIN_SPLIT_BYTES", "SPLIT_BYTES", "BlockParser", "StepBlock", "file_splits",
           "group_keys", "key_group", "parse_line", "read_split", "subtask_of"]

#: bytes of input per split: what one parse holds in memory at a time (a few times this), and how many
#: records a key and step gets (one per split touching it: each costs the keyed function a state merge)
SPLIT_BYTES = 64 << 20
#: the smallest split :func:`file_splits` cuts to spread a file over the parse subtasks
MIN_SPLIT_BYTES = 1 << 20


def parse_line(line: str) -> tuple:
    """A CSV line -> ``(stream_id, seconds, value)``; what does not parse stays text (dead-lettered on the worker)."""
    parts = line.strip().split(",")
    stream = parts[0] if parts else ""
    try:
        seconds = float(parts[1])
    except (IndexError, ValueError):
        seconds = float("nan")
    try:
        value = [float(x) for x in parts[2:]] or line
    except ValueError:
        value = line
    return stream, seconds, value


@dataclass(frozen=True)
class StepBlock:
    """The payload of a block record: the clipped sums (``GroupBlock`` or ``ClippedSum``) of one key at ``step``."""

    step: int
    block: GroupBlock | ClippedSum


def file_splits(path: str, split_bytes: int = SPLIT_BYTES, parallelism: int = 1) -> list[tuple[str, int, int]]:
    """``(file, start, end)`` byte ranges covering the files of ``path`` (a file or a directory, walked
    recursively; names starting with ``.`` or ``_`` are skipped, as Flink's FileSource skips them), in
    name order: at most ``split_bytes`` each, and at most ``1/parallelism`` of all the bytes (not below
    :data:`MIN_SPLIT_BYTES`), so that one file gives every parse subtask a split. A path that does not
    exist raises ``FileNotFoundError``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--input {path} does not exist")
    if os.path.isfile(path):
        files = [path]
    else:
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            files += [os.path.join(folder, n) for n in sorted(names) if not n.startswith((".", "_"))]
    sizes = [os.path.getsize(name) for name in files]
    share = -(-sum(sizes) // max(parallelism, 1))
    split_bytes = min(split_bytes, max(share, MIN_SPLIT_BYTES))
    return [(name, start, min(start + split_bytes, size)) for name, size in zip(files, sizes)
            for start in range(0, size, split_bytes)]


def read_split(path: str, start: int, end: int) -> pa.Array:
    """The lines that start in bytes ``[start, end)`` of ``path`` (an Arrow string array: UTF-8, bad bytes
    replaced), without their line ends; a line that starts in the range is read to its end."""
    with open(path, "rb") as fh:
        fh.seek(max(start - 1, 0))
        data = fh.read(end - start + (start > 0))
        if start > 0:  # the line running into the range belongs to the split before
            cut = data.find(b"\n")
            data = b"" if cut < 0 else data[cut + 1:]
        if data and not data.endswith(b"\n"):
            data += fh.readline()  # the last line, to its end
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    try:
        text = pa.array([data], type=pa.binary()).cast(pa.string())  # validates UTF-8 without a Python str
    except pa.ArrowInvalid:
        text = pa.array([data.decode("utf-8", "replace")], type=pa.string())
    lines = pc.list_flatten(pc.split_pattern(text, "\n"))
    return lines.slice(0, len(lines) - 1) if not data or data.endswith(b"\n") else lines


_NUMBER = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"


@functools.cache
def _space() -> str:
    """What ``str.strip`` strips, as RE2 escapes (built on first use, not at import: a scan of every code point)."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(0x110000)) if c.isspace())


def _numpy(array: "pa.Array") -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False))


class BlockParser:
    """Lines of CSV events -> block records and dead letters, for ``mechanism`` on ``clock``.

    ``streams``: the declared streams (others are dead-lettered) or None; ``groups``: the job's stream
    groups (a record per (group, step)) or None (a record per (stream, step))."""

    def __init__(self, mechanism: Any, clock: Any, streams: frozenset[str] | None, groups: int | None):
        self._mechanism, self._clock, self._streams, self._groups = mechanism, clock, streams, groups
        self._plain = f"^[^,{_space()}][^,]*(,{_NUMBER}){{{mechanism.dim + 1}}}$"
        self._group_of: dict[str, int] = {}  # stream -> its group (hashed once per stream and worker)

    def parse(self, lines: "pa.Array | list[str]") -> tuple[list[tuple[str, float, StepBlock]], list[DeadLetter]]:
        """``(records, dead letters)`` of ``lines`` (Arrow strings or a list): each record ``(a stream of
        the block, its step's start in seconds, StepBlock)``, keyed downstream by that stream's key; each
        dead letter with its raw line."""
        lines = lines if isinstance(lines, pa.Array) else pa.array(lines, type=pa.string())
        plain = _numpy(pc.match_substring_regex(lines, self._plain))
        at = np.flatnonzero(plain)
        streams, seconds, values = self._columns(lines if len(at) == len(lines) else lines.take(pa.array(at)))
        letters: list[DeadLetter] = []
        if len(streams):
            codes, _, _ = row_reasons(streams, np.round(seconds * 1e6), values, self._clock, self._streams)
            for i in np.flatnonzero(codes):  # rejected rows only (a plain line's stream id is valid)
                reason = ROW_REASONS[codes[i]]
                letters.append(DeadLetter(reason, DETAIL[reason], streams[int(i)].as_py(), lines[int(at[i])].as_py()))
            ok = codes == 0
            streams, seconds, values = streams.filter(pa.array(ok)), seconds[ok], values[ok]
        rest = [self._one(line, letters) for line in lines.filter(pa.array(~plain)).to_pylist() if line.strip()]
        rest = [event for event in rest if event is not None]
        if rest:  # lines the bulk parse left to the per-line path, valid there
            streams = pa.concat_arrays([streams, pa.array([e[0] for e in rest], type=pa.string())])
            seconds = np.concatenate([seconds, [e[1] for e in rest]])
            values = np.concatenate([values, np.array([e[2] for e in rest], dtype=np.float64)])
        return (list(self._records(streams, seconds, values)) if len(streams) else []), letters

    def _columns(self, text: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """The plain lines' ``(streams (n,) Arrow strings, seconds (n,), values (n, dim))``."""
        width = self._mechanism.dim + 2
        tokens = pc.list_flatten(pc.split_pattern(text, ","))
        first = np.zeros(len(tokens), dtype=bool)
        first[::width] = True
        numbers = _numpy(pc.cast(tokens.filter(pa.array(~first)), pa.float64())).reshape(len(text), width - 1)
        return tokens.filter(pa.array(first)), numbers[:, 0].copy(), numbers[:, 1:]

    def _one(self, line: str, letters: list[DeadLetter]) -> tuple | None:
        """A line through the per-line path: ``(stream, seconds, value)`` when valid, else its dead letter."""
        event = parse_line(line)
        parsed = parse_contribution(event, self._mechanism, self._clock, self._streams)
        if isinstance(parsed, DeadLetter):
            letters.append(parsed._replace(element=line))
            return None
        return parsed[0], event[1], event[2]

    def _records(self, streams: pa.Array, seconds: np.ndarray, values: np.ndarray) -> Iterator[tuple]:
        sums = step_sums(self._mechanism, self._clock, None, streams, np.round(seconds * 1e6), values)
        names = sums.names.tolist()
        if self._groups is None:
            for i, name in enumerate(names[s] for s in sums.stream.tolist()):
                step = int(sums.step[i])
                yield name, self._seconds(step), StepBlock(step, ClippedSum(sums.sums[i], int(sums.counts[i]),
                                                                            int(sums.clipped[i])))
            return
        group = np.array([self._group(name) for name in names], dtype=np.int64)
        for part in key_step_parts(group[sums.stream], sums.step):
            step = int(sums.step[part[0]])
            block = GroupBlock(tuple(names[s] for s in sums.stream[part].tolist()), sums.sums[part],
                               sums.counts[part].astype(np.int64), sums.clipped[part].astype(np.int64))
            yield block.streams[0], self._seconds(step), StepBlock(step, block)

    def _group(self, stream: str) -> int:
        group = self._group_of.get(stream)
        if group is None:
            group = self._group_of[stream] = group_of(stream, self._groups)
        return group

    def _seconds(self, step: int) -> float:
        return self._clock.step_start_micros(step) / 1e6


#: key groups of a release operator: Flink's default max parallelism for a job run at parallelism <= 85
MAX_PARALLELISM = 128
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _murmur(code: int) -> int:
    """Flink's ``MathUtils.murmurHash`` of a 32-bit int (as unsigned bits): a non-negative int."""
    code = _rotl(code * 0xCC9E2D51 & _MASK, 15) * 0x1B873593 & _MASK
    code = ((_rotl(code, 13) * 5 + 0xE6546B64) & _MASK) ^ 4
    code = (code ^ (code >> 16)) * 0x85EBCA6B & _MASK
    code = (code ^ (code >> 13)) * 0xC2B2AE35 & _MASK
    code ^= code >> 16
    signed = code - (1 << 32) if code >> 31 else code
    return abs(signed) if signed != -(1 << 31) else 0


def key_group(key: str, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The Flink key group of a string key of PyFlink's ``key_by(..., key_type=Types.STRING())``, which
    keys by a one-field ``Row``: Flink hashes that Row as the string's Java ``hashCode`` + 62."""
    units = key.encode("utf-16-be")
    code = 0
    for i in range(0, len(units), 2):  # Java's String.hashCode over UTF-16 code units
        code = (31 * code + (units[i] << 8 | units[i + 1])) & _MASK
    return _murmur((code + 62) & _MASK) % max_parallelism


def subtask_of(key: str, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The subtask of an operator at ``parallelism`` that holds ``key`` (Flink's key-group ranges)."""
    return key_group(key, max_parallelism) * parallelism // max_parallelism


@functools.cache
def group_keys(groups: int, max_parallelism: int = MAX_PARALLELISM) -> tuple[str, ...]:
    """The Flink key of each of ``groups`` stream groups: ``group_key(g)``, salted ``group_key(g)/n``
    (the smallest such n) unless its key group already is the middle one of group g's share of the
    key groups. At any parallelism the groups then spread over the subtasks as evenly as key-group
    ranges allow (4 groups at parallelism 4: one a subtask; at 2: two), where the bare keys hash
    4 groups onto 3 subtasks. A key does not depend on the parallelism: a rescaled job keys each group
    as before. The salt only places a group: the key its driver state, dead letters and a Beam
    restore know is ``group_key(g)``, the Flink key up to its first ``/``."""
    keys = []
    for group in range(groups):
        target, key, salt = (2 * group + 1) * max_parallelism // (2 * groups), group_key(group), 0
        while key_group(key, max_parallelism) != target:
            key, salt = f"{group_key(group)}/{salt}", salt + 1
        keys.append(key)
    return tuple(keys)
