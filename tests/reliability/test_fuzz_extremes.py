"""Extreme-input fuzz (issue 18): the input classes that used to crash or get a misleading reason, through
every public transform, each with the reason it must be dead-lettered with:

* event times beyond ±1e12 s (ints far beyond int64, 1e20, ISO text of 1e20) -> ``out_of_range``
  (not ``before_start``/``after_end``, not an ``OverflowError``);
* stream ids that are not text (bytes, huge ints, floats) -> ``bad_stream_id``; ids that cannot be encoded
  (lone surrogates) arrive inside ``EventBatch`` blocks (Beam's coders refuse them between steps) ->
  ``bad_stream_id``, and the dead letter itself stays encodable;
* growing-database queries at sizes beyond 2**62 -> ``out_of_range``.

Releases must equal those of the good stream alone. Case counts are printed (``-s``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.steps.events import EventBatch, Reason
from tests.reliability.harness import run_pipeline, sorted_releases
from tests.reliability.targets import all_targets

FAR_TIMES = (10**30, 2**63, -(2**70), 10**13, 1e20, -1e300, 9.5e12, -2e12, np.float64(1e13), np.int64(2**62), "1e20",
             "-1e15")
BAD_IDS = (b"\xff\xfe", b"a", 2**64, 10**30, -1, 1.5, math.nan, math.inf, ("a",), frozenset())
HUGE_SIZES = (10**30, 2**63, 2**62 + 1, 2**64 - 1)
SURROGATES = ("\ud800", "a\udcff", "\udfff\ud800")

TARGETS = {t.name: t for t in all_targets()}
EVENT_TIME = {  # target -> element with timestamp ts (None: count steps)
    "ContinualSum": lambda ts: ("a", ts, [0.0, 0.0]),
    "ContinualSum(blt)": lambda ts: ("b", ts, [0.0, 0.0]),
    "WindowedSum": lambda ts: ("a", ts, [0.0, 0.0]),
    "ContinualCount": lambda ts: ("a", ts),
    "IncrementalRegression": lambda ts: ("a", ts, [0.0, 0.0], 0.5),
    "GrowingDatabaseQueries": lambda ts: ("E", ("a", ts, {"colour": "red", "size": 0.5})),
}
WITH_ID = {  # target -> element with stream id s
    **{name: (lambda make: lambda s: _with_id(make(1.0), s))(make) for name, make in EVENT_TIME.items()},
    "MultiResolutionRelease": lambda s: (s, [0.0, 0.0], "x"),
    "ContinualModelRelease": lambda s: (s, [0.0, 0.0], "x"),
    "SlidingWindowModelRelease": lambda s: (s, [0.0, 0.0], "x"),
    "OnlineLearner": lambda s: (s, [0.0, 0.0], 1.0),
    "LifelongLearner": lambda s: (s, "t1", [0.0] * 4, 1),
}
CASES: dict[str, int] = {}


def _with_id(element, stream):
    if element[0] == "E":
        return ("E", (stream,) + element[1][1:])
    return (stream,) + element[1:]


def _check(name: str, bad: list, reason: str) -> None:
    target = TARGETS[name]
    want = sorted_releases(run_pipeline(lambda p: target.build(p, list(target.good))).releases)
    out = run_pipeline(lambda p: target.build(p, list(target.good) + bad))
    assert len(out.dead) == len(bad), [d.reason for d in out.dead]
    assert {d.reason for d in out.dead} == {reason}, [(d.reason, d.detail) for d in out.dead]
    assert sorted_releases(out.releases) == want
    CASES[name] = CASES.get(name, 0) + len(bad)


@pytest.mark.parametrize("name", list(EVENT_TIME))
def test_times_beyond_the_range_are_out_of_range(name):
    if name == "LifelongLearner":
        pytest.importorskip("torch")
    _check(name, [EVENT_TIME[name](ts) for ts in FAR_TIMES], Reason.OUT_OF_RANGE)


@pytest.mark.parametrize("name", list(WITH_ID))
def test_stream_ids_that_are_not_text_are_bad_stream_ids(name):
    if name == "LifelongLearner":
        pytest.importorskip("torch")
    _check(name, [WITH_ID[name](s) for s in BAD_IDS], Reason.BAD_STREAM_ID)
    print(f"\nextreme-input cases {name}: {CASES[name]}")


def test_event_batches_with_unencodable_ids_or_far_times_are_dead_lettered():
    n = len(SURROGATES)
    unencodable = EventBatch(np.array(SURROGATES), np.full(n, 1.0), np.zeros((n, 2)))
    far = EventBatch(np.array(["a"] * len(FAR_TIMES[4:8])), np.array(FAR_TIMES[4:8], dtype=np.float64),
                     np.zeros((4, 2)))
    for name in ("ContinualSum", "WindowedSum"):
        target = TARGETS[name]
        out = run_pipeline(lambda p: target.build(p, list(target.good) + [unencodable, far]))
        reasons = sorted(d.reason for d in out.dead)
        assert reasons == sorted([Reason.BAD_STREAM_ID] * n + [Reason.OUT_OF_RANGE] * 4), reasons
        for letter in out.dead:  # the dead letters are encodable (written as UTF-8 JSON by the jobs)
            repr(letter).encode("utf-8")


def test_growing_database_queries_at_enormous_sizes_are_out_of_range():
    n_weights = 6
    # mappings, so that beam.Create does not infer an int64 coder for t (a source hands the int over as it is)
    _check("GrowingDatabaseQueries", [("Q", {"stream_id": "a", "query_id": f"big{i}", "t": t, "weights": [0.5] * n_weights})
                                      for i, t in enumerate(HUGE_SIZES)], Reason.OUT_OF_RANGE)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_event_files_with_non_utf8_stream_ids_dead_letter_those_rows(fmt, tmp_path):
    import apache_beam as beam
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_dp.io.sources import ReadEventFiles

    ids = [b"a", b"\xff\xfe", b"b", b"\xc3\x28", "é".encode()]
    path = tmp_path / f"events.{fmt}"
    if fmt == "csv":
        path.write_bytes(b"stream_id,timestamp,value\n" + b"".join(i + b",1.5,0.25\n" for i in ids))
    else:
        pq.write_table(pa.table({"stream_id": pa.array(ids, pa.binary()), "timestamp": [1.5] * 5, "value": [0.25] * 5}),
                       path)

    def build(p):
        batches, dead = p | ReadEventFiles(str(path))
        return {"releases": batches | beam.FlatMap(lambda b: list(b.stream_ids)), "dead": dead}

    out = run_pipeline(build)
    assert sorted(out.releases) == ["a", "b", "é"]
    assert [d.reason for d in out.dead] == [Reason.BAD_STREAM_ID] * 2
