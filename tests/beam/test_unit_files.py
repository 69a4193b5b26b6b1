"""Privacy units from files in column batches (beam_dp/beam/shell/units.py): the batches read the events
the rows read, and the vectorised, bucketed bounding keeps what the per-event bounding keeps."""

from __future__ import annotations

import csv
import json
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.beam.shell.combine import MergeClippedSums
from beam_dp.beam.shell.units import (
    UNIT_BATCH_ROWS,
    BoundUnits,
    ReadUnitEventFiles,
    UnitEventBatch,
    UnitEvents,
    UnitRows,
    _UnitEventFile,
)
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.core.units import UnitLedger, bound_block, unit_hash
from beam_dp.io import WriteReleasesToParquet, read_releases
from beam_dp.steps.events import DEAD_LETTER
from tests.beam.helpers import run_and_check
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=100.0)  # steps 1..10
UNIT = PrivacyUnit("user", max_streams_per_step=2, max_contributions_per_step=2, max_steps=3, min_separation=2)
GAUSS = dict(noise="gaussian", delta=1e-6)
BAD_ROWS = ["a,5.0,1.0,",  # no unit id
            "b,6.0,abc,u1",  # a value that is not a number
            "a,7.0,nan,u2",  # not finite
            "c,-5.0,1.0,u3",  # before the start
            "a,1970-01-01T00:00:15Z,0.5,u4",  # an ISO time: valid, read alone
            "a,8.0,1.0," + "x" * 1100,  # an id over 1,024 bytes
            ",9.0,1.0,u5"]  # no stream id


def _events(n: int, units: int, seed: int):
    rng = np.random.default_rng(seed)
    users = np.array([f"user-{i}" for i in range(units)])[rng.zipf(1.6, n) % units]  # heavy and light units
    streams = np.array(["a", "b", "c", "d"])[rng.integers(0, 4, n)]
    ts = rng.uniform(0.0, 100.0, n).round(3)
    return users, streams, ts, rng.normal(0.0, 1.0, n).round(6)


def _csv(path, users, streams, ts, values, extra=()):
    lines = ["stream_id,timestamp,value,user"] + [f"{s},{float(t)!r},{float(v)!r},{u}" for u, s, t, v in zip(users, streams, ts, values)]
    path.write_text("\n".join([*lines, *extra]) + "\n")


def _file_events(path, batch_rows):
    """What the file reader gives: (events, dead letters), batches expanded to their rows' events."""
    events, letters = [], []
    for item in _UnitEventFile("user", batch_rows).process(str(path)):
        if isinstance(item, beam.pvalue.TaggedOutput):
            letters.append(item.value)
        elif isinstance(item, UnitEventBatch):
            events += [item.event(i) for i in range(len(item))]
        else:
            events.append(item)
    return events, letters


def test_a_batch_holds_the_events_a_csv_reader_reads(tmp_path):
    users, streams, ts, values = _events(50, 7, 0)
    path = tmp_path / "e.csv"
    _csv(path, users, streams, ts, values, BAD_ROWS + ["a,1.0,2.0,u6,extra"])  # the last: a wrong column count
    events, letters = _file_events(path, UNIT_BATCH_ROWS)
    rows, row_letters = _file_events(path, None)
    with open(path, newline="") as fh:  # the reference: Python's csv module, numbers read where they are numbers
        want = []
        for row in list(csv.reader(fh))[1:-1]:
            stream, stamp, value, user = row

            def number(text):
                try:
                    return float(text)
                except ValueError:
                    return text

            want.append({"stream_id": stream, "timestamp": number(stamp), "value": number(value), "user": user})
    assert len(events) == len(want) == 50 + len(BAD_ROWS)

    def same(got, expected):
        return got.keys() == expected.keys() and all(
            got[k] == expected[k] or (isinstance(got[k], float) and math.isnan(got[k]) and math.isnan(expected[k]))
            for k in got)

    for got in (events, rows):  # batches and rows: the same events
        assert all(same(g, w) for g, w in zip(got, want)), [(g, w) for g, w in zip(got, want) if not same(g, w)][:3]
    assert letters == row_letters and [letter.reason for letter in letters] == ["malformed"]


def test_a_parquet_batch_reads_numbers_ids_and_times_as_the_rows(tmp_path):
    table = pa.table({"stream_id": ["a", "b", None, "a"], "timestamp": [1, 12, 25, None],
                      "value_0": [0.5, None, 1.0, 2.0], "value_1": [1.0, 2.0, 3.0, 4.0], "user": ["u", "", "v", "w"]})
    pq.write_table(table, tmp_path / "e.parquet")
    batch = next(b for b in _UnitEventFile("user", UNIT_BATCH_ROWS).process(str(tmp_path / "e.parquet")))
    assert isinstance(batch, UnitEventBatch) and sorted(batch.odd) == [1, 3]  # a missing value, a missing time
    assert [batch.event(i) for i in range(4)] == [
        {"stream_id": "a", "timestamp": 1, "user": "u", "value": [0.5, 1.0]},
        {"stream_id": "b", "timestamp": 12, "user": "", "value": [None, 2.0]},
        {"stream_id": None, "timestamp": 25, "user": "v", "value": [1.0, 3.0]},
        {"stream_id": "a", "timestamp": None, "user": "w", "value": [2.0, 4.0]}]
    assert batch.counted().event(1)["value"] == 1.0 and batch.counted().values.shape == (4, 1)


