"""Pipeline tests of ContinualSum / WindowedSum / ContinualCount on the FnApiRunner (batch)."""

from __future__ import annotations

import math
import pickle

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualSum,
    ContinualSumParams,
    EventBatch,
    NoiseKey,
    Reason,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.io import release_to_row
from tests.beam.helpers import batch_options, domain_noise, expected_rows, labelled, reasons_are, rows_match
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=1000.0, period=10.0, end=1000.0 + 10 * 37)  # 37 steps: crosses powers of two


def _events(n=600, dim=3, streams=("a", "b", "c"), seed=1, empty_steps=(5, 6, 7)):
    rng = np.random.default_rng(seed)
    ids = rng.choice(list(streams), size=n)
    ts = CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start)
    ts = ts[~np.isin(CLOCK.step_of(ts), empty_steps)]
    ids = ids[: len(ts)]
    values = rng.normal(0, 1.2, size=(len(ts), dim))  # some exceed R = 2 and get clipped
    return ids, ts, values


def _tuples(ids, ts, values):
    return [(str(i), float(t), v.tolist()) for i, t, v in zip(ids, ts, values)]


@pytest.mark.parametrize("unbounded", ["hybrid", "doubling"])
def test_continual_sum_batch_equals_pure_mechanism(unbounded):
    ids, ts, values = _events()
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK, unbounded=unbounded, counter="tree")
    expected = expected_rows(params, ids, ts, values)
    assert len(expected) == 3 * 37
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(_tuples(ids, ts, values)) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, equal_to([]), label="no dead letters")


def test_known_horizon_gaussian_and_event_batches_equal_pure_mechanism():
    ids, ts, values = _events(seed=2)
    params = ContinualSumParams(dim=3, epsilon=2.0, delta=1e-6, clip_bound=2.0, noise="gaussian",
                                calibration="analytic", clock=CLOCK, horizon=64)
    expected = expected_rows(params, ids, ts, values)
    halves = [EventBatch(ids[:300], ts[:300], values[:300]), EventBatch(ids[300:], ts[300:], values[300:])]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(halves) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected))
    assert all(r.mechanism == "blt" and r.delta_spent == 1e-6 for r in expected)  # counter="auto", Gaussian
    assert max(r.epsilon_spent for r in expected) <= 2.0


def test_windowed_sum_batch_equals_pure_window_tree():
    ids, ts, values = _events(seed=3)
    params = WindowedSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK, window=5)
    expected = expected_rows(params, ids, ts, values)
    assert {r.window for r in expected} == {8}
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(_tuples(ids, ts, values)) | WindowedSum(params)
        assert_that(out.releases, rows_match(expected))


def test_bad_input_goes_to_dead_letter_and_does_not_touch_state():
    ids, ts, values = _events(n=200, seed=4)
    good = _tuples(ids, ts, values)
    bad = [
        ("a", 1005.0, [float("nan"), 0.0, 0.0]),          # non-finite
        ("a", 1005.0, [1.0, float("inf"), 0.0]),          # non-finite
        ("a", 1005.0, [1.0, 2.0]),                        # wrong shape
        ("a", 1005.0, "1,2,3"),                           # text
        ("a", 1005.0, [True, False, True]),               # bool dtype
        ("a", 1005.0, [[1.0, 2.0, 3.0]]),                 # wrong shape (2-d)
        ("b", 999.0, [1.0, 1.0, 1.0]),                    # before start
        ("b", CLOCK.end, [1.0, 1.0, 1.0]),                # at end (exclusive)
        ("", 1005.0, [1.0, 1.0, 1.0]),                    # empty stream id
        (None, 1005.0, [1.0, 1.0, 1.0]),                  # missing stream id
        ("c", "yesterday", [1.0, 1.0, 1.0]),              # bad timestamp
        ("c", float("nan"), [1.0, 1.0, 1.0]),             # bad timestamp
        ("c", [1.0, 1.0, 1.0]),                           # missing timestamp
        42,                                               # malformed
        {"stream_id": "a", "timestamp": 1005.0},          # missing value
    ]
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    expected = expected_rows(params, ids, ts, values)
    want_reasons = {Reason.NON_FINITE: 2, Reason.WRONG_SHAPE: 2, Reason.BAD_VALUE: 2, Reason.BAD_DTYPE: 1,
                    Reason.BEFORE_START: 1, Reason.AFTER_END: 1, Reason.BAD_STREAM_ID: 2,
                    Reason.BAD_TIMESTAMP: 2, Reason.MALFORMED: 2}
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(good + bad) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected), label="releases unchanged by bad input")
        assert_that(out.dead_letter, reasons_are(want_reasons), label="reasons")
        assert_that(out.dead_letter, _details_without_values, label="details carry no values")


def _details_without_values(letters):
    for letter in letters:
        if any(token in letter.detail.lower() for token in ("nan", "inf", "true", "1,2,3", "yesterday", "999")):
            raise BeamAssertException(f"a raw value leaked into a dead-letter detail: {letter.detail!r}")


