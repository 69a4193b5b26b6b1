"""Privacy units on a stream: the engine-neutral unit steps (``beam_dp.core.unit_steps``) keep the batch
replay's contributions in any arrival order; on Beam streaming (TestStream, BundleBasedDirectRunner) the
unit stage (``beam_dp.beam.shell.units_streaming``) gives the batch replay's releases on the same events,
dead-letters late contributions without the clear id, releases nothing behind the watermark, and a unit's
state carried to a fresh worker keeps its bounding (an exhausted unit stays exhausted); the
``continual_stats`` job reads the unit field of each streaming message."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import BeamAssertException, assert_that
from apache_beam.transforms.window import FixedWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSum, ContinualSumParams, WindowedSum, WindowedSumParams
from beam_dp.beam.shell.units_streaming import UnitStepsDoFn
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.core.unit_steps import Contribution, UnitState, UnitSteps
from beam_dp.core.units import DROP_REASONS, UnitBounds, UnitKeys, UnitLedger, bound_block, unit_hash
from beam_dp.steps.events import Reason
from tests.beam import collect
from tests.beam.fake_state import Cell, Timer
from tests.beam.helpers import rows_match, streaming_options
from tests.conftest import TEST_KEY

CLOCK = StepClock(start=0.0, period=10.0, end=80.0)  # steps 1..8
GAUSS = dict(noise="gaussian", delta=1e-6)
UNIT = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=2, max_steps=3, min_separation=2)


# -- the engine-neutral unit steps against the batch bounding ---------------------------------------
def _batch(bounds: UnitBounds, keys: UnitKeys, events: list) -> tuple[dict, dict]:
    """Per (stream, step) the units' kept sums and the drops per reason: the batch replay's bounding
    (each unit's steps in order, ``bound_block`` over all units of a step with one ledger)."""
    sums: dict = {}
    drops = dict.fromkeys(DROP_REASONS, 0)
    ledger = UnitLedger.empty(bounds)
    for step in sorted({e[1] for e in events}):
        mine = [e for e in events if e[1] == step]
        block = bound_block(ledger, step, np.array([e[0] for e in mine], np.uint64), [e[2] for e in mine],
                            np.array([e[3] for e in mine]), bounds, keys, clip_bound=1.0)
        ledger = block.ledger
        for reason, n in block.drops.items():
            drops[reason] += n
        for stream, value in zip(block.streams, block.sums):
            sums[(str(stream), step)] = sums.get((str(stream), step), 0.0) + value
    return sums, drops


@pytest.mark.parametrize("seed", range(10))
def test_unit_steps_keep_the_batch_contributions_in_any_arrival_order(seed):
    """Random bounds and events of 4 units; each event arrives while up to 2 earlier steps are still open,
    in random order, with the state encoded and decoded between calls (a restore at every element) and
    timer folds at random: the deltas add up to the batch replay's kept sums (within 1e-12: only the
    order of the float additions differs) and the drops per reason are the batch replay's exactly."""
    rng = np.random.default_rng(seed)
    window = None if seed % 2 else 3
    bounds = UnitBounds(int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4)),
                        int(rng.integers(1, 3)), window)
    keys = UnitKeys(TEST_KEY)
    units = unit_hash(keys, [f"u{i}" for i in range(4)])
    events = [(units[int(rng.integers(0, 4))], int(rng.integers(1, 9)), str(rng.choice(["a", "b", "c"])),
               rng.normal(0.3, 0.6, 2)) for _ in range(80)]
    want, want_drops = _batch(bounds, keys, events)
    assert sum(want_drops.values()) > 0 and want  # the bounds bite and something is kept
    steps = UnitSteps(bounds, keys, 1.0, CLOCK)
    arrival = [max(1, step - int(rng.integers(0, 3))) for _, step, _, _ in events]  # the first open step then
    order = np.lexsort((rng.random(len(events)), arrival))
    state: dict = {}
    got: dict = {}
    drops = dict.fromkeys(DROP_REASONS, 0)

    def count(folded):
        for reason, n in folded.drops.items():
            drops[reason] += n

    for i in order.tolist():
        unit, step, stream, value = events[i]
        data = state.get(unit)
        added = steps.add(steps.state(data), unit, Contribution(step, stream, value), arrival[i])
        assert not added.late
        count(added.folded)
        for delta in added.deltas:
            got[(delta.stream, delta.step)] = got.get((delta.stream, delta.step), 0.0) + delta.value
        state[unit] = added.state.encode()
        if rng.random() < 0.3:  # a timer fold of what the watermark closed
            folded, counts = steps.closed(steps.state(state[unit]), unit, arrival[i])
            count(counts)
            state[unit] = folded.encode()
    for unit, data in state.items():  # the end: every step closed
        folded, counts = steps.closed(steps.state(data), unit, 9)
        count(counts)
        assert not folded.rows and not folded.emitted and not folded.pruned  # only the ledger row is left
    assert drops == want_drops
    got = {k: v for k, v in got.items() if np.any(np.abs(v) > 1e-12)}  # a sum emitted, then withdrawn
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=1e-12)


