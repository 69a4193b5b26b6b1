"""Budget and public information (issue 8, item 4).

* Every mechanism family runs long (10^5 steps where a step is cheap) and every release's
  ``epsilon_spent``/``delta_spent`` is checked against the guarantee and for monotonicity; for the
  counters the worst per-element spend is also recomputed independently from the per-step charge
  log (``charges_at`` → ``PrivacyLedger``) and must not exceed the guarantee.
* Configurations that would exceed the budget (or cannot be certified) raise ``ValueError`` at
  construction; steps beyond a declared horizon are refused.
* Release schedules are public: two neighbouring inputs give identical (stream, step, step_start,
  step_end, mechanism) lists through the Beam transforms.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import (
    ContinualModelParams,
    ContinualModelRelease,
    ContinualSum,
    ContinualSumParams,
    GrowingDatabaseParams,
    GrowingDatabaseQueries,
    OnlineLearner,
    OnlineLearnerParams,
    WindowedSumParams,
)
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.guarantee import PrivacyLedger
from beam_dp.mechanisms.erm import HuberRegression, LabelledRows, SlidingWindowMechanism
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, BBScheduler, LaplaceHistogram
from beam_dp.mechanisms.online.learners import make_online_learner
from beam_dp.mechanisms.online.regression import make_incremental_regression
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.snapping import SnappedSum
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from tests.conftest import TEST_KEY
from tests.reliability.harness import run_pipeline
from tests.reliability.targets import CLOCK, UNIVERSE, _erm_events, _sum_events, all_targets

TOL = 1e-9
LONG = 1 << 14  # default run; the 10^5-step runs of the default counters are marked slow
GAUSS = dict(noise="gaussian", delta=1e-6)

COUNTERS = {  # name -> (make, steps)
    "hybrid": (lambda: HybridTreeSum(dim=1, epsilon=1.0, clip_bound=1.0), LONG),
    "doubling": (lambda: DoublingTreeSum(dim=1, epsilon=1.0, clip_bound=1.0), LONG),
    "binary": (lambda: BinaryTreeSum(horizon=LONG, dim=1, epsilon=1.0, clip_bound=1.0), LONG),
    "window": (lambda: WindowTreeSum(window=16, dim=1, epsilon=1.0, clip_bound=1.0), LONG),
    "blt": (lambda: make_counter("blt", dim=1, epsilon=1.0, clip_bound=1.0, **GAUSS), LONG),
    "kary": (lambda: make_counter("kary", dim=1, epsilon=1.0, clip_bound=1.0), LONG),
    "honaker": (lambda: make_counter("honaker", horizon=1 << 12, dim=1, epsilon=1.0, clip_bound=1.0, **GAUSS), 1 << 12),
    "toeplitz": (lambda: make_counter("toeplitz", horizon=1024, dim=1, epsilon=1.0, clip_bound=1.0, **GAUSS), 1024),
    "snapped hybrid": (lambda: SnappedSum(lambda r: HybridTreeSum(dim=1, epsilon=1.0, clip_bound=r), clip_bound=1.0,
                                          granularity=0.5), LONG),
}


def _check_spend(releases, guarantee):
    _check_spends(np.array([r.epsilon_spent for r in releases]), np.array([r.delta_spent for r in releases]), guarantee)


def _check_spends(eps, delta, guarantee):
    assert len(eps) and np.all(eps <= guarantee.epsilon * (1 + TOL)) and np.all(delta <= guarantee.delta * (1 + TOL) + 0)
    assert np.all(np.diff(eps) >= -TOL * guarantee.epsilon), "epsilon_spent went down"


@pytest.mark.parametrize("name", list(COUNTERS))
def test_counter_spend_over_a_long_run(name):
    _long_run(name, *COUNTERS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name, counter, extra", [("blt", "blt", GAUSS), ("kary", "kary", {})])
def test_default_counters_spend_over_1e5_steps(name, counter, extra):
    """Stepped as a group of one stream (``step_group``: the spend ``step`` releases, without a
    ``Release`` object per step)."""
    mech, steps = make_counter(counter, dim=1, epsilon=1.0, clip_bound=1.0, **extra), 100_000
    group, noise, ones = mech.init_group(["s"]), NoiseSource(TEST_KEY), np.ones(1)
    values = np.random.default_rng(0).uniform(-1, 1, (steps, 1, 1))  # within the clip bound
    eps, delta = np.empty(steps), np.empty(steps)
    for t in range(steps):
        group, batch = mech.step_group(group, values[t], ones, noise)
        assert batch.step == t + 1
        eps[t], delta[t] = batch.epsilon_spent, batch.delta_spent
    _check_spends(eps, delta, mech.guarantee)


def _long_run(name, make, steps):
    mech = make()
    noise = NoiseSource(TEST_KEY)
    state, releases = mech.init_state("s"), []
    ledger = PrivacyLedger(mech.guarantee)
    values = np.random.default_rng(0).uniform(-1, 1, (steps, 1))
    for t in range(steps):
        state, rel = mech.step(state, values[t], noise)
        releases += rel
        if hasattr(mech, "charges_at") and name not in ("blt", "toeplitz", "honaker", "kary"):
            ledger.record(mech.charges_at(t + 1))
    assert len(releases) == steps
    _check_spend(releases, mech.guarantee)
    if ledger.charges:  # the independent recomputation from the charge log
        window = mech.guarantee.window
        if window is None:
            eps, delta = ledger.worst(steps)
            assert eps <= mech.guarantee.epsilon * (1 + TOL) and delta <= mech.guarantee.delta * (1 + TOL)
            assert eps >= releases[-1].epsilon_spent * (1 - 1e-6)  # the release log is the ledger's worst


def test_erm_online_regression_growing_db_spend_over_long_runs():
    rng = np.random.default_rng(0)
    huber = HuberRegression(n_features=2, clip_bound=1.0, huber=1.0)
    sliding = SlidingWindowMechanism(block=2, levels=3, model=huber, lam=1.0, epsilon=1.0)
    blocks = [LabelledRows(rng.uniform(-0.5, 0.5, (2, 2)), rng.uniform(-1, 1, 2)) for _ in range(300)]
    cocop = make_online_learner("cocop", dim=2, constraint="simplex", loss="logistic", epsilon=1.0, window=8, mu=1.0)
    reg = make_incremental_regression("privincreg1", dim=2, epsilon=1.0, delta=1e-6, horizon=None)
    pmwg = PMWG(universe_size=3, n=4, epsilon=1.0, alpha=0.3)
    growing = [GrowingBlock(np.array([0, 1, 2, 1]))] + [
        GrowingBlock(np.array([i % 3]), (Query(5 + i, f"q{i}", rng.uniform(0, 1, 3)),)) for i in range(3000)]
    runs = [
        (sliding, blocks),
        (cocop, [(r, 1.0 if i % 2 else -1.0) for i, r in enumerate(rng.uniform(-0.5, 0.5, (20_000, 2)))]),
        (reg, [(r, 0.5) for r in rng.uniform(-0.5, 0.5, (5_000, 2))]),
        (pmwg, growing),
        (BBScheduler(LaplaceHistogram(3), universe_size=3, n=4, epsilon=1.0, gamma=0.5), growing),
        (BBImprover(LaplaceHistogram(3), universe_size=3, n=4, epsilon=1.0, delta=1e-6), growing),
    ]
    for mech, steps in runs:
        noise, state, releases = NoiseSource(TEST_KEY), mech.init_state("s"), []
        for block in steps:
            state, rel = mech.step(state, block, noise)
            releases += rel
        _check_spend(releases, mech.guarantee)


# -- configurations beyond the budget raise ----------------------------------------------------
@pytest.mark.parametrize("build", [
    lambda: ContinualSumParams(clock=CLOCK, epsilon=0.0),
    lambda: ContinualSumParams(clock=CLOCK, epsilon=float("inf")),
    lambda: ContinualSumParams(clock=CLOCK, noise="gaussian", delta=1.0),
    lambda: ContinualSumParams(clock=CLOCK, noise="gamma", delta=1e-6),
    lambda: ContinualSumParams(clock=StepClock(0, 10, end=1000), horizon=10),  # the clock outruns the horizon
    lambda: make_counter("toeplitz", horizon=None, dim=1, epsilon=1.0, clip_bound=1.0, **GAUSS),  # unbounded sensitivity
    lambda: WindowedSumParams(clock=CLOCK, window=0),
    lambda: GrowingDatabaseParams(universe=UNIVERSE, n=4, epsilon=-1.0, clock=CLOCK),
    lambda: GrowingDatabaseParams(universe=UNIVERSE, n=4, epsilon=1.0, clock=CLOCK, mechanism="bbimprover"),
    lambda: OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, window=0),
    lambda: make_incremental_regression("privincerm", dim=2, epsilon=1.0, delta=0.0, horizon=8),
])
def test_over_budget_or_uncertifiable_configurations_raise(build):
    with pytest.raises(ValueError):
        build()


def test_steps_beyond_the_horizon_are_refused():
    mech = BinaryTreeSum(horizon=4, dim=1, epsilon=1.0, clip_bound=1.0)
    noise, state = NoiseSource(TEST_KEY), mech.init_state("s")
    for _ in range(4):
        state, _ = mech.step(state, np.array([0.5]), noise)
    with pytest.raises(ValueError):
        mech.step(state, np.array([0.5]), noise)


# -- release schedules do not depend on private data -------------------------------------------
def _schedule(rows):
    return sorted((r.stream, r.step, r.step_start, r.step_end, r.mechanism) for r in rows)


def _run(build_pipeline):
    return run_pipeline(build_pipeline).releases


def test_neighbouring_inputs_have_identical_release_schedules():
    def simple(transform, events):
        def build(p):
            out = p | beam.Create(events, reshuffle=False) | transform
            return {"releases": out.releases, "dead": out.dead_letter}
        return build

    sum_params = ContinualSumParams(clock=CLOCK, streams=("a", "b"), dim=2, epsilon=1.0, clip_bound=1.0)
    d = [e for e in _sum_events(0) if e[0] == "a"] + [("b", 12.5, [0.5, 0.5])]  # stream b: one element
    d_prime = d[:-1]  # ... removed: b has no data at all
    assert _schedule(_run(simple(ContinualSum(sum_params), d))) == _schedule(_run(simple(ContinualSum(sum_params), d_prime)))

    erm = ContinualModelParams(update=2, base=4, n_features=2, classes=("x", "y", "z"), lam=1.0, epsilon=1.0,
                               clip_bound=1.0, streams=("a", "b"))
    d = _erm_events(0)
    d_prime = [d[0][:1] + ([-0.5, 0.5], "z")] + d[1:]  # one example replaced
    assert _schedule(_run(simple(ContinualModelRelease(erm), d))) == _schedule(_run(simple(ContinualModelRelease(erm), d_prime)))

    online = OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, window=4, loss="logistic", streams=("a", "b"))
    d = [("a", [0.25, -0.25], 1.0), ("a", [0.5, 0.0], -1.0), ("b", [0.0, 0.5], 1.0)]
    d_prime = [("a", [-0.5, 0.25], -1.0)] + d[1:]
    assert _schedule(_run(simple(OnlineLearner(online), d))) == _schedule(_run(simple(OnlineLearner(online), d_prime)))

    gdb = GrowingDatabaseParams(universe=UNIVERSE, n=2, epsilon=1.0, clock=CLOCK, streams=("a",))
    elements = [("a", 1.5, {"colour": "red", "size": 0.5}), ("a", 11.5, {"colour": "green", "size": 1.5}),
                ("a", 21.5, {"colour": "red", "size": 1.5})]
    queries = [("a", "q1", 2, [0.5] * UNIVERSE.size), ("a", "q2", 3, [1.0] * UNIVERSE.size)]

    def growing(els):
        def build(p):
            out = {"elements": p | "E" >> beam.Create(els, reshuffle=False),
                   "queries": p | "Q" >> beam.Create(queries, reshuffle=False)} | GrowingDatabaseQueries(gdb)
            return {"releases": out.releases, "dead": out.dead_letter}
        return build

    replaced = elements[:1] + [("a", 11.5, {"colour": "red", "size": 0.5})] + elements[2:]
    assert _schedule(_run(growing(elements))) == _schedule(_run(growing(replaced)))


def _private(element):
    """The private field of an element: its last field (inside a tagged ``(tag, element)`` pair)."""
    return _private(element[-1]) if isinstance(element[-1], tuple) else element[-1]


def _with_private(element, value):
    inner = _with_private(element[-1], value) if isinstance(element[-1], tuple) else value
    return element[:-1] + (inner,)


@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_every_transform_releases_on_the_same_schedule_for_a_neighbouring_input(target):
    """Replace the private field of one element (a sum's value, a count's timestamp, a label, a
    growing-database record) by another element's, within its stream: the release schedule must
    not move (a stream's arrival count and the stream set are public, its values are not)."""
    first = target.good[0]
    donor = next(e for e in target.good if _private(e) != _private(first) and type(e[-1]) is type(first[-1]))
    neighbour = [_with_private(first, _private(donor))] + list(target.good[1:])
    runs = [run_pipeline(lambda p, els=els: target.build(p, els)) for els in (target.good, neighbour)]
    assert runs[0].releases and _schedule(runs[0].releases) == _schedule(runs[1].releases)
    assert not runs[0].dead and not runs[1].dead
