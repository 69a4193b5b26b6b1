"""The streaming rules through the Flink shell (:class:`beam_dp.flink.job.ContinualReleaseFunction`),
driven by a scripted Flink: keyed state, event-time timers and watermarks moved by the test, so each
rule is checked exactly (a MiniCluster's periodic watermarks cannot be placed between two events).
The same scenarios as tests/beam/test_streaming_rules.py, with the same end rule (``StepDriver.end_step``
of the first step the last finite watermark had not closed: Flink knows it exactly). Needs .venv-flink (``make flink-test``)."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

pytest.importorskip("pyflink")

from beam_dp.core import NoiseSource, StepClock  # noqa: E402
from beam_dp.core.budget import composition_of  # noqa: E402
from beam_dp.core.noise_binding import calibration_binding  # noqa: E402
from beam_dp.flink.job import DEAD_LETTERS, ContinualReleaseFunction  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from beam_dp.mechanisms.replay import replay_event_time  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402
from beam_dp.steps.params import NoiseKey  # noqa: E402
from beam_dp.steps.schema import ReleaseLabels, release_to_row  # noqa: E402
from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.cases import DOMAIN, assert_rows_equal  # noqa: E402

OPEN = StepClock(start=0.0, period=10.0)  # no public end
BUILD = functools.partial(make_tree_sum, horizon=None, unbounded="hybrid", dim=1, epsilon=1.0, delta=0.0,
                          clip_bound=1.0, noise="gamma")
MIN_WATERMARK = -(2 ** 63)
END = 2 ** 63 - 1


class _Value:
    def __init__(self):
        self.data = None

    def value(self):
        return self.data

    def update(self, data):
        self.data = data


class Metrics:
    """PyFlink's MetricGroup as far as the function uses it: counters and gauges by dotted name."""

    def __init__(self, prefix="", store=None):
        self.prefix, self.store = prefix, ({"counters": {}, "gauges": {}} if store is None else store)

    def add_group(self, name):
        return Metrics(f"{self.prefix}{name}.", self.store)

    def counter(self, name):
        return self.store["counters"].setdefault(self.prefix + name, _Counter())

    def gauge(self, name, read):
        self.store["gauges"][self.prefix + name] = read

    def value(self, name):
        """A counter's count or a gauge's reading (``beam_dp.`` prefix implied)."""
        name = "beam_dp." + name
        counters = self.store["counters"]
        return counters[name].count if name in counters else self.store["gauges"][name]()


class _Counter:
    def __init__(self):
        self.count = 0

    def inc(self, n=1):
        self.count += n

    def dec(self, n=1):
        self.count -= n


class _Map:
    def __init__(self):
        self.items = {}

    def get(self, key):
        return self.items.get(key)

    def put(self, key, value):
        self.items[key] = value

    def values(self):
        return list(self.items.values())

    def clear(self):
        self.items = {}


class ScriptedFlink:
    """One parallel instance of the keyed function: per-key state, event-time timers that fire, in
    timestamp order, when the test moves the watermark (ms, Flink's: no more records ``<= W``)."""

    def __init__(self, params, provisional=False):
        self.params, self.provisional = params, provisional
        self.function = ContinualReleaseFunction(params, provisional)
        self.states: dict[str, dict] = {}
        self.timers: set[tuple[int, str]] = set()
        self.watermark = MIN_WATERMARK
        self.key = None
        self.firings = 0
        self.releases: list[dict] = []
        self.dead: list[dict] = []
        self.metrics = Metrics()  # kept across restores, as Flink's reporters keep a job's metrics
        self.function.open(self)  # the runtime context: get_state / get_list_state follow the current key

    def restore(self):
        """A restore from a checkpoint: a fresh function on the checkpointed keyed state (its bytes) and
        timers; Flink's watermark is not checkpointed, so it starts again unknown."""
        self.function = ContinualReleaseFunction(self.params, self.provisional)
        self.function.open(self)
        self.watermark = MIN_WATERMARK

    # RuntimeContext: handles that follow the current key, as Flink's keyed state does
    def get_metrics_group(self):
        return self.metrics

    def get_state(self, descriptor):
        return _KeyedHandle(self, descriptor.get_name())

    def get_map_state(self, descriptor):
        return _KeyedHandle(self, descriptor.get_name())

    def get_current_key(self):  # Context
        return self.key

    # TimerService
    def timer_service(self):
        return self

    def current_watermark(self):
        return self.watermark

    def register_event_time_timer(self, ms):
        self.timers.add((ms, self.key))

    def _collect(self, outputs):
        for out in outputs or ():
            if isinstance(out, tuple) and out[0] is DEAD_LETTERS:
                self.dead.append(json.loads(out[1]))
            else:  # a release: (release_ms, row), its step's public release time (rule 9), in Flink ms
                release_ms, text = out
                row = json.loads(text)
                grace = round(self.params.allowed_lateness * 1_000_000)
                assert release_ms * 1000 == self.params.clock.step_end_micros(row["step"]) + grace
                self.releases.append(row)

    def element(self, stream, seconds, value):
        self.key = stream
        # what a Python operator hands the function: the plain value (from_collection's pickling is Flink's)
        self._collect(self.function.process_element((stream, float(seconds), value), self))

    def advance(self, ms):
        """Move the watermark to ``ms`` and fire every timer at or before it, in timestamp order."""
        self.watermark = ms
        while due := sorted(t for t in self.timers if t[0] <= ms):
            timer = due[0]
            self.timers.discard(timer)
            self.key = timer[1]
            self.firings += 1
            self._collect(self.function.on_timer(timer[0], self))


