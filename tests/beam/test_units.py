"""Privacy units on Beam (batch replay): the unit factor, the bounding stage, the releases and dead letters."""

from __future__ import annotations

import itertools
import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_dp.beam import ContinualCount, ContinualCountParams, ContinualSum, ContinualSumParams, WindowedSumParams
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.core.units import UnitBounds, UnitLedger, bound_block, unit_hash
from beam_dp.mechanisms.sums.participation import Participation, unit_sensitivity
from beam_dp.mechanisms.sums.unit_level import best_unit_loss, unit_factor
from beam_dp.steps.events import Reason
from tests.beam.helpers import expected_rows, rows_match, run_and_check
from tests.conftest import TEST_KEY

CLOCK = StepClock(start=0.0, period=10.0, end=40.0)  # steps 1..4
GAUSS = dict(noise="gaussian", delta=1e-6)


# -- the unit factor ---------------------------------------------------------------------------------
def _allocations(k: int, capacity: int):
    """Every multiset of per-stream step counts 1..k with sum <= capacity."""
    def grow(left, low):
        yield ()
        for j in range(low, min(k, left) + 1):
            for rest in grow(left - j, j):
                yield (j,) + rest
    return grow(capacity, 1)


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_is_the_maximum_over_allocations(seed):
    rng = np.random.default_rng(seed)
    k, capacity = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    g = np.sort(rng.uniform(0.5, 4.0, k)) * np.arange(1, k + 1) ** rng.uniform(0.5, 2.0)
    brute = max(sum(g[j - 1] for j in alloc) for alloc in _allocations(k, capacity))
    got, exact = best_unit_loss(g, capacity)
    assert exact and got == pytest.approx(brute, rel=1e-12)


def _blt_columns(mechanism, horizon: int) -> np.ndarray:
    c = mechanism.blt.c_coeffs(horizon)
    return np.array([[c[t - s] if t >= s else 0.0 for s in range(horizon)] for t in range(horizon)])


def test_gaussian_factor_against_brute_force_over_unit_patterns():
    """BLT over 4 steps, m = 2 streams per step, k = 2 steps, b = 1: the worst unit pattern (every
    assignment of (step, streams) over 3 streams) moves the streams' counters by exactly G."""
    horizon, m, k, streams = 4, 2, 2, 3
    mechanism = ContinualSumParams(clock=CLOCK, **GAUSS).build_mechanism()
    columns = _blt_columns(mechanism, horizon)
    single = np.max(np.sum(columns**2, axis=0))
    subsets = [s for r in range(1, m + 1) for s in itertools.combinations(range(streams), r)]
    worst = 0.0
    for steps in itertools.combinations(range(horizon), k):
        for choice in itertools.product(subsets, repeat=k):
            per_stream = [np.zeros(horizon) for _ in range(streams)]
            for step, chosen in zip(steps, choice):
                for s in chosen:
                    per_stream[s][step] = 1.0
            worst = max(worst, sum(float(np.sum((columns @ x) ** 2)) for x in per_stream) / single)
    factor = unit_factor(mechanism, UnitBounds(m, 1, k))
    assert factor.exact and factor.loss == pytest.approx(worst, rel=1e-9)
    assert factor.factor == pytest.approx(np.sqrt(worst), rel=1e-9)


def test_pure_factor_is_pairs_and_group_privacy_bounds_it():
    mechanism = ContinualSumParams(clock=CLOCK).build_mechanism()  # the k-ary tree, pure
    for m, k in [(1, 1), (2, 3), (4, 5)]:
        assert unit_factor(mechanism, UnitBounds(m, 7, k)).factor == m * k
        assert all(unit_sensitivity(mechanism, Participation(j)).multiplier <= j for j in range(1, k + 1))