def test_event_batch_bad_rows_dead_lettered_with_reason():
    ids, ts, values = _events(n=100, seed=5)
    ids = ids.astype(object)
    values = values.copy()
    values[3, 1] = np.nan
    ts = ts.copy()
    ts[4] = 10.0
    ids[5] = ""
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    keep = np.ones(len(ids), bool)
    keep[[3, 4, 5]] = False
    expected = expected_rows(params, ids[keep], ts[keep], values[keep])
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([EventBatch(ids, ts, values)]) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, reasons_are({Reason.NON_FINITE: 1, Reason.BEFORE_START: 1,
                                                  Reason.BAD_STREAM_ID: 1}), label="reasons")


def test_declared_streams_release_every_step_and_undeclared_are_dead_lettered():
    ids, ts, values = _events(n=200, streams=("a", "b"), seed=6)
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK, streams=("a", "quiet"))
    keep = ids == "a"
    expected = expected_rows(params, ids[keep], ts[keep], values[keep], streams=("a", "quiet"))
    assert {r.stream for r in expected} == {"a", "quiet"} and len(expected) == 2 * 37
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(_tuples(ids, ts, values)) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, reasons_are({Reason.UNDECLARED_STREAM: int((ids == "b").sum())}), label="dl")


def test_continual_count_counts_events():
    ids, ts, _ = _events(n=300, seed=7)
    params = ContinualCountParams(epsilon=1.0, clock=CLOCK)
    sum_params = params.as_sum_params()
    expected = expected_rows(sum_params, ids, ts, np.ones((len(ids), 1)), domain="ContinualCount/Sum")
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([(str(i), float(t)) for i, t in zip(ids, ts)]) | ContinualCount(params)
        assert_that(out.releases, rows_match(expected))


def test_count_steps_release_one_step_per_full_block():
    """25 equal contributions, blocks of 10: exactly two releases, equal to the pure mechanism fed two
    blocks of 10 (equal values, so Beam's arrival order within the key cannot matter)."""
    value = np.array([0.3, -0.4])
    params = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, block_size=10)
    mechanism = params.build_mechanism()
    state, expected = mechanism.init_state("s"), []
    for _ in range(2):
        state, releases = mechanism.step(state, np.tile(value, (10, 1)), domain_noise(params))
        expected += labelled([release_to_row(r, mechanism.guarantee) for r in releases], params)
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([("s", value.tolist())] * 25) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected), label="two full blocks")


def test_metrics_count_elements_clipped_dead_letters_and_releases():
    events = [("a", 1001.0, [3.0]), ("a", 1002.0, [0.5]), ("a", 1003.0, [float("nan")])]
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK)
    pipeline = beam.Pipeline(options=batch_options())
    _ = pipeline | beam.Create(events) | ContinualSum(params)
    result = pipeline.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]
                if c.key.metric.namespace == "beam_dp/kary_tree"}  # counter="auto", pure epsilon
    # a batch replay releases each key in one call after a GroupByKey: no timer fires, nothing is buffered in state
    assert counters == {"elements": 2, "clipped": 1, "dead_letters": 1, "releases": 37}
    gauges = {g.key.metric.name: g.committed.value for g in result.metrics().query()["gauges"]
              if g.key.metric.namespace == "beam_dp/kary_tree"}
    assert gauges["last_closed_step"] == 37


def test_noise_key_never_appears_in_logs(caplog, tmp_path):
    import logging

    caplog.set_level(logging.DEBUG)
    ids, ts, values = _events(n=50, seed=10)
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    with beam.Pipeline(options=batch_options()) as p:
        _ = p | beam.Create(_tuples(ids, ts, values)) | ContinualSum(params)
    text = caplog.text
    assert caplog.records and TEST_KEY.hex() not in text and repr(TEST_KEY) not in text


def test_invalid_parameters_raise_at_construction():
    with pytest.raises(ValueError):
        ContinualSumParams(dim=2, epsilon=0.0, clip_bound=1.0, clock=CLOCK)
    with pytest.raises(ValueError):
        ContinualSumParams(dim=2, epsilon=1.0, delta=1.5, noise="gaussian", clip_bound=1.0, clock=CLOCK)
    with pytest.raises(ValueError):
        WindowedSumParams(dim=2, epsilon=1.0, clip_bound=1.0, clock=CLOCK, window=0)
    with pytest.raises(ValueError):
        ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, clock=CLOCK, horizon=0)
    with pytest.raises(ValueError):  # the paper's sigma_tree_004 fails the exact check at eps=20, L=1
        ContinualSumParams(dim=1, epsilon=20.0, delta=1e-5, noise="gaussian", clip_bound=0.5, horizon=1,
                           block_size=1, counter="tree", calibration="paper")
    with pytest.raises(ValueError):
        ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0)  # no step schedule
    with pytest.raises(ValueError):
        ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, clock=CLOCK, horizon=10)  # clock longer than horizon
    with pytest.raises(ValueError, match="public end"):
        with beam.Pipeline(options=batch_options()) as p:
            _ = p | beam.Create([("a", 1.0, [0.0])]) | ContinualSum(
                ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=StepClock(0.0, 1.0)))