def test_late_contributions_are_refused_and_the_state_round_trips():
    bounds = UnitBounds(1, 1, 2, 2)
    steps = UnitSteps(bounds, UnitKeys(TEST_KEY), 1.0, CLOCK)
    unit = unit_hash(TEST_KEY, ["ann"])[0]
    added = steps.add(steps.state(None), unit, Contribution(3, "a", np.array([0.5])), 3)
    assert not added.late and [(d.stream, d.step) for d in added.deltas] == [("a", 3)]
    assert steps.add(added.state, unit, Contribution(2, "a", np.array([0.5])), 3).late  # before the first open step
    folded, _ = steps.closed(added.state, unit, 4)
    assert folded.row.step == 3 and steps.add(folded, unit, Contribution(3, "b", np.array([0.5])), 3).late
    for state in (added.state, folded):
        again = UnitState.decode(state.encode(), bounds)
        assert again.encode() == state.encode() and again.row == state.row
    assert b"ann" not in added.state.encode()
    with pytest.raises(ValueError, match="kept under"):
        UnitState.decode(added.state.encode(), UnitBounds(1, 1, 3, 2))
    with pytest.raises(ValueError, match="not a version-1"):
        UnitState.decode(added.state.encode()[:20], bounds)


# -- Beam streaming --------------------------------------------------------------------------------
def _events(seed: int = 5, n: int = 60) -> list[dict]:
    """Events of 5 users over 8 steps and 3 streams (each stream has data in step 1), many over the bounds."""
    rng = np.random.default_rng(seed)
    events = [{"stream_id": s, "timestamp": 1.0 + i, "value": 0.5, "user": "u0"} for i, s in enumerate("abc")]
    for _ in range(n):
        events.append({"stream_id": str(rng.choice(["a", "b", "c"])), "timestamp": float(rng.uniform(0, 80)),
                       "value": float(rng.normal(0.4, 0.8)), "user": f"u{int(rng.integers(0, 5))}"})
    return events


def _stream(events: list[dict], late: list[dict] = (), jumps: bool = True) -> TestStream:
    """The events step by step, each step's in a shuffled order, the watermark moved after each step's
    (with ``jumps`` two steps at a time from step 5: one move closes several of a unit's steps), then
    ``late`` ones, then the end."""
    ts = TestStream()
    by_step: dict[int, list] = {}
    for e in events:
        by_step.setdefault(int(CLOCK.step_of(e["timestamp"])), []).append(e)
    for step in sorted(by_step):
        ts = ts.add_elements([TimestampedValue(e, e["timestamp"]) for e in by_step[step]])
        if not jumps or step < 5 or step % 2 == 0:
            ts = ts.advance_watermark_to(CLOCK.start + step * CLOCK.period)
    if late:
        ts = ts.add_elements([TimestampedValue(e, e["timestamp"]) for e in late])
    return ts.advance_watermark_to(CLOCK.end + 1).advance_watermark_to_infinity()


def _batch_rows(events, params, transform) -> list:
    return collect.run(lambda p: (p | beam.Create(events) | transform(params, privacy_unit=UNIT,
                                                                      label="Units")).releases)


def _no_letters(letters):
    if list(letters):
        raise BeamAssertException(f"unexpected dead letters {list(letters)}")


