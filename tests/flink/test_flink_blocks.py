"""The entry point's block input (``--file-input blocks``, the default of a file replay) against its line
input (one Flink record per CSV line) on the same files: the same releases, the same dead letters.
Needs .venv-flink (real MiniCluster jobs); skipped in the main venv."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from beam_dp.steps.events import REASONS  # noqa: E402
from tests.flink.cases import assert_rows_equal, csv_lines, entry_args, expected_rows, good_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

#: bad or odd lines and the reason each gets (None: valid, read by the per-line path)
LINES = [("a,1010.5,nan,0.0", "non_finite"), ("a,1011.0,1.0", "wrong_shape"), ("a,1011.0,1.0,2.0,3.0", "wrong_shape"),
         ("zz,1012.0,0.1,0.1", "undeclared_stream"), ("b,1012.5,text", "bad_value"),
         ("a,not-a-time,1,2", "bad_timestamp"), ("a,900.0,1,1", "before_start"), ("a,2000.0,1,1", "after_end"),
         (",1001,1,1", "bad_stream_id"), ("a,1e300,1,1", "out_of_range"), ("b, 1003.5, 0.5,0.25", None)]


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _job(tmp_path: Path, name: str, *flags: str) -> tuple[list[dict], list[dict]]:
    from beam_dp.flink.run import main

    out = tmp_path / name
    assert main(entry_args(tmp_path / "in", out, "--checkpoint-ms", "500", *flags)) == 0

    def read(folder: Path) -> list[dict]:
        return [json.loads(line) for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.startswith(".")
                and f.name != "_beam_dp_manifest.json" for line in f.read_text().splitlines() if line]

    return read(out), read(Path(f"{out}.private"))


@pytest.mark.parametrize("groups", ["4", "0"])  # keyed by group of streams (the tree steps groups), by stream
def test_block_input_equals_line_input(tmp_path, groups):
    """Two files (one with \\r\\n line ends and blank lines), good events and every kind of bad line, at
    parallelism 2: both inputs release the pure replay's rows and dead-letter the same lines for the same
    reasons; the block input's dead letters carry the raw line."""
    events = good_events(40)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text(csv_lines(events[:20]) + "\n".join(line for line, _ in LINES) + "\n")
    (tmp_path / "in" / "b.csv").write_bytes(("\n" + csv_lines(events[20:])).replace("\n", "\r\n").encode())
    flags = ("--parallelism", "2", "--stream-groups", groups)
    blocks, blocks_dead = _job(tmp_path, "blocks", *flags)
    lines, lines_dead = _job(tmp_path, "lines", "--file-input", "lines", *flags)
    want = expected_rows(events + [("b", 1003.5, [0.5, 0.25])], "continual-sums")
    assert_rows_equal(blocks, want)
    assert_rows_equal(lines, want)
    reasons = sorted(reason for _, reason in LINES if reason)
    assert sorted(d["reason"] for d in blocks_dead) == sorted(d["reason"] for d in lines_dead) == reasons
    assert sorted(d["element"] for d in blocks_dead) == sorted(line for line, reason in LINES if reason)  # as written
    assert all(set(d) == {"stage", "reason", "detail", "stream", "source", "element"} and d["reason"] in REASONS
               for d in blocks_dead + lines_dead)
