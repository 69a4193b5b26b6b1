"""Issue 25.7 end to end: a job's dead letters name the stream, the source file and record, and hold
the rejected row as JSON values as read (no Python repr, no bytes)."""

from __future__ import annotations

import json

import pytest

from pipelines import continual_stats

pytestmark = pytest.mark.pipeline


def test_continual_stats_dead_letters_are_json_rows_with_stream_and_source(tmp_path):
    src = tmp_path / "e.csv"
    src.write_text("stream_id,timestamp,value\na,1,0.5\na,2,abc\nb,99,0.25\n")
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={src}", f"--output={out}", "--start=0", "--period=10", "--end=40"]) == 0
    lines = [json.loads(line) for path in sorted(tmp_path.rglob("dead_letter*.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    by_reason = {d["reason"]: d for d in lines}
    assert set(by_reason) == {"malformed", "after_end"}, lines
    bad = by_reason["malformed"]
    assert bad["stream"] == "a" and bad["source"] == f"{src}#record=2"
    assert bad["element"] == {"stream_id": "a", "timestamp": 2, "value": "abc"}  # as the CSV reader typed it
    late = by_reason["after_end"]
    assert late["stream"] == "b" and late["source"] == f"{src}#record=3"
    assert late["element"] == ["b", 99.0, [0.25]]
    for d in lines:
        assert json.loads(json.dumps(d)) == d