@pytest.mark.slow
@pytest.mark.pipeline
@pytest.mark.parametrize("kind", ["sum", "windowed"])
def test_streaming_releases_equal_the_batch_replay(kind):
    if kind == "sum":
        params, transform = ContinualSumParams(clock=CLOCK, clip_bound=1.0, **GAUSS), ContinualSum
    else:
        params, transform = WindowedSumParams(clock=CLOCK, clip_bound=1.0, window=4, **GAUSS), WindowedSum
    events = _events()
    expected = _batch_rows(events, params, transform)
    event_level = collect.run(lambda p: (p | beam.Create([{k: v for k, v in e.items() if k != "user"} for e in events])
                                         | transform(params, label="Units")).releases)
    assert len(expected) == 3 * 8 and all(json.loads(r.meta)["privacy_unit"] == "user" for r in expected)
    assert any(abs(a.value[0] - b.value[0]) > 1e-6 for a, b in zip(expected, event_level))  # the bounds bite
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | _stream(events) | transform(params, privacy_unit=UNIT, label="Units")
        assert_that(out.releases, rows_match(expected), label="releases")
        assert_that(out.dead_letter, _no_letters, label="dead")


SEEN: dict[str, list] = {}


def _dead(letter) -> None:  # module functions are pickled by reference: they fill this module's SEEN
    SEEN.setdefault("dead", []).append(letter)


def _on_time(keyed) -> None:
    SEEN.setdefault("on_time", []).extend(keyed[1])


@pytest.mark.slow
@pytest.mark.pipeline
def test_late_contributions_are_dead_lettered_and_nothing_is_released_behind_the_watermark():
    """One-step watermark moves (the DirectRunner's timers hold no watermark: the release stage's own
    catching-up releases after a jump would be behind it). Late: u1 to step 2 after step 4 closed, a
    brand-new unit to step 3. Releases equal the batch replay of the on-time events; every release of a
    finite watermark passes a GroupByKey in fixed windows whose last instant is its release time (the
    runner drops a release the watermark had passed); the late letters hold the unit's hash, not its id."""
    SEEN.clear()
    params = ContinualSumParams(clock=CLOCK, clip_bound=1.0, **GAUSS)
    events = _events(seed=7, n=40)
    late = [{"stream_id": "a", "timestamp": 15.0, "value": 0.5, "user": "u1"},
            {"stream_id": "b", "timestamp": 25.0, "value": 0.5, "user": "new-secret-user"}]
    expected = _batch_rows(events, params, ContinualSum)
    stream = TestStream()
    for step in range(1, 9):
        stream = stream.add_elements([TimestampedValue(e, e["timestamp"]) for e in events
                                      if CLOCK.step_of(e["timestamp"]) == step])
        if step == 5:
            stream = stream.add_elements([TimestampedValue(e, e["timestamp"]) for e in late])
        stream = stream.advance_watermark_to(CLOCK.start + step * CLOCK.period)
    stream = stream.advance_watermark_to_infinity()
    last_instant = Timestamp(micros=CLOCK.start_micros % CLOCK.period_micros + 1)  # a window ends at a release time
    with beam.Pipeline(options=streaming_options()) as p:
        out = p | stream | ContinualSum(params, privacy_unit=UNIT, label="Units")
        assert_that(out.releases, rows_match(expected), label="releases")
        out.dead_letter | "Dead" >> beam.Map(_dead)
        (out.releases | "Keys" >> beam.Map(lambda r: (0, (r.stream, r.step)))
         | "Windows" >> beam.WindowInto(FixedWindows(CLOCK.period, last_instant))
         | "OnTime" >> beam.GroupByKey() | "Seen" >> beam.Map(_on_time))
    dead = SEEN["dead"]
    assert sorted((d.reason, d.stream, d.element["step"]) for d in dead) == [(Reason.LATE, "a", 2), (Reason.LATE, "b", 3)]
    hashes = {f"{int(unit_hash(TEST_KEY, [u])[0]):016x}" for u in ("u1", "new-secret-user")}
    assert {d.element["user"] for d in dead} == hashes and "new-secret-user" not in repr(dead)
    assert sorted(SEEN["on_time"]) == sorted((r.stream, r.step) for r in expected)  # all 24: none behind


# -- state carried to a fresh worker ---------------------------------------------------------------
def _worker(params) -> UnitStepsDoFn:
    fn = UnitStepsDoFn(params)
    fn.setup()  # a fresh worker: nothing in memory but what setup builds
    return fn