def _reference(users, streams, ts, values, params):
    """{(stream, step): kept sum} by the pure bounding of each unit alone (core.units.bound_block)."""
    clipped, _ = params.build_mechanism().clip_rows(np.asarray(values, float)[:, None])
    steps = CLOCK.step_of_micros(np.round(np.asarray(ts) * 1e6).astype(np.int64))
    bounds, sums = params.unit_bounds(), {}
    for user in sorted(set(users)):
        rows = np.flatnonzero(users == user)
        ledger, h = UnitLedger.empty(bounds), unit_hash(TEST_KEY, [user])[0]
        for step in sorted(set(steps[rows].tolist())):
            mine = rows[steps[rows] == step]
            block = bound_block(ledger, step, np.full(len(mine), h, np.uint64), streams[mine].tolist(), clipped[mine],
                                bounds, TEST_KEY, clip_bound=params.clip_bound)
            ledger = block.ledger
            for stream, value in zip(block.streams, block.sums):
                sums[(stream, step)] = sums.get((stream, step), 0.0) + float(value[0])
    return sums


def _blocks_equal(want):
    def check(blocks):
        got = {key: float(block.vector[0]) for key, block in blocks}
        if got.keys() != want.keys() or any(abs(got[k] - want[k]) > 1e-9 for k in want):
            raise BeamAssertException(f"kept sums differ: {sorted(got.items())[:5]} vs {sorted(want.items())[:5]}")
    return check


@pytest.mark.parametrize("buckets", [None, 1, 7])
def test_bucketed_batches_keep_what_each_unit_alone_keeps(buckets, tmp_path):
    """Events of 40 units (some with many events, so bounding drops), read from a file in batches (and one
    file as rows), keyed by unit hash or by buckets: the kept (stream, step) sums are the pure bounding's."""
    users, streams, ts, values = _events(3000, 40, 1)
    params = ContinualSumParams(clock=CLOCK, clip_bound=1.5, **GAUSS).with_privacy_unit(UNIT)
    want = _reference(users, streams, ts, values, params)
    half = len(users) // 2
    _csv(tmp_path / "a.csv", users[:half], streams[:half], ts[:half], values[:half])
    pq.write_table(pa.table({"stream_id": streams[half:], "timestamp": ts[half:], "value": values[half:],
                             "user": users[half:]}), tmp_path / "b.parquet")

    def build(pipeline):
        batches, _ = pipeline | "Batches" >> ReadUnitEventFiles(str(tmp_path / "b.parquet"), "user", batches=True)
        rows, _ = pipeline | "Rows" >> ReadUnitEventFiles(str(tmp_path / "a.csv"), "user")
        events = (batches, rows) | beam.Flatten()
        parsed = events | beam.ParDo(UnitEvents(params, buckets)).with_outputs(DEAD_LETTER, main="events")
        blocks = (parsed.events | beam.GroupByKey() | beam.ParDo(BoundUnits(params))
                  | beam.CombinePerKey(MergeClippedSums()))
        assert_that(blocks, _blocks_equal(want), label="kept")
        assert_that(parsed[DEAD_LETTER], lambda d: None if not list(d) else (_ for _ in ()).throw(
            BeamAssertException(f"dead letters {list(d)}")), label="dead")

    run_and_check(build)
    assert len(want) > 10 and sum(abs(v) for v in want.values()) > 0


def test_unit_rows_by_bucket_keep_every_row_once():
    rng = np.random.default_rng(2)
    hashes = rng.integers(0, 2**63, 500, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    rows = UnitRows.of(hashes, rng.integers(1, 5, 500), rng.choice(["x", "y", "z"], 500).astype(object),
                       rng.normal(size=(500, 2)))
    parts = dict(rows.by_bucket(16))
    assert set(parts) <= set(range(16)) and sum(map(len, parts.values())) == 500
    assert all((part.hashes % np.uint64(16) == bucket).all() for bucket, part in parts.items())
    back = UnitRows.concat(list(parts.values()))
    order, back_order = np.lexsort((rows.steps, rows.hashes)), np.lexsort((back.steps, back.hashes))
    assert (back.streams[back.codes][back_order] == rows.streams[rows.codes][order]).all()
    assert np.allclose(back.values[back_order], rows.values[order], rtol=0, atol=0)


def test_releases_from_batches_equal_the_releases_from_rows(tmp_path):
    users, streams, ts, values = _events(600, 12, 3)
    path = tmp_path / "e.csv"
    _csv(path, users, streams, ts, values, BAD_ROWS)
    params = ContinualSumParams(clock=CLOCK, clip_bound=1.0, **GAUSS)
    releases, dead = {}, {}
    for batches in (False, True):
        out_dir = tmp_path / f"out{batches}"

        def build(pipeline):
            events, _ = pipeline | ReadUnitEventFiles(str(path), "user", batches=batches)
            out = events | ContinualSum(params, label="Sum", privacy_unit=UNIT)
            out.releases | WriteReleasesToParquet(str(out_dir / "sum"))
            (out.dead_letter | beam.Map(lambda d: json.dumps([d.reason, d.detail, d.stream, repr(d.element)]))
             | beam.io.WriteToText(str(out_dir / "dead")))

        run_and_check(build)
        releases[batches] = read_releases(str(out_dir / "sum*"))
        dead[batches] = sorted(line for f in out_dir.glob("dead*") for line in f.read_text().splitlines())
    assert len(releases[True]) == len(releases[False]) == 4 * 10
    for got, want in zip(releases[True], releases[False]):
        assert (got["stream"], got["step"]) == (want["stream"], want["step"])
        assert np.allclose(got["value"], want["value"], rtol=1e-9, atol=1e-9)
        assert got["epsilon_spent"] == want["epsilon_spent"] and got["noise"] == want["noise"]
    assert dead[True] == dead[False] and len(dead[True]) == len(BAD_ROWS) - 1  # the ISO time is valid
    assert not any("u1" in line or "u2" in line or "xxx" in line for line in dead[True])  # no clear id
