"""Every public transform as a fuzz target: small valid params, a fixed good stream, and a hypothesis
strategy of elements that MUST be dead-lettered (each carries a raw marker from ``harness``).

Good values are dyadic rationals, so sums are exact whatever the order Beam combines them in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import apache_beam as beam
import numpy as np
from hypothesis import strategies as st

from beam_dp.beam import (
    ContinualCount,
    ContinualCountParams,
    ContinualModelParams,
    ContinualModelRelease,
    ContinualSum,
    ContinualSumParams,
    GrowingDatabaseParams,
    GrowingDatabaseQueries,
    IncrementalRegression,
    IncrementalRegressionParams,
    LifelongLearner,
    LifelongParams,
    MultiResolutionParams,
    MultiResolutionRelease,
    OnlineLearner,
    OnlineLearnerParams,
    SlidingWindowModelParams,
    SlidingWindowModelRelease,
    WindowedSum,
    WindowedSumParams,
)
from beam_dp.beam.lifelong import END_OF_TASK
from beam_dp.core import StepClock
from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe
from tests.reliability.harness import HUGE_MARK, MARK, MARK_NUMBER

CLOCK = StepClock(start=0, period=10, end=50)  # 5 public steps
STREAMS = ("a", "b")
DIM = 2

# -- junk ---------------------------------------------------------------------------------------
marked_text = st.text(max_size=4).map(lambda s: f"{MARK}-{s}")
non_numeric = st.one_of(
    st.none(), marked_text, st.binary(max_size=3).map(lambda b: MARK.encode() + b),
    st.dictionaries(marked_text, st.just(MARK_NUMBER), max_size=2), st.booleans(),
    st.just([[MARK_NUMBER], [MARK_NUMBER, 1.0]]),  # ragged
    st.just(np.array([MARK, "x"])), st.just(np.array([1 + 2j, MARK_NUMBER])),
    st.just(np.array([True, False])), st.just(complex(MARK_NUMBER, 1.0)),
)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])


def bad_vector(dim: int):
    """Anything that is not a finite numeric vector of shape (dim,)."""
    wrong_len = st.integers(0, 5).filter(lambda n: n != dim).map(lambda n: [MARK_NUMBER] * n)
    with_nan = st.tuples(st.integers(0, dim - 1), non_finite).map(
        lambda p: [MARK_NUMBER if i != p[0] else p[1] for i in range(dim)])
    wrong_rank = st.just(np.full((dim, 1), MARK_NUMBER))
    huge_wrong = st.just([HUGE_MARK] * (dim + 1))
    return st.one_of(non_numeric, wrong_len, with_nan, wrong_rank, huge_wrong,
                     st.just(MARK_NUMBER) if dim != 1 else st.just([MARK_NUMBER, 1.0]))


bad_stream_id = st.one_of(st.none(), st.just(""), st.integers(), st.floats(), st.binary(max_size=3),
                          st.just([MARK]), marked_text)  # marked text: an undeclared stream
bad_timestamp = st.one_of(
    st.none(), marked_text, non_finite, st.booleans(), st.just([1.0]), st.just({MARK: 1}),
    st.floats(-1e6, -1e-3), st.floats(50.0, 1e6), st.just(1e20), st.just(HUGE_MARK),
)
malformed_shapes = st.one_of(
    st.none(), st.integers(), marked_text, st.just(()), st.just((MARK,)), st.just([MARK, 1.0, 2.0]),
    st.tuples(marked_text, marked_text, marked_text, marked_text, marked_text),
)


def _replace(template: tuple, field: int, strategy) -> Any:
    return strategy.map(lambda v: template[:field] + (v,) + template[field + 1:])


# -- targets ------------------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    build: Callable[[Any, list], dict]  # (pipeline, elements) -> {"releases", "dead"}
    good: list
    bad: Any  # hypothesis strategy of one element that must be dead-lettered


def _simple(transform: Callable[[], beam.PTransform]):
    def build(p, elements):
        out = p | "Events" >> beam.Create(elements, reshuffle=False) | "T" >> transform()
        return {"releases": out.releases, "dead": out.dead_letter}
    return build


def _sum_events(rng_seed=0, n=40):
    rng = np.random.default_rng(rng_seed)
    ts = rng.integers(0, 50, n).astype(float) + 0.5
    vals = rng.integers(-4, 5, (n, DIM)) / 8.0
    return [(STREAMS[i % 2], float(ts[i]), vals[i].tolist()) for i in range(n)]


def _event_bad(template):
    return st.one_of(malformed_shapes, _replace(template, 0, bad_stream_id), _replace(template, 1, bad_timestamp),
                     _replace(template, 2, bad_vector(DIM)),
                     st.builds(lambda v: {"stream_id": "a", "timestamp": 1.0, "val": v}, st.just(MARK_NUMBER)))


SUM_PARAMS = dict(clock=CLOCK, streams=STREAMS, dim=DIM, epsilon=1.0, clip_bound=1.0)


def continual_sum() -> Target:
    params = ContinualSumParams(**SUM_PARAMS)
    return Target("ContinualSum", _simple(lambda: ContinualSum(params)), _sum_events(), _event_bad(("a", 1.0, [0.0, 0.0])))


def continual_sum_gaussian() -> Target:
    params = ContinualSumParams(**SUM_PARAMS, noise="gaussian", delta=1e-6)  # the BLT counter
    return Target("ContinualSum(blt)", _simple(lambda: ContinualSum(params)), _sum_events(1),
                  _event_bad(("b", 2.0, [0.0, 0.0])))


def windowed_sum() -> Target:
    params = WindowedSumParams(**SUM_PARAMS, window=2)
    return Target("WindowedSum", _simple(lambda: WindowedSum(params)), _sum_events(2), _event_bad(("a", 3.0, [0.0, 0.0])))


def continual_count() -> Target:
    params = ContinualCountParams(clock=CLOCK, streams=STREAMS, epsilon=1.0)
    good = [(s, t) for s, t, _ in _sum_events(3)]
    template = ("a", 1.0)
    bad = st.one_of(st.just(None), st.integers(), marked_text, st.just(("a", 1.0, 2.0, MARK)),
                    _replace(template, 0, bad_stream_id), _replace(template, 1, bad_timestamp))
    return Target("ContinualCount", _simple(lambda: ContinualCount(params)), good, bad)


# ERM: count steps of labelled examples
CLASSES = ("x", "y", "z")
ERM_COMMON = dict(n_features=DIM, classes=CLASSES, lam=1.0, epsilon=1.0, clip_bound=1.0, streams=STREAMS)


def _erm_events(seed=0, n=24):
    rng = np.random.default_rng(seed)
    X = rng.integers(-4, 5, (n, DIM)) / 8.0
    return [(STREAMS[i % 2], X[i].tolist(), CLASSES[i % 3]) for i in range(n)]


bad_label = st.one_of(st.none(), marked_text, st.integers(), st.just(math.nan), st.just([MARK]), st.just(1.5))


def _erm_bad():
    template = ("a", [0.0, 0.0], "x")
    return st.one_of(malformed_shapes.filter(lambda e: not (isinstance(e, tuple) and len(e) == 3)),
                     _replace(template, 0, bad_stream_id), _replace(template, 1, bad_vector(DIM)),
                     _replace(template, 2, bad_label))


def erm_targets() -> list[Target]:
    return [
        Target("MultiResolutionRelease", _simple(lambda: MultiResolutionRelease(MultiResolutionParams(block=4, **ERM_COMMON))),
               _erm_events(0), _erm_bad()),
        Target("ContinualModelRelease", _simple(lambda: ContinualModelRelease(
            ContinualModelParams(update=2, base=4, **ERM_COMMON))), _erm_events(1), _erm_bad()),
        Target("SlidingWindowModelRelease", _simple(lambda: SlidingWindowModelRelease(
            SlidingWindowModelParams(window=6, block=2, **ERM_COMMON))), _erm_events(2), _erm_bad()),
    ]


# learners
def online_learner() -> Target:
    params = OnlineLearnerParams(dim=DIM, constraint="simplex", epsilon=1.0, window=4, loss="logistic", streams=STREAMS)
    rng = np.random.default_rng(4)
    good = [(STREAMS[i % 2], (rng.integers(-4, 5, DIM) / 8.0).tolist(), float(rng.choice([-1.0, 1.0])))
            for i in range(16)]
    template = ("a", [0.0, 0.0], 1.0)
    label = st.one_of(st.none(), marked_text, non_finite, st.just(0.5), st.just(0.0))
    bad = st.one_of(malformed_shapes.filter(lambda e: not (isinstance(e, tuple) and len(e) == 3)),
                    _replace(template, 0, bad_stream_id), _replace(template, 1, bad_vector(DIM)),
                    _replace(template, 2, label))
    return Target("OnlineLearner", _simple(lambda: OnlineLearner(params)), good, bad)


def incremental_regression() -> Target:
    params = IncrementalRegressionParams(dim=DIM, epsilon=1.0, delta=1e-6, clock=CLOCK, streams=STREAMS)
    rng = np.random.default_rng(5)
    good = [(STREAMS[i % 2], float(rng.integers(0, 50)) + 0.25, (rng.integers(-4, 5, DIM) / 8.0).tolist(),
             float(rng.integers(-4, 5) / 8.0)) for i in range(24)]
    template = ("a", 1.0, [0.0, 0.0], 0.5)
    label = st.one_of(st.none(), marked_text, non_finite)
    bad = st.one_of(malformed_shapes, _replace(template, 0, bad_stream_id), _replace(template, 1, bad_timestamp),
                    _replace(template, 2, bad_vector(DIM)), _replace(template, 3, label))
    return Target("IncrementalRegression", _simple(lambda: IncrementalRegression(params)), good, bad)


# growing databases: two inputs; bad elements and bad queries
UNIVERSE = Universe([Categorical("colour", ("red", "green")), Bucketed("size", (0, 1, 2))])


def growing_db() -> Target:
    params = GrowingDatabaseParams(universe=UNIVERSE, n=4, epsilon=1.0, clock=CLOCK, streams=STREAMS)
    rng = np.random.default_rng(6)
    elements = [(STREAMS[i % 2], float(rng.integers(0, 50)) + 0.5,
                 {"colour": ("red", "green")[i % 2], "size": float(rng.integers(0, 2)) + 0.5}) for i in range(24)]
    N = UNIVERSE.size
    queries = [(s, f"q{t}", t, [0.5] * N) for s in STREAMS for t in (4, 6, 9, 12)]
    good = [("E", e) for e in elements] + [("Q", q) for q in queries]
    e_tpl = ("a", 1.0, {"colour": "red", "size": 0.5})
    bad_record = st.one_of(st.none(), marked_text, st.just({"colour": MARK, "size": 0.5}),
                           st.just({"colour": "red", "size": MARK_NUMBER}), st.just({"colour": "red", "size": math.nan}),
                           st.just({"colour": "red"}), st.just([MARK]))
    q_tpl = ("a", "qx", 6, [0.5] * N)
    bad_weights = st.one_of(non_numeric.filter(lambda v: v is not None), st.just([0.5] * (N - 1)), st.just([1.5] * N),
                            st.just([math.nan] * N), st.just([-MARK_NUMBER] * N))
    bad_t = st.one_of(st.none(), marked_text, st.just(2.5), st.booleans(), st.integers(-5, 3), st.just(10**6))
    bad_qid = st.one_of(st.none(), st.just(1.5), st.just([MARK]), st.just({MARK: 1}))
    bad_e = st.one_of(malformed_shapes.filter(lambda e: not (isinstance(e, tuple) and len(e) == 3)),
                      _replace(e_tpl, 0, bad_stream_id), _replace(e_tpl, 1, bad_timestamp), _replace(e_tpl, 2, bad_record))
    bad_q = st.one_of(malformed_shapes.filter(lambda e: not (isinstance(e, tuple) and len(e) == 4)),
                      _replace(q_tpl, 0, bad_stream_id), _replace(q_tpl, 1, bad_qid), _replace(q_tpl, 2, bad_t),
                      _replace(q_tpl, 3, bad_weights),
                      st.just({"stream_id": "a", "query_id": "two", "t": 6, "weights": [0.5] * N, "indices": [1]}),
                      st.just({"stream_id": "a", "query_id": "pred", "t": 6, "predicate": {"colour": [MARK]}}))
    bad = st.one_of(bad_e.map(lambda e: ("E", e)), bad_q.map(lambda q: ("Q", q)))

    def build(p, tagged):
        els = [e for tag, e in tagged if tag == "E"]
        qs = [q for tag, q in tagged if tag == "Q"]
        out = {"elements": p | "E" >> beam.Create(els, reshuffle=False),
               "queries": p | "Q" >> beam.Create(qs, reshuffle=False)} | GrowingDatabaseQueries(params)
        return {"releases": out.releases, "dead": out.dead_letter}

    return Target("GrowingDatabaseQueries", build, good, bad)


# lifelong (torch): a tiny network on synthetic rows
def lifelong() -> Target:
    from beam_dp.mechanisms.lifelong import L2DPConfig

    config = L2DPConfig(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=4, epochs=1,
                        task_ids=("t0", "t1"), eval_sets=None, device="cpu", epsilon=1.0)
    params = LifelongParams(config, streams=("a",), allow_cuda=False, torch_threads=1)
    rng = np.random.default_rng(7)
    good = [("a", ("t0", "t1")[i // 8], (rng.integers(-4, 5, 4) / 8.0).tolist(), int(i % 2)) for i in range(16)]
    template = ("a", "t1", [0.0] * 4, 1)
    bad_task = st.one_of(st.none(), marked_text, st.just(1.5), st.just([MARK]), st.just("t9"))
    bad_y = st.one_of(st.just(2), st.just(-1), st.just(0.5), marked_text, st.just(math.nan), st.just([0, 1]))
    bad = st.one_of(malformed_shapes, _replace(template, 0, bad_stream_id), _replace(template, 1, bad_task),
                    _replace(template, 2, bad_vector(4)), _replace(template, 3, bad_y),
                    st.just(("a", "t1", MARK)), st.just(("a", "t9", END_OF_TASK)),
                    st.just(("a", "t1", [[0.0] * 4, [0.0] * 4], [1])))
    return Target("LifelongLearner", _simple(lambda: LifelongLearner(params)), good, bad)


def all_targets() -> list[Target]:
    return [continual_sum(), continual_sum_gaussian(), windowed_sum(), continual_count(), *erm_targets(),
            online_learner(), incremental_regression(), growing_db(), lifelong()]