def test_a_unit_exhausted_before_a_restore_stays_exhausted_after():
    """k = 2 (forever rule): a unit takes steps 1 and 3 on one worker; its keyed state moves to a fresh
    worker (a restore, a rescale); there its step-5 contribution keeps nothing and is counted over_steps
    when the step closes, while a fresh unit's is kept."""
    params = ContinualSumParams(clock=CLOCK, clip_bound=1.0, **GAUSS).with_privacy_unit(PrivacyUnit("user", 1, 1, 2))
    ann, bob = (int(unit_hash(TEST_KEY, [u]).view(np.int64)[0]) for u in ("ann", "bob"))

    def stamp(step):  # what the watermark gate stamps while ``step`` is the first open step
        return Timestamp(micros=CLOCK.step_end_micros(step))

    def run(fn, unit, cell, step, timer=None):
        return list(fn.process((unit, ("a", step, np.array([0.5]))), stamp(step), cell, timer or Timer()))

    cell = Cell()
    first = _worker(params)
    assert [k for k, _ in run(first, ann, cell, 1)] == [("a", 1)]
    assert [k for k, _ in run(first, ann, cell, 3)] == [("a", 3)]
    timer = Timer()
    first.on_close(stamp(3), ann, cell, timer)  # the watermark passed step 3: folded into the row
    saved = cell.data
    state = UnitState.decode(saved, params.unit_bounds())
    assert state.row.exhausted and state.row.step == 3 and not state.rows and b"ann" not in saved
    restored = Cell()
    restored.write(saved)
    second = _worker(params)
    with _metrics() as counter:
        assert run(second, ann, restored, 5) == []  # nothing kept: refused by the carried row
        second.on_close(stamp(5), ann, restored, Timer())  # step 5 closes: its drop is counted
        assert counter("dropped_over_steps") == 1 and counter("kept") == 0
    fresh = Cell()
    assert [k for k, _ in run(second, bob, fresh, 5)] == [("a", 5)]
    assert UnitState.decode(restored.data, params.unit_bounds()).row.exhausted


def _metrics():
    from tests.beam.fake_state import metrics

    class Scope:
        def __enter__(self):
            self._cm = metrics()
            read = self._cm.__enter__()
            return lambda name: read("beam_dp/units", name)

        def __exit__(self, *exc):
            return self._cm.__exit__(*exc)

    return Scope()


# -- the continual_stats job on a stream -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.pipeline
def test_the_streaming_job_reads_the_unit_field_of_each_message(tmp_path):
    """``continual_stats --streaming --privacy-unit-column user``: JSON messages (the Pub/Sub source replaced
    by a TestStream, ``value_0`` columns) release what the batch replay of the job's own params releases."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import continual_stats

    argv = ["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=1",
            f"--start={CLOCK.start}", f"--period={CLOCK.period}", f"--end={CLOCK.end}", "--epsilon=1.0",
            f"--output={tmp_path}", "--format=jsonl", "--streams=a,b,c", "--privacy-unit-column=user",
            "--max-unit-steps=3", "--min-separation=2", "--max-contributions-per-step=2"]
    options = PipelineOptions(argv)
    job = continual_stats.plan(options)
    assert job.unit.column == "user" and job.params["sum"].privacy_unit == job.unit
    events = _events(seed=9, n=40)
    expected = collect.run(lambda p: (p | beam.Create(events) | "ContinualSum" >> ContinualSum(job.params["sum"])).releases)
    messages = TestStream()
    for step in range(1, 9):
        messages = messages.add_elements([TimestampedValue(json.dumps(
            {"stream_id": e["stream_id"], "timestamp": e["timestamp"], "value_0": e["value"], "user": e["user"]}
        ).encode(), e["timestamp"]) for e in events if CLOCK.step_of(e["timestamp"]) == step])
        messages = messages.advance_watermark_to(CLOCK.start + step * CLOCK.period)
    messages = messages.advance_watermark_to_infinity()
    with beam.Pipeline(options=options) as p:
        outputs = continual_stats.build(p, job, options.view_as(continual_stats.ContinualStatsOptions),
                                        messages=messages)
        assert_that(outputs["sum"].releases, rows_match(expected), label="sum")
