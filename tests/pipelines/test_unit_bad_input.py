"""Bad input on the privacy-unit field, end to end: the ``ContinualSum``, ``ContinualCount`` and
``WindowedSum`` transforms and the ``continual_stats`` job.

A bad unit id (missing, empty, not a string, not UTF-8, over 1,024 bytes) is a ``bad_unit_id`` dead letter
whose public fields (reason, detail, stream, source) and element hold no clear id, nor do the logs, the
releases or the job's output; an id given without the option is event-level input; a misuse of the
option is a one-line usage error (exit code 2, no traceback).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.core.units import MAX_UNIT_ID_BYTES
from beam_dp.io import read_releases
from beam_dp.io.tables import MAX_LINE_BYTES
from beam_dp.steps.events import Reason
from pipelines import continual_stats
from tests.beam.helpers import expected_rows, rows_match, run_and_check
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=40.0)  # steps 1..4
UNIT = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=1, max_steps=4)
PROG = "python -m pipelines.continual_stats"
SECRET = "s3cr3t-unit"  # every clear id below contains it: it must never come out
# the fragment of a bad_unit_id's detail naming why (beam_dp.core.units.unit_id_problems)
NOT_A_STRING, EMPTY, TOO_LONG = "must be a string", "must not be empty", "at most 1024 bytes"


def _event(ts: float, **unit: object) -> dict:
    return {"stream_id": "a", "timestamp": ts, "value": 1.0, **unit}


def _bad_events() -> dict[float, tuple[Any, str]]:
    """Timestamp -> (an event with a bad unit id, the detail fragment it must get); one per case. (Text that
    is not UTF-8, a lone surrogate, cannot reach a transform: Beam's coders refuse it between any two
    stages; bytes stand for it here, the job's CSV test reads such an id from a file.)"""
    over = SECRET + "h" * (MAX_UNIT_ID_BYTES + 1 - len(SECRET))
    wide = SECRET + "é" * ((MAX_UNIT_ID_BYTES + 2 - len(SECRET)) // 2)  # fewer than 1,024 characters, more bytes
    assert len(over.encode()) == MAX_UNIT_ID_BYTES + 1 and len(wide.encode()) > MAX_UNIT_ID_BYTES > len(wide)
    cases: list[tuple[Any, str]] = [
        (_event(1.0), NOT_A_STRING),  # missing
        (_event(2.0, user=""), EMPTY),
        (_event(3.0, user=7), NOT_A_STRING),
        (_event(4.0, user=7.5), NOT_A_STRING),
        (_event(5.0, user=None), NOT_A_STRING),
        (_event(6.0, user=SECRET.encode()), NOT_A_STRING),
        (_event(7.0, user=[SECRET]), NOT_A_STRING),
        (_event(8.0, user=over), TOO_LONG),
        (_event(9.0, user=wide), TOO_LONG),
        (beam.Row(stream_id="a", timestamp=10.0, value=1.0), NOT_A_STRING),  # a row without the field
        (("a", 11.0, 1.0), NOT_A_STRING),  # a tuple without its 4th item
    ]
    return {_timestamp(element): (element, detail) for element, detail in cases}


def _good_events() -> list:
    """Ids at the bound (1,024 bytes, ASCII and two-byte characters) and ordinary ones: all kept."""
    return [_event(21.0, user="k" * MAX_UNIT_ID_BYTES), _event(22.0, user="é" * (MAX_UNIT_ID_BYTES // 2)),
            ("a", 23.0, 1.0, "ok")]


def _timestamp(element) -> float:
    if isinstance(element, dict):
        return element["timestamp"]
    return element[1] if isinstance(element, tuple) else element.timestamp


def _no_clear_id(letters, want: dict[float, str], column: str = "user"):
    """Every letter a ``bad_unit_id`` with the detail ``want`` says for its case, no stream or source, and
    neither the id nor any part of it in any field."""
    letters = list(letters)
    got = sorted(_timestamp(letter.element) for letter in letters)
    if got != sorted(want):
        raise BeamAssertException(f"dead letters for timestamps {got}, want {sorted(want)}")
    for letter in letters:
        fragment = want[_timestamp(letter.element)]
        if letter.reason != Reason.BAD_UNIT_ID or fragment not in letter.detail or column not in letter.detail:
            raise BeamAssertException(f"{letter.reason}: {letter.detail!r} (want {fragment!r})")
        if letter.stream is not None or letter.source is not None or SECRET in repr(letter):
            raise BeamAssertException(f"the clear id in a dead letter: {letter!r}"[:300])
        unit = letter.element.get(column) if isinstance(letter.element, dict) else None
        if unit is not None:
            raise BeamAssertException(f"a dead letter keeps the unit slot {unit!r}"[:300])


def _unit_rows(params, events, domain: str):
    """The releases of ``params`` (unit level) on the kept ``events`` (value 1.0 each), declaring the unit."""
    rows = expected_rows(params, [e["stream_id"] if isinstance(e, dict) else e[0] for e in events],
                         [_timestamp(e) for e in events], [1.0] * len(events), domain=domain)
    meta = params.unit_declaration()
    return [r._replace(meta=json.dumps({**json.loads(r.meta), **meta}, sort_keys=True)) for r in rows]


def test_bad_unit_ids_are_dead_letters_without_the_id(caplog, capsys):
    bad = _bad_events()
    want = {ts: detail for ts, (_, detail) in bad.items()}
    events = [element for element, _ in bad.values()] + _good_events()
    sums = ContinualSumParams(clock=CLOCK, noise="gaussian", delta=1e-6)
    windowed = WindowedSumParams(clock=CLOCK, window=2, noise="gaussian", delta=1e-6)
    counts = ContinualCountParams(clock=CLOCK, noise="gaussian", delta=1e-6)
    expected = {"sum": _unit_rows(sums.with_privacy_unit(UNIT), _good_events(), "sum"),
                "windowed": _unit_rows(windowed.with_privacy_unit(UNIT), _good_events(), "windowed"),
                "count": _unit_rows(counts.as_sum_params().with_privacy_unit(UNIT), _good_events(), "count/Sum")}

    def build(pipeline):
        given = pipeline | beam.Create(events, reshuffle=False)
        for name, transform in (("sum", ContinualSum(sums, privacy_unit=UNIT)),
                                ("windowed", WindowedSum(windowed, privacy_unit=UNIT)),
                                ("count", ContinualCount(counts, privacy_unit=UNIT))):
            out = given | name >> transform
            assert_that(out.dead_letter, lambda letters: _no_clear_id(letters, want), label=f"{name} dead letters")
            assert_that(out.releases, rows_match(expected[name]), label=f"{name} releases")

    with caplog.at_level(logging.INFO):
        run_and_check(build)
    said = caplog.text + "".join(capsys.readouterr())
    assert SECRET not in said and "h" * 64 not in said and "é" * 64 not in said


def test_an_id_without_the_option_is_a_malformed_event():
    """A 4-tuple to a transform without a unit: ``malformed``, its detail names no id (the element is the
    event as given: raw data of an event-level transform, which knows no unit)."""
    event = ("a", 1.0, 1.0, SECRET)

    def check(letters):
        letters = list(letters)
        if [letter.reason for letter in letters] != [Reason.MALFORMED] or SECRET in letters[0].detail:
            raise BeamAssertException(f"{letters}")
        if letters[0].stream is not None or letters[0].source is not None:
            raise BeamAssertException(f"{letters}")

    def build(pipeline):
        given = pipeline | beam.Create([event])
        for name, transform in (("sum", ContinualSum(ContinualSumParams(clock=CLOCK))),
                                ("windowed", WindowedSum(WindowedSumParams(clock=CLOCK, window=2))),
                                ("count", ContinualCount(ContinualCountParams(clock=CLOCK)))):
            assert_that((given | name >> transform).dead_letter, check, label=f"{name} dead letters")

    run_and_check(build)


@pytest.mark.parametrize("column", ["stream_id", "timestamp", "value"])
def test_an_event_field_is_no_unit_column(column):
    with pytest.raises(ValueError, match="unit"):
        PrivacyUnit(column, 1, 1, 2)


# -- the continual_stats job -------------------------------------------------------------------------
def _csv(path: Path, rows: list[bytes], header: bytes = b"stream_id,timestamp,value,user") -> Path:
    path.write_bytes(b"\n".join([header, *rows]) + b"\n")
    return path


def _good_rows(n: int = 12) -> list[bytes]:
    return [f"{'ab'[i % 2]},{1.0 + 3.0 * i},0.5,{SECRET}-{i % 4}".encode() for i in range(n)]


def _argv(path: Path, out: Path, *flags: str) -> list[str]:
    return [f"--input={path}", f"--output={out}", "--start=0", "--period=10", "--end=40", *flags]


def _leaks(out: Path, said: str) -> list[str]:
    """Where a clear id (any part of one) shows: files under ``out`` and its raw-data folder, or ``said``."""
    folders = [out, out.with_name(out.name + ".private")]
    found = [str(f) for folder in folders for f in folder.rglob("*") if f.is_file()
             and any(s in f.read_bytes() for s in (SECRET.encode(), b"h" * 64, "é".encode() * 64))]
    return found + ["the logs or the console"] * (SECRET in said)


UNITS = ("--privacy-unit-column=user", "--max-unit-steps=2")


def test_job_bad_ids_are_dead_letters_without_the_id(tmp_path, caplog, capsys):
    bad = [b"a,2.0,1.0,",  # missing (an empty cell)
           b'a,3.0,1.0,""',  # empty
           b"a,4.0,1.0," + SECRET.encode() + b"h" * MAX_UNIT_ID_BYTES,  # over 1,024 bytes
           b"a,5.0,1.0," + SECRET.encode() + "é".encode() * (MAX_UNIT_ID_BYTES // 2),  # over, in two-byte characters
           b"a,6.0,1.0," + SECRET.encode() + b"\xff\xfe"]  # not UTF-8
    value = [b"b,7.0,abc," + SECRET.encode()]  # a good id, a bad value: the id is its keyed hash
    path = _csv(tmp_path / "e.csv", _good_rows() + bad + value)
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        assert continual_stats.main(_argv(path, out, *UNITS, "--count", "--window=2")) == 0
    said = caplog.text + "".join(capsys.readouterr())
    assert "verified" in said and "problem" not in said.lower()
    assert dead_letters(out) == {"sum:bad_unit_id": 5, "sum:bad_value": 1, "windowed:bad_unit_id": 5,
                                 "windowed:bad_value": 1, "count:bad_unit_id": 5}
    assert not _leaks(out, said)
    assert all(r["step"] for r in read_releases(str(out / "sum-*")))


def test_job_non_string_ids_in_parquet_are_dead_letters(tmp_path, capsys):
    """Parquet keeps the unit column's type: a float, a null or a list is a bad id; a binary column is read as
    the CSV path reads ids (as UTF-8 text), a byte string that is not UTF-8 is a bad id."""
    columns = {"stream_id": ["a"] * 4, "timestamp": [1.0, 2.0, 3.0, 4.0], "value": [1.0] * 4}
    tables = {"float": [1.5, 2.5, None, 3.5], "list": [[SECRET], [SECRET], None, []],
              "binary": [SECRET.encode(), b"\xff" + SECRET.encode(), None, b""]}
    for name, ids in tables.items():
        pq.write_table(pa.table({**columns, "user": ids}), tmp_path / f"{name}.parquet")
        out = tmp_path / f"out-{name}"
        assert continual_stats.main(_argv(tmp_path / f"{name}.parquet", out, *UNITS)) == 0
        said = "".join(capsys.readouterr())
        assert dead_letters(out) == {"sum:bad_unit_id": 3 if name == "binary" else 4}, name
        assert not _leaks(out, said), name


def test_job_unreadable_lines_keep_no_clear_id(tmp_path, capsys):
    long = b"a,8.0,1.0," + SECRET.encode() + b"x" * MAX_LINE_BYTES
    path = _csv(tmp_path / "e.csv", _good_rows() + [b"a,2.0,1.0," + SECRET.encode() + b",extra", long])
    out = tmp_path / "out"
    assert continual_stats.main(_argv(path, out, *UNITS)) == 0
    assert dead_letters(out) == {"read:malformed": 1, "read:line_too_long": 1}
    assert not _leaks(out, "".join(capsys.readouterr()))


def test_job_counts_rejected_rows_among_all_it_read(tmp_path, capsys):
    path = _csv(tmp_path / "e.csv", _good_rows(9) + [b"a,2.0,1.0,"])
    assert continual_stats.main(_argv(path, tmp_path / "out", *UNITS, "--fail-on-rejected=0.5")) == 0
    assert "1 of 10 input rows were rejected" in capsys.readouterr().err


def test_job_unit_column_without_the_option_is_event_level(tmp_path, capsys):
    """The same rows with and without a unit column, no ``--privacy-unit-column``: the same releases and
    dead letters, no unit declared, no id in the releases, the manifest or what the job says."""
    rows = _good_rows() + [b"a,7.0,abc," + SECRET.encode()]
    with_ids = _csv(tmp_path / "ids.csv", rows)
    without = _csv(tmp_path / "plain.csv", [row.rsplit(b",", 1)[0] for row in rows], b"stream_id,timestamp,value")
    outs = {name: tmp_path / name for name in ("ids", "plain")}
    assert continual_stats.main(_argv(with_ids, outs["ids"])) == 0
    said = "".join(capsys.readouterr())
    assert continual_stats.main(_argv(without, outs["plain"])) == 0
    got, want = (read_releases(str(out / "sum-*")) for out in outs.values())
    assert [(r["stream"], r["step"], r["meta"]) for r in got] == [(r["stream"], r["step"], r["meta"]) for r in want]
    assert np.allclose([r["value"] for r in got], [r["value"] for r in want], rtol=1e-12, atol=0)
    assert dead_letters(outs["ids"]) == dead_letters(outs["plain"]) == {"read:malformed": 1}
    assert "privacy_unit" not in (outs["ids"] / "_beam_dp_manifest.json").read_text()
    assert SECRET not in said and not [f for f in outs["ids"].rglob("*") if f.is_file()
                                       and SECRET.encode() in f.read_bytes()]


@pytest.mark.parametrize("flags, fix", [
    (["--min-separation=2"], "--min-separation bound privacy units: give --privacy-unit-column"),
    (["--max-contributions-per-step=3"], "give --privacy-unit-column"),
    (["--max-unit-steps=2", "--min-separation=2", "--max-streams-per-step=2", "--max-contributions-per-step=2"],
     "--max-unit-steps, --min-separation, --max-streams-per-step, --max-contributions-per-step bound"),
    ([*UNITS[1:], "--privacy-unit-column=User"], "no column 'User'"),
    ([*UNITS[1:], "--privacy-unit-column="], "non-empty printable string"),
    ([*UNITS, "--min-separation=0"], "min_separation"),
])
def test_job_unit_flags_refused_in_one_line(flags, fix, tmp_path, capsys):
    path = _csv(tmp_path / "e.csv", _good_rows(4))
    assert_usage_error(continual_stats.main, PROG, _argv(path, tmp_path / "o", *flags), fix, capsys)


def test_job_unit_column_missing_from_a_file_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    _csv(folder / "a.csv", _good_rows(4))
    _csv(folder / "b.csv", [row.rsplit(b",", 1)[0] for row in _good_rows(4)], b"stream_id,timestamp,value")
    assert_usage_error(continual_stats.main, PROG, _argv(folder / "*.csv", tmp_path / "o", *UNITS), "lacks 'user'",
                       capsys)
    pq.write_table(pa.table({"stream_id": ["a"], "timestamp": [1.0], "value": [1.0]}), tmp_path / "p.parquet")
    assert_usage_error(continual_stats.main, PROG, _argv(tmp_path / "p.parquet", tmp_path / "o", *UNITS),
                       "no column 'user'", capsys)


@pytest.mark.parametrize("column", ["stream_id", "timestamp", "value"])
def test_job_event_field_as_unit_column_is_refused_in_one_line(column, tmp_path, capsys):
    path = _csv(tmp_path / "e.csv", _good_rows(4))
    assert_usage_error(continual_stats.main, PROG, _argv(path, tmp_path / "o", f"--privacy-unit-column={column}",
                                                         "--max-unit-steps=2"), column, capsys)


def test_job_value_column_as_unit_column_is_refused_in_one_line(tmp_path, capsys):
    rows = [f"a,{1.0 + i},0.5,0.25,{SECRET}".encode() for i in range(3)]
    path = _csv(tmp_path / "e.csv", rows, header=b"stream_id,timestamp,value_0,value_1,user")
    assert_usage_error(continual_stats.main, PROG, _argv(path, tmp_path / "o", "--privacy-unit-column=value_1",
                                                         "--max-unit-steps=2"), "value column", capsys)
