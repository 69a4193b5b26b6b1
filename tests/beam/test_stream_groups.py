"""ContinualSum / ContinualCount keyed by groups of streams (``stream_groups``) on Beam, batch replay:
the same releases as keyed by stream, declared streams, dead letters, the columnar sinks, and the
parameters it refuses. (The streaming rules keyed by groups: tests/beam/test_streaming_rules.py.)"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    Reason,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.core import StepClock
from beam_dp.io import ReleaseColumns, WriteReleasesToJsonLines, WriteReleasesToParquet, read_releases
from beam_dp.steps.events import EventBatch
from tests.beam.helpers import assert_that, expected_rows, reasons_are, rows_match, run_and_check

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(0.0, 10.0, end=80.0)


def _events(n=400, streams=9, seed=3):
    rng = np.random.default_rng(seed)
    ids = np.array([f"s{i}" for i in rng.integers(0, streams, n)], dtype=object)
    return ids, rng.uniform(0.0, 80.0, n), rng.normal(size=(n, 2)) * 0.8


def _batches(ids, ts, values, size=100):
    return [EventBatch(ids[i:i + size], ts[i:i + size], values[i:i + size]) for i in range(0, len(ids), size)]


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("pre_aggregate", [None, False], ids=["combined", "per-batch"])
def test_grouped_releases_equal_the_pure_mechanism_keyed_by_stream(groups, pre_aggregate):
    ids, ts, values = _events()
    bad = EventBatch(np.array(["s1", "s2"], dtype=object), np.array([5.0, 500.0]), np.array([[np.nan, 0], [1, 1]]))
    params = ContinualSumParams(dim=2, clock=CLOCK, noise="gaussian", delta=1e-6, stream_groups=groups,
                                streams=tuple(f"s{i}" for i in range(9)) + ("quiet",))
    want = expected_rows(dataclasses.replace(params, stream_groups=None), ids, ts, values, streams=params.streams)
    assert {r.stream for r in want} >= {"quiet"}

    def build(p):
        out = p | beam.Create(_batches(ids, ts, values) + [bad]) | ContinualSum(params, pre_aggregate=pre_aggregate)
        assert_that(out.releases, rows_match(want), label="releases")
        assert_that(out.dead_letter, reasons_are({Reason.NON_FINITE: 1, Reason.AFTER_END: 1}), label="dead")

    run_and_check(build)


def test_grouped_counts_need_raw_floats_and_match_the_stream_keyed_ones():
    with pytest.raises(ValueError, match="stream_groups needs a mechanism that steps groups"):
        ContinualCountParams(clock=CLOCK, stream_groups=8)  # granularity=1 snaps: per stream
    params = ContinualCountParams(clock=CLOCK, granularity=None, stream_groups=3)
    ids, ts, _ = _events(200)
    want = expected_rows(dataclasses.replace(params.as_sum_params(), stream_groups=None), ids, ts,
                         np.ones((len(ids), 1)), domain="ContinualCount/Sum")

    def build(p):
        out = p | beam.Create(list(zip(ids.tolist(), ts.tolist()))) | ContinualCount(params)
        assert_that(out.releases, rows_match(want), label="counts")

    run_and_check(build)


@pytest.mark.parametrize("sink, pattern", [(WriteReleasesToParquet, "*.parquet"), (WriteReleasesToJsonLines, "*.jsonl")])
def test_columnar_sinks_write_the_rows_a_stream_keyed_job_writes(tmp_path, sink, pattern):
    ids, ts, values = _events()
    params = ContinualSumParams(dim=2, clock=CLOCK)
    for name, groups in (("by_stream", None), ("by_group", 5)):
        with beam.Pipeline(runner="FnApiRunner") as p:
            out = p | beam.Create(_batches(ids, ts, values)) | ContinualSum(dataclasses.replace(params, stream_groups=groups))
            out.releases | sink(str(tmp_path / name), columnar=groups is not None)
    by_stream = read_releases(str(tmp_path / f"by_stream-{pattern}"))
    by_group = read_releases(str(tmp_path / f"by_group-{pattern}"))
    assert len(by_group) == 9 * CLOCK.last_step
    assert [(r["stream"], r["step"]) for r in by_group] == [(r["stream"], r["step"]) for r in by_stream]
    for a, b in zip(by_group, by_stream):
        np.testing.assert_allclose(a["value"], b["value"], rtol=1e-12, atol=1e-12)  # summation order only
        assert {k: v for k, v in a.items() if k != "value"} == {k: v for k, v in b.items() if k != "value"}


def test_grouped_releases_leave_as_release_columns():
    ids, ts, values = _events(50)
    params = ContinualSumParams(dim=2, clock=CLOCK, stream_groups=2)

    def build(p):
        out = p | beam.Create(_batches(ids, ts, values)) | ContinualSum(params)
        kinds = out.releases | beam.Map(lambda c: (type(c).__name__, c.labels is not None, len(c.batch) >= 1))
        assert_that(kinds | beam.Distinct(), lambda got: _equal(got, [(ReleaseColumns.__name__, True, True)]))

    run_and_check(build)


def _equal(got, want):
    assert sorted(got) == sorted(want), got


@pytest.mark.parametrize("change, message", [
    (dict(granularity=0.5), "stream_groups needs a mechanism that steps groups"),
    (dict(stream_groups=0), "stream_groups must be an integer"),
    (dict(stream_groups=2.5), "stream_groups must be an integer"),
    (dict(clock=None, block_size=10), "stream_groups needs event-time steps"),
    (dict(restore_states=(("a", b"x"),)), "stream_groups cannot restore"),
])
def test_stream_groups_refuses_what_it_cannot_key_by_group(change, message):
    with pytest.raises(ValueError, match=message):
        ContinualSumParams(**{"dim": 2, "clock": CLOCK, "stream_groups": 4, **change})


@pytest.mark.parametrize("make", [
    lambda groups: WindowedSumParams(dim=2, clock=CLOCK, window=4, stream_groups=groups),
    lambda groups: ContinualSumParams(dim=2, clock=CLOCK, counter="tree", stream_groups=groups),
    lambda groups: ContinualCountParams(clock=CLOCK, noise="discrete_laplace", stream_groups=groups).as_sum_params(),
], ids=["window-tree", "hybrid-tree", "discrete-laplace-count"])
def test_the_trees_and_the_window_tree_key_by_group_too(make):
    ids, ts, values = _events(300)
    params = make(3)
    dim = params.dim
    values = values[:, :dim] if dim == 2 else np.ones((len(ids), 1))
    want = expected_rows(make(None), ids, ts, values, domain="T")
    noise_key = dataclasses.replace(params.noise_key, domain="T")

    transform = WindowedSum if isinstance(params, WindowedSumParams) else ContinualSum

    def build(p):
        out = p | beam.Create(_batches(ids, ts, values)) | transform(dataclasses.replace(params, noise_key=noise_key))
        assert_that(out.releases, rows_match(want), label="releases")

    run_and_check(build)
