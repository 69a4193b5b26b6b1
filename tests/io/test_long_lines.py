"""A CSV line longer than the reader's bound is one ``line_too_long`` dead letter (with its
``file#record=n``), never a failed job; the rows around it are read and numbered as if it were a row."""

from __future__ import annotations

import io
import json

import pytest

from beam_dp.io.tables import LONG_LINE_KEPT, MAX_LINE_BYTES, read_csv_rows
from beam_dp.steps.events import REASONS, Reason

LONG = 10_000_000  # bytes: beyond MAX_LINE_BYTES, and beyond twice Arrow's block (which failed the parse)


def test_the_bound_is_below_the_test_line():
    assert LONG > MAX_LINE_BYTES and Reason.LINE_TOO_LONG in REASONS


def test_a_long_line_is_rejected_with_its_record_and_the_rest_is_read():
    text = (b"stream_id,timestamp,value\r\na,1,0.5\r\nb,2," + b"9" * LONG + b"\r\nshort\r\n\r\nc,3,0.25\r\n"
            + b"d,4," + b"8" * LONG + b"\nd,5,1\n")
    read = read_csv_rows(io.BytesIO(text))
    assert [(r, reason) for r, reason, _, _ in read.rejected] == [
        (2, Reason.LINE_TOO_LONG), (3, Reason.MALFORMED), (5, Reason.LINE_TOO_LONG)]  # the blank line is no record
    kept = read.rejected[0][3]
    assert kept.startswith("b,2,999") and len(kept) == LONG_LINE_KEPT
    assert read.records.tolist() == [1, 4, 6]
    assert [r["stream_id"] for b in read.batches for r in b.to_pylist()] == ["a", "c", "d"]
    letters = read.letters("/in/e.csv")
    assert [x.source for x in letters] == ["/in/e.csv#record=2", "/in/e.csv#record=3", "/in/e.csv#record=5"]


def test_lines_up_to_the_bound_are_read_whatever_the_block(tmp_path):
    """A line between one and two blocks long (and one over the bound elsewhere in the file, which makes
    the reader cut and re-read): every line within the bound is parsed."""
    text = b"a,b\n1,2\n3," + b"x" * 2500 + b"\n4," + b"y" * 9000 + b"\n5,6\n"
    read = read_csv_rows(io.BytesIO(text), block_size=1000, max_line_bytes=4000)
    assert [(r, reason) for r, reason, _, _ in read.rejected] == [(3, Reason.LINE_TOO_LONG)]
    assert read.records.tolist() == [1, 2, 4]
    assert [len(str(r["b"])) for b in read.batches for r in b.to_pylist()] == [1, 2500, 1]


def _letters(out) -> list[dict]:
    private = out.with_name(out.name + ".private")
    return [json.loads(line) for f in private.glob("dead_letter-*") for line in f.read_text().splitlines() if line]


@pytest.mark.pipeline
def test_continual_stats_dead_letters_a_10_mb_line_and_publishes(tmp_path):
    from pipelines import continual_stats

    src = tmp_path / "e.csv"
    with open(src, "wb") as fh:
        fh.write(b"stream_id,timestamp,value\na,1,0.5\n")
        fh.write(b"a,2," + b"1" * LONG + b"\n")
        fh.write(b"a,3,abc\nb,4,0.25\n")
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={src}", f"--output={out}", "--start=0", "--period=10", "--end=20"]) == 0
    assert list(out.glob("sum-*")), "nothing published"
    got = sorted((d["reason"], d["source"]) for d in _letters(out))
    assert got == [("line_too_long", f"{src}#record=2"), ("malformed", f"{src}#record=3")]


@pytest.mark.pipeline
def test_model_release_dead_letters_a_10_mb_line_and_publishes(tmp_path):
    from pipelines import model_release

    rows = [f"s{i % 2},0.1,0.2,0.3,{'ab'[i % 2]}" for i in range(8)]
    src = tmp_path / "train.csv"
    with open(src, "wb") as fh:
        fh.write(("stream_id,x_0,x_1,x_2,label\n" + "\n".join(rows[:3]) + "\n").encode())
        fh.write(b"s1,0.1,0.2,0." + b"3" * LONG + b",a\n")
        fh.write(("\n".join(rows[3:]) + "\n").encode())
    out = tmp_path / "out"
    assert model_release.main([f"--input={src}", f"--output={out}", "--algorithm=continual", "--classes=a,b",
                               "--epsilon=1.0", "--clip-bound=2.0", "--update-size=2", "--base-size=4"]) == 0
    assert list(out.glob("models-*")), "nothing published"
    letters = _letters(out)
    assert [(d["stage"], d["reason"], d["source"]) for d in letters] == [("read", "line_too_long", f"{src}#record=4")]
    assert letters[0]["element"].startswith("s1,0.1,0.2,0.333")