def test_one_step_one_stream_is_event_level():
    for params in (ContinualSumParams(clock=CLOCK), ContinualSumParams(clock=CLOCK, **GAUSS),
                   ContinualSumParams(clock=CLOCK, counter="tree", **GAUSS)):
        assert unit_factor(params.build_mechanism(), UnitBounds(1, 3, 1)).factor == 1.0
    # the window tree protects B >= W steps: one step per W-window is up to ceil(B/W) steps there
    window = WindowedSumParams(clock=CLOCK, window=3, **GAUSS).build_mechanism()
    assert unit_factor(window, UnitBounds(1, 3, 1, 1, window=3)).factor > 1.0
    window = WindowedSumParams(clock=CLOCK, window=4, **GAUSS).build_mechanism()
    assert unit_factor(window, UnitBounds(1, 3, 1, 1, window=4)).factor == pytest.approx(1.0)
    with pytest.raises(ValueError, match="window rule"):
        unit_factor(window, UnitBounds(1, 3, 1, 1, window=3))


def test_unbounded_or_mismatched_rules_are_refused():
    gaussian = ContinualSumParams(clock=CLOCK, **GAUSS)
    with pytest.raises(ValueError, match="at most 256 steps"):
        gaussian.with_privacy_unit(PrivacyUnit("user", 1, 1, 257))
    with pytest.raises(ValueError, match="window rule"):
        unit_factor(gaussian.build_mechanism(), UnitBounds(1, 1, 2, 1, window=4))
    with pytest.raises(ValueError, match="max_steps"):
        PrivacyUnit("user", 1, 1, 0)
    with pytest.raises(ValueError, match="block_size"):
        ContinualSumParams(block_size=2).with_privacy_unit(PrivacyUnit("user", 1, 1, 2))
    with pytest.raises(ValueError, match="discrete_laplace|gamma"):
        ContinualCount(ContinualCountParams(clock=CLOCK, noise="discrete_laplace"),
                       privacy_unit=PrivacyUnit("user", 1, 1, 2))
    with pytest.raises(TypeError):
        ContinualSum(gaussian, privacy_unit=UnitBounds(1, 1, 2))
    with pytest.raises(ValueError, match="saved states"):
        ContinualSumParams(clock=CLOCK, restore_states=(("a", b"state"),)).with_privacy_unit(PrivacyUnit("u", 1, 1, 2))


# -- params without a unit are as before -------------------------------------------------------------
def test_params_without_a_unit_keep_their_binding():
    # pinned in tests/mechanisms/sums/test_sum_spec.py: the binding of today's params
    params = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.5, block_size=1)
    assert calibration_binding(params) == "b1:925df33ba9afc6b923aa0e171958de38"
    assert not hasattr(params, "privacy_unit")
    clocked = ContinualSumParams(clock=CLOCK, **GAUSS)
    unit = clocked.with_privacy_unit(PrivacyUnit("user", 1, 1, 1))
    assert calibration_binding(unit) != calibration_binding(clocked)  # a unit-level run draws other noise
    assert unit.build_mechanism().noise_var(4) == pytest.approx(clocked.build_mechanism().noise_var(4))  # F = 1


def test_unit_level_noise_is_the_factor_times_event_level():
    params = ContinualSumParams(clock=CLOCK, **GAUSS)
    unit = params.with_privacy_unit(PrivacyUnit("user", 2, 3, 2))
    factor = unit.unit_factor.factor
    assert factor > 1
    for t in (1, 4):
        assert unit.build_mechanism().noise_var(t) == pytest.approx(factor**2 * params.build_mechanism().noise_var(t))


# -- the Beam stage ----------------------------------------------------------------------------------
def _events():
    """u1: many events (4 steps, 2 streams, several per step); u2: one; u3: steps 1 and 2."""
    events = []
    for step in range(4):
        for stream in ("a", "b"):
            events += [{"stream_id": stream, "timestamp": step * 10.0 + 1.0 + i, "value": 0.75, "user": "u1"}
                       for i in range(3)]
    events.append({"stream_id": "a", "timestamp": 5.0, "value": 0.5, "user": "u2"})
    events += [("b", 3.0, 0.25, "u3"), ("b", 12.0, -0.5, "u3")]
    return events