def test_secret_key_is_never_in_the_pipeline_graph(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(b"\xa7" * 40)  # raw bytes (text would have to be hex)
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK,
                                noise_key=NoiseKey(key_file=str(key_file), domain="job/ContinualSum"))
    blob = pickle.dumps(ContinualReleaseDoFn(params, per_step_timers=False))
    assert b"\xa7" * 40 not in blob and TEST_KEY.hex().encode() not in blob and TEST_KEY not in blob
    dofn = ContinualReleaseDoFn(params, per_step_timers=False)
    dofn.setup()
    with pytest.raises(TypeError):
        pickle.dumps(dofn._driver.policy.noise)


def test_same_key_same_releases_and_other_key_other_noise(monkeypatch):
    ids, ts, values = _events(n=100, seed=9)
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    rows = {}
    for name, key in (("first", TEST_KEY), ("again", TEST_KEY), ("other", bytes(range(1, 33)))):
        monkeypatch.setenv("BEAM_DP_NOISE_KEY", key.hex())
        from tests.beam import collect
        rows[name] = collect.run(lambda p: (p | beam.Create(_tuples(ids, ts, values)) | ContinualSum(params)).releases)
    same = all(a.value == b.value for a, b in zip(rows["first"], rows["again"]))
    assert same and len(rows["first"]) == 3 * 37
    assert all(not math.isclose(a.value[0], b.value[0]) for a, b in zip(rows["first"], rows["other"]))


def test_a_stream_ends_cleanly_at_its_horizon():
    """A known-horizon tree refuses step 4: with count steps (no public end to check at construction) the
    stream ends with one `stream_ended` dead letter (element None); every later element is dead-lettered
    `stream_ended` with the element kept; earlier releases are unaffected."""
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, block_size=1, horizon=3, counter="tree")
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create([("s", 0.5)] * 7) | ContinualSum(params)
        assert_that(out.releases | beam.Map(lambda r: r.step), equal_to([1, 2, 3]), label="three releases")
        assert_that(out.dead_letter | beam.Map(lambda d: (d.reason, d.element is None)),
                    equal_to([(Reason.STREAM_ENDED, True)] + [(Reason.STREAM_ENDED, False)] * 3), label="ended")
        assert_that(out.dead_letter | beam.Filter(lambda d: d.element is not None) | beam.Map(lambda d: d.element),
                    equal_to([("s", 0.5)] * 3), label="later elements kept")


def test_snapshot_restored_into_a_fresh_pipeline_continues_like_an_uninterrupted_run():
    """Run the pure mechanism over the first 20 steps, snapshot its state (encode_state), restore it
    into a fresh pipeline fed only the later events: releases 21..37 equal the uninterrupted run's,
    and an event for an already-snapshotted step is dead-lettered as late."""
    ids, ts, values = _events(seed=12)
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK)
    full = sorted(expected_rows(params, ids, ts, values), key=lambda r: (r.stream, r.step))
    mechanism = params.build_mechanism()
    snapshots = {}
    for stream in ("a", "b", "c"):
        keep = ids == stream
        state = mechanism.init_state(stream)
        steps = CLOCK.step_of(ts[keep])
        for step in range(1, 21):
            block = values[keep][steps == step]
            state, _ = mechanism.step(state, block if len(block) else None, domain_noise(params))
        snapshots[stream] = mechanism.encode_state(state)
    later = CLOCK.step_of(ts) > 20
    restored = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK,
                                  restore_states=tuple(snapshots.items()))
    events = _tuples(ids[later], ts[later], values[later]) + [("a", 1005.0, [0.1, 0.1, 0.1])]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(events) | ContinualSum(restored)
        assert_that(out.releases, rows_match([r for r in full if r.step > 20]), label="continued releases")
        assert_that(out.dead_letter, reasons_are({Reason.LATE: 1}), label="late")


def test_granularity_snaps_releases_to_the_grid_with_the_adjusted_mechanism():
    """``granularity=0.3`` → grid 0.5; the pipeline equals the pure SnappedSum (calibrated for
    R' = R + √d·g), every value lies on the grid and the spend is the wrapped mechanism's."""
    ids, ts, values = _events(n=100, seed=13)
    params = ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK, granularity=0.3)
    mechanism = params.build_mechanism()
    assert mechanism.granularity == 0.5 and mechanism.inner.clip_bound == pytest.approx(2.0 + 3**0.5 * 0.5)
    expected = expected_rows(params, ids, ts, values)
    assert all(np.array_equal(np.asarray(r.value) / 0.5, np.round(np.asarray(r.value) / 0.5)) for r in expected)
    assert all(r.epsilon_spent <= 1.0 for r in expected)
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(_tuples(ids, ts, values)) | ContinualSum(params)
        assert_that(out.releases, rows_match(expected))
    with pytest.raises(ValueError):
        ContinualSumParams(dim=3, epsilon=1.0, clip_bound=2.0, clock=CLOCK, granularity=0.0)
