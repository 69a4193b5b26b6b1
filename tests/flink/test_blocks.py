"""The Flink job's block input (beam_dp.flink.blocks): byte-range splits and the bulk parse against the
per-line path. Runs in either venv (no PyFlink)."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from beam_dp.core import StepClock
from beam_dp.flink.blocks import BlockParser, file_splits, parse_line, read_split
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.sums import BLTSum
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.steps.events import DeadLetter, parse_contribution

CLOCK = StepClock(start=1000.0, period=10.0, end=1100.0)

#: lines the bulk parse must leave to the per-line path, or reject with the per-line path's reason
ODD = ["a,1010.5,nan,0.0", "a,1011.0,1.0", "a,1011.0,1.0,2.0,3.0", "zz,1012.0,0.1,0.1", "b,1012.5,text",
       "a,not-a-time,1,2", "b,1001.0,x,y", "a,900.0,1,1", "a,1100.0,1,1", "a,2000.0,1,1", ",1001,1,1", "garbage",
       "b, 1003.5, 0.5,0.25", " a,1004,1,1\t", "a ,1004,1,1", "b,1005,1_0,2", "a,1006,inf,1", "a,1e999,1,1",
       "a,1e300,1,1", "b,1007,1e999,0", "a,1008,١٢,1", "\u00a0b,1009,1,1", "", "   ", "a,1009,+.5,-3.", "b,nan,1,1",
       "a,1010,1e-400,5", "a,1010,0x1,5", "a,1010,1,2,", "a,,1,2", "b,1090.0,3,4", "ü,1020,1,1"]


def _good(rng, n: int) -> list[str]:
    ids = rng.choice(["a", "b", "c", "ü"], n)
    ts = CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start)
    values = rng.normal(0, 1.5, (n, 2))
    formats = [repr, lambda x: f"{x:.5f}", lambda x: f"{x:.3e}", lambda x: str(int(x * 10))]
    return [f"{i},{formats[k % 4](t)},{formats[(k + 1) % 4](v[0])},{formats[(k + 2) % 4](v[1])}"
            for k, (i, t, v) in enumerate(zip(ids, ts.tolist(), values.tolist()))]


def _per_line(lines, mechanism, streams):
    """The reference: every non-blank line through the per-line path, summed per (stream, step)."""
    sums, letters = {}, []
    for line in lines:
        if not line.strip():
            continue
        parsed = parse_contribution(parse_line(line), mechanism, CLOCK, streams)
        if isinstance(parsed, DeadLetter):
            letters.append((parsed.reason, parsed.detail, parsed.stream, line))
            continue
        stream, step, block = parsed
        sums[stream, step] = sums[stream, step].merge(block) if (stream, step) in sums else block
    return sums, letters


def _from_records(records):
    sums = {}
    for first, seconds, payload in records:
        assert seconds == CLOCK.step_start_micros(payload.step) / 1e6
        block = payload.block
        if isinstance(block, ClippedSum):
            assert (first, payload.step) not in sums
            sums[first, payload.step] = block
            continue
        assert first == block.streams[0] and list(block.streams) == sorted(block.streams)
        for i, stream in enumerate(block.streams):
            assert (stream, payload.step) not in sums  # one record per key and step
            sums[stream, payload.step] = ClippedSum(block.sums[i], int(block.counts[i]), int(block.clipped[i]))
    return sums


@pytest.mark.parametrize("groups, declared", [(None, None), (3, ("a", "b", "c", "ü")), (1, None)])
@pytest.mark.parametrize("seed", range(3))
def test_the_bulk_parse_equals_the_per_line_path(groups, declared, seed):
    """Same (stream, step) sums (clipped by the same mechanism) and the same dead letters (reason, detail,
    stream, raw line) as each line through ``parse_line`` and ``parse_contribution``."""
    rng = np.random.default_rng(seed)
    lines = _good(rng, 400) + ODD
    lines = [lines[i] for i in rng.permutation(len(lines))]
    mechanism = (BLTSum(horizon=10, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian") if groups
                 else make_tree_sum(horizon=10, dim=2, epsilon=1.0, clip_bound=1.0))
    streams = frozenset(declared) if declared else None
    records, letters = BlockParser(mechanism, CLOCK, streams, groups).parse(lines)
    want_sums, want_letters = _per_line(lines, mechanism, streams)
    got_sums = _from_records(records)
    assert sorted(got_sums) == sorted(want_sums)
    for cell, want in want_sums.items():
        np.testing.assert_allclose(got_sums[cell].vector, want.vector, rtol=1e-12, atol=1e-12)  # summation order
        assert (got_sums[cell].count, got_sums[cell].clipped) == (want.count, want.clipped)
    assert (collections.Counter((d.reason, d.detail, d.stream, d.element) for d in letters)
            == collections.Counter(want_letters))
    assert {d.reason for d in letters} >= {"non_finite", "wrong_shape", "bad_value", "bad_timestamp",
                                           "before_start", "after_end", "bad_stream_id", "out_of_range"}


def test_only_blank_or_only_bad_lines():
    mechanism = make_tree_sum(horizon=10, dim=2, epsilon=1.0, clip_bound=1.0)
    parser = BlockParser(mechanism, CLOCK, None, None)
    assert parser.parse([]) == ([], [])
    assert parser.parse(["", "  "]) == ([], [])
    records, letters = parser.parse(["a,900,1,1", "a,1001,x,1"])
    assert records == [] and [d.reason for d in letters] == ["before_start", "bad_value"]


def test_splits_cover_every_line_once(tmp_path):
    """Whatever the split size, the splits' lines are the file's lines (ends \\n, \\r\\n or \\r; blank
    lines kept for the parser to skip; a last line without its end; multi-byte text), each once."""
    text = "a,1,2\r\nbb,3,4\n\nü€,5,6\rc,7,8\n\n\nd,9,10"
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "x.csv").write_bytes(text.encode())
    (folder / "sub" / "y.csv").write_bytes(b"e,1,1\n")
    (folder / ".hidden").write_bytes(b"secret\n")
    (folder / "_SUCCESS").write_bytes(b"")
    want = re.split(r"\r\n|\r|\n", text)
    for size in range(1, len(text.encode()) + 2):
        splits = file_splits(str(folder), size)
        assert {path for path, _, _ in splits} == {str(folder / "sub" / "y.csv"), str(folder / "x.csv")}
        got = [line for path, start, end in splits if path.endswith("x.csv") for line in read_split(path, start, end).to_pylist()]
        assert got == want, size
    assert file_splits(str(folder / "x.csv"), 10**6) == [(str(folder / "x.csv"), 0, len(text.encode()))]
    with pytest.raises(FileNotFoundError):
        file_splits(str(folder / "missing"))