def _bounded(events, unit: PrivacyUnit, clip: float):
    """The kept (stream, step, sum) of every unit, by the pure bounding in core.units."""
    bounds = unit.bounds()
    by_unit: dict[str, list] = {}
    for e in events:
        stream, ts, value, user = (e["stream_id"], e["timestamp"], e["value"], e["user"]) if isinstance(e, dict) else e
        by_unit.setdefault(user, []).append((stream, CLOCK.step_of_micros(np.array([int(ts * 1e6)]))[0], value))
    kept = []
    for user, rows in by_unit.items():
        h = unit_hash(TEST_KEY, [user])[0]
        ledger = UnitLedger.empty(bounds)
        for step in sorted({int(s) for _, s, _ in rows}):
            mine = [(st, v) for st, s, v in rows if s == step]
            block = bound_block(ledger, step, np.full(len(mine), h, np.uint64), [st for st, _ in mine],
                                [v for _, v in mine], bounds, TEST_KEY, clip_bound=clip)
            ledger = block.ledger
            kept += [(str(s), step, float(v)) for s, v in zip(block.streams, block.sums)]
    return kept


def test_bounded_releases_equal_a_replay_of_the_bounded_contributions():
    unit = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=2, max_steps=2)
    params = ContinualSumParams(clock=CLOCK, clip_bound=1.0, **GAUSS)
    unit_params = params.with_privacy_unit(unit)
    events = _events()
    kept = _bounded(events, unit, 1.0)
    # u1 keeps 2 steps x 1 stream, its 2 contributions summed and clipped to 1; u2 and u3 all theirs
    u1 = [k for k in kept if abs(k[2]) == 1.0]
    assert len(u1) == 2 and len(kept) == 2 + 1 + 2
    stream_ids = [s for s, _, _ in kept]
    timestamps = [CLOCK.start + (step - 0.5) * CLOCK.period for _, step, _ in kept]
    expected = expected_rows(unit_params, stream_ids, timestamps, [v for _, _, v in kept], domain="ContinualSum")
    declaration = unit_params.unit_declaration()
    expected = [r._replace(meta=json.dumps({**json.loads(r.meta), **declaration}, sort_keys=True)) for r in expected]
    assert all(json.loads(r.meta)["privacy_unit"] == "user" and json.loads(r.meta)["max_steps"] == 2 for r in expected)

    def build(pipeline):
        out = pipeline | beam.Create(events) | ContinualSum(params, privacy_unit=unit)
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, lambda letters: _none(letters), label="dead")

    run_and_check(build)


def _none(letters):
    if list(letters):
        raise BeamAssertException(f"unexpected dead letters {letters}")


def test_bad_ids_are_dead_lettered_without_the_id():
    unit = PrivacyUnit("user", 1, 1, 2)
    params = ContinualSumParams(clock=CLOCK)
    huge = "x" * 2000
    events = [{"stream_id": "a", "timestamp": 1.0, "value": 1.0},  # missing
              {"stream_id": "a", "timestamp": 1.0, "value": 1.0, "user": ""},
              {"stream_id": "a", "timestamp": 1.0, "value": 1.0, "user": 7},
              {"stream_id": "a", "timestamp": 1.0, "value": 1.0, "user": huge},
              ("a", 1.0, float("nan"), "secret-user"),
              ("a", 2.0, 1.0, "ok")]

    hashed = f"{int(unit_hash(TEST_KEY, ['secret-user'])[0]):016x}"

    def check(letters):
        letters = list(letters)
        reasons = sorted(letter.reason for letter in letters)
        if reasons != sorted([Reason.BAD_UNIT_ID] * 4 + [Reason.NON_FINITE]):
            raise BeamAssertException(f"reasons {reasons}")
        ids = sorted(repr(e["user"] if isinstance(e, dict) else e[3]) for e in (letter.element for letter in letters))
        if ids != sorted(["None"] * 4 + [repr(hashed)]):  # the bad ids dropped, the good one as its keyed hash
            raise BeamAssertException(f"unit ids in dead letters: {ids}")

    def build(pipeline):
        out = pipeline | beam.Create(events) | ContinualSum(params, privacy_unit=unit)
        assert_that(out.dead_letter, check, label="dead")
        assert_that(out.releases | beam.Map(lambda r: (r.stream, r.step)),
                    lambda keys: None if sorted(keys) == [("a", s) for s in range(1, 5)] else (_ for _ in ()).throw(
                        BeamAssertException(f"keys {sorted(keys)}")), label="keys")

    run_and_check(build)