class _KeyedHandle:
    def __init__(self, flink, kind):
        self.flink, self.kind = flink, kind

    def _of_key(self):
        kinds = {"beam_dp_key_state": _Value, "beam_dp_mechanism": _Value, "beam_dp_step_sums": _Map}
        return self.flink.states.setdefault(self.flink.key, {k: make() for k, make in kinds.items()})[self.kind]

    def __getattr__(self, name):
        return getattr(self._of_key(), name)


def _params(**kwargs):
    return FlinkReleaseParams(build=BUILD, clock=OPEN, noise_key=NoiseKey(domain=DOMAIN), **kwargs)


def _expected(events, last_step, first_step=1, params=None):
    """The pure replay's rows, noise bound as the function's (``params``, default ``_params()``)."""
    binding = calibration_binding(params or _params())
    mechanism = BUILD()
    offset = first_step - 1
    replay = StepClock(start=OPEN.start + offset * OPEN.period, period=OPEN.period,
                       end=OPEN.start + last_step * OPEN.period)
    noise = NoiseSource(TEST_KEY).for_domain(DOMAIN, binding)
    by_stream = replay_event_time(mechanism, np.array([e[0] for e in events]), np.array([e[1] for e in events]),
                                  np.array([e[2] for e in events]), replay, noise)
    labels = ReleaseLabels(DOMAIN, composition_of(mechanism))
    rows = [labels(release_to_row(dataclasses.replace(r, step=r.step + offset), mechanism.guarantee,
                                  OPEN.step_start_micros(r.step + offset), OPEN.step_end_micros(r.step + offset)))
            for releases in by_stream.values() for r in releases]
    return sorted((json.loads(json.dumps(r._asdict())) for r in rows), key=lambda r: (r["stream"], r["step"]))


def _ms(seconds):
    return int(seconds * 1000) - 1  # Flink: no more records <= W ms, i.e. none before `seconds`


def test_data_within_the_grace_counts_and_later_data_is_dead_lettered():
    params = _params(allowed_lateness=5.0)
    flink = ScriptedFlink(params)
    on_time = [("a", 1.0, [0.5]), ("a", 3.0, [0.25]), ("a", 12.0, [0.75])]
    flink.element(*on_time[0])
    flink.element(*on_time[2])
    flink.advance(_ms(12))       # past end(1) = 10 s, within its 5 s grace
    flink.element(*on_time[1])   # step 1, in the grace: counts
    flink.advance(_ms(16))       # step 1 closes (10 + 5 <= 16)
    flink.element("a", 4.0, [9.0])  # step 1 again: late, dead-lettered whole
    flink.advance(_ms(30))
    flink.advance(END)
    # the end rule: the first open step is 3 (its end 30 s + 5 s grace > 30 s): through step 16
    assert_rows_equal(flink.releases, _expected(on_time, 16, params=params))
    assert [d["reason"] for d in flink.dead] == ["late"]


