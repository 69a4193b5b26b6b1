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
from beam_dp.mechanisms.stream_groups import GroupBlock, group_of
from beam_dp.steps.batch import ROW_REASONS, key_step_parts, row_reasons, step_sums
from beam_dp.steps.events import DETAIL, DeadLetter, parse_contribution

__all__ = ["SPLIT_BYTES", "BlockParser", "StepBlock", "file_splits", "parse_line", "read_split"]

#: bytes of input per split: what one parse holds in memory at a time (a few times this), and how many
#: records a key and step gets (one per split touching it: each costs the keyed function a state merge)
SPLIT_BYTES = 64 << 20


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


def file_splits(path: str, split_bytes: int = SPLIT_BYTES) -> list[tuple[str, int, int]]:
    """``(file, start, end)`` byte ranges of at most ``split_bytes`` covering the files of ``path`` (a file or
    a directory, walked recursively; names starting with ``.`` or ``_`` are skipped, as Flink's FileSource
    skips them), in name order. A path that does not exist raises ``FileNotFoundError``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--input {path} does not exist")
    if os.path.isfile(path):
        files = [path]
    else:
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            files += [os.path.join(folder, n) for n in sorted(names) if not n.startswith((".", "_"))]
    return [(name, start, min(start + split_bytes, size)) for name in files
            for size in [os.path.getsize(name)] for start in range(0, size, split_bytes)]


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