def test_count_with_units_counts_each_unit_once_per_step():
    unit = PrivacyUnit("user", 1, 5, 4)
    params = ContinualCountParams(clock=CLOCK, granularity=None, **GAUSS)
    events = [("a", 1.0 + i, None, "u1") for i in range(5)] + [("a", 2.0, None, "u2")]
    sum_params = params.as_sum_params().with_privacy_unit(unit)
    expected = expected_rows(sum_params, ["a", "a"], [5.0, 5.0], [1.0, 1.0], domain="ContinualCount/Sum")
    declaration = sum_params.unit_declaration()
    expected = [r._replace(meta=json.dumps({**json.loads(r.meta), **declaration}, sort_keys=True)) for r in expected]

    def build(pipeline):
        out = pipeline | beam.Create(events) | ContinualCount(params, privacy_unit=unit)
        assert_that(out.releases, rows_match(expected), label="releases")

    run_and_check(build)


def test_drops_are_counted_in_metrics_and_never_released():
    from apache_beam.metrics.metric import MetricsFilter

    from tests.beam.helpers import batch_options

    unit = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=1, max_steps=2, min_separation=2)
    events = [("a", 1.0, 1.0, "u"), ("a", 2.0, 1.0, "u"),  # step 1: two contributions, c = 1
              ("b", 3.0, 1.0, "u"),  # step 1: a second stream, m = 1
              ("a", 12.0, 1.0, "u"),  # step 2: too close (b = 2)
              ("a", 22.0, 1.0, "u"),  # step 3: kept (k = 2)
              ("a", 32.0, 1.0, "u")]  # step 4: over k
    pipeline = beam.Pipeline(options=batch_options())
    _ = pipeline | beam.Create(events) | ContinualSum(ContinualSumParams(clock=CLOCK), privacy_unit=unit)
    result = pipeline.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        MetricsFilter().with_namespace("beam_dp/units"))["counters"]}
    assert counters.get("kept") == 2
    assert counters.get("dropped_over_steps") == 1 and counters.get("dropped_too_close") == 1
    assert counters.get("dropped_over_streams", 0) + counters.get("dropped_over_contributions", 0) == 2


def test_windowed_sum_bounds_units_by_the_window_rule():
    unit = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=1, max_steps=1)
    params = WindowedSumParams(clock=CLOCK, window=2, **GAUSS)
    unit_params = params.with_privacy_unit(unit)
    assert unit_params.unit_bounds().window == 2 and unit_params.unit_factor.factor >= 1
    events = [("a", 10.0 * t + 1.0, 1.0, "u") for t in range(4)]  # one per step: one step per 2-step window
    kept = [("a", 1, 1.0), ("a", 3, 1.0)]
    expected = expected_rows(unit_params, [s for s, _, _ in kept], [CLOCK.start + (t - 0.5) * CLOCK.period
                                                                    for _, t, _ in kept],
                             [v for _, _, v in kept], domain="WindowedSum")
    declaration = unit_params.unit_declaration()
    expected = [r._replace(meta=json.dumps({**json.loads(r.meta), **declaration}, sort_keys=True)) for r in expected]

    def build(pipeline):
        from beam_dp.beam import WindowedSum

        out = pipeline | beam.Create(events) | WindowedSum(params, privacy_unit=unit)
        assert_that(out.releases, rows_match(expected), label="releases")

    run_and_check(build)


def test_a_unit_id_given_without_the_option_is_a_dead_letter():
    def build(pipeline):
        out = pipeline | beam.Create([("a", 1.0, 1.0, "u1")]) | ContinualSum(ContinualSumParams(clock=CLOCK))
        assert_that(out.dead_letter | beam.Map(lambda d: d.reason), lambda r: None if list(r) == ["malformed"] else (
            _ for _ in ()).throw(BeamAssertException(f"{list(r)}")), label="dead")

    run_and_check(build)