def test_watermark_at_infinity_ends_an_open_clock_cleanly():
    flink = ScriptedFlink(_params())
    on_time = [("a", 5.0, [0.5]), ("a", 21.0, [0.5]), ("a", 95.0, [0.5])]
    for event in on_time + [("a", 175.0, [0.5])]:  # step 18: beyond the end rule
        flink.element(*event)
    flink.advance(_ms(25))
    flink.advance(END)
    assert_rows_equal(flink.releases, _expected(on_time, 16))  # first open step 3: through step 16
    assert [d["reason"] for d in flink.dead] == ["unclosed"]
    assert not flink.timers  # nothing left to fire: the job ends


def test_a_stream_first_seen_late_never_releases_behind_the_watermark():
    flink = ScriptedFlink(_params())
    a = [("a", 5.0, [0.5]), ("a", 15.0, [0.5])]
    late = [("late", 55.0, [0.5])]
    for event in a:
        flink.element(*event)
    flink.advance(_ms(52))                   # closes steps 1..5
    flink.element("late", 12.0, [1.0])       # step 2: late
    flink.element(*late[0])                  # step 6: its first release
    flink.advance(_ms(72))
    flink.advance(END)
    expected = _expected(a, 16) + _expected(late, 16, first_step=6)  # first open step 8: through 16
    assert sorted(r["step"] for r in flink.releases if r["stream"] == "late") == list(range(6, 17))
    assert_rows_equal(flink.releases, expected)
    assert [d["reason"] for d in flink.dead] == ["late"]


def test_one_firing_closes_every_step_a_watermark_jump_passed():
    flink = ScriptedFlink(_params())
    events = [("a", 5.0, [0.5]), ("a", 505.0, [0.25]), ("a", 995.0, [1.0])]
    for event in events:
        flink.element(*event)
    flink.advance(_ms(1000))  # a jump of 100 steps
    assert flink.firings == 1 and sorted(r["step"] for r in flink.releases) == list(range(1, 101))
    flink.element("a", 999.0, [1.0])  # step 100: closed, late
    flink.advance(END)
    assert_rows_equal(flink.releases, _expected(events, 112))  # first open step 101: through 112
    assert [d["reason"] for d in flink.dead] == ["late"]


def test_state_holds_one_merged_block_per_open_step_not_one_entry_per_event():
    """Pre-aggregation in keyed state: 100 events of step 1 and one of step 2 leave two map entries
    (each the step's merged clipped sum), and the releases equal the pure replay's (within float
    summation order: assert_rows_equal's 1e-9)."""
    flink = ScriptedFlink(_params())
    events = [("a", 1.0 + 0.05 * i, [0.01 * (i % 7)]) for i in range(100)] + [("a", 15.0, [0.5])]
    for event in events:
        flink.element(*event)
    assert sorted(flink.states["a"]["beam_dp_step_sums"].items) == [1, 2]
    flink.advance(_ms(30))
    assert not flink.states["a"]["beam_dp_step_sums"].items  # closed steps leave nothing behind
    flink.advance(END)
    assert_rows_equal(flink.releases, _expected(events, 16))



def test_a_restore_under_other_privacy_parameters_ends_each_key_with_an_unreadable_state_letter():
    """A savepoint's keys were written under epsilon 1; the job restored under epsilon 2 (noise bound to
    the parameters) ends each of them with one ``unreadable_state`` letter and releases nothing more for
    them, instead of drawing new noise for their open cells; restored unchanged, they continue."""
    changed = FlinkReleaseParams(build=functools.partial(BUILD, epsilon=2.0), clock=OPEN,
                                 noise_key=NoiseKey(domain=DOMAIN))
    for params, continues in ((_params(), True), (changed, False)):
        flink = ScriptedFlink(_params())
        flink.element("a", 1.0, [0.5])
        flink.advance(_ms(10))  # step 1 released
        released = len(flink.releases)
        assert released == 1
        flink.params = params
        flink.restore()
        flink.element("a", 12.0, [0.5])
        flink.advance(_ms(30))
        if continues:
            assert flink.dead == [] and len(flink.releases) == 3  # steps 2 and 3
        else:
            assert [d["reason"] for d in flink.dead] == ["unreadable_state"]
            assert "other privacy parameters" in flink.dead[0]["detail"]
            assert len(flink.releases) == released
