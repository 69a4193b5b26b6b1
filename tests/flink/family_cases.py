"""Small inputs of every per-record family for the Flink parity test (importable in both venvs: no PyFlink).

Each case is a Beam params object (with its own explicit noise domain) and its inputs as the Beam
transform takes them: good elements of two streams and a few bad ones (each refused at parse), in
arrival order. Shared by :mod:`tests.flink.family_reference` (the Beam transforms, main venv) and
:mod:`tests.flink.test_flink_families` (the same params on Flink).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from beam_dp.core import StepClock
from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe
from beam_dp.steps.params import NoiseKey

CLOCK = StepClock(start=0.0, period=10.0, end=50.0)  # 5 steps
UNIVERSE = Universe([Categorical("colour", ("red", "green")), Bucketed("size", (0, 1, 2))])
STREAMS = ("a", "b", "silent")


class Case(NamedTuple):
    name: str
    params: Any
    inputs: dict[str, list]  # input kind ("elements", or a growing database's "queries") -> raw elements


def _labelled(rng, n: int, classify: bool) -> list[tuple]:
    ids = rng.choice(["a", "b"], n)
    x = rng.normal(0, 0.6, (n, 2))
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0) if classify else x @ np.array([0.5, -0.3]) + rng.normal(0, 0.1, n)
    return [(str(s), row.tolist(), float(label)) for s, row, label in zip(ids, x, y)]


def _online() -> Case:
    from beam_dp.beam import OnlineLearnerParams

    rng = np.random.default_rng(1)
    good = _labelled(rng, 30, True)
    bad = [("a", [float("nan"), 0.0], 1.0), ("b", [0.1], 1.0), ("a", [0.1, 0.2], 0.5)]
    params = OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, window=4, streams=STREAMS,
                                 noise_key=NoiseKey(domain="fam-online"))
    return Case("online", params, {"elements": good[:10] + bad + good[10:]})


def _regression() -> Case:
    from beam_dp.beam import IncrementalRegressionParams

    rng = np.random.default_rng(2)
    good = _labelled(rng, 30, False)
    times = np.sort(rng.random(len(good)) * 45.0)
    timed = [(s, float(t), x, y) for (s, x, y), t in zip(good, times)]
    bad = [("a", 60.0, [0.1, 0.1], 0.2), ("zz", 1.0, [0.1, 0.1], 0.2), ("b", 2.0, [0.1, "x"], 0.2)]
    params = IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6, clock=CLOCK, streams=STREAMS,
                                         noise_key=NoiseKey(domain="fam-regression"))
    return Case("regression", params, {"elements": timed[:5] + bad + timed[5:]})


def _models(algorithm: str) -> Case:
    from beam_dp.beam import ContinualModelParams, MultiResolutionParams, SlidingWindowModelParams

    rng = np.random.default_rng(3)
    good = _labelled(rng, 40, algorithm == "multiresolution")
    bad = [("a", [float("inf"), 0.0], 0.1), ("b", [0.1, 0.2], float("nan"))]
    common = dict(n_features=2, epsilon=1.0, streams=STREAMS, noise_key=NoiseKey(domain=f"fam-{algorithm}"))
    if algorithm == "continual":
        params = ContinualModelParams(update=4, base=8, **common)
    elif algorithm == "multiresolution":  # multiclass logistic regression on dyadic blocks
        good = [(s, x, str(int(y))) for s, x, y in good]
        bad.append(("a", [0.1, 0.2], "7"))
        params = MultiResolutionParams(block=4, classes=("-1", "1"), **common)
    else:
        params = SlidingWindowModelParams(block=4, window=12, **common)
    return Case(algorithm, params, {"elements": good[:7] + bad + good[7:]})


def _growing(mechanism: str) -> Case:
    from beam_dp.beam import GrowingDatabaseParams

    rng = np.random.default_rng(4)
    n = 24
    ts = np.sort(rng.random(n) * 48.0)
    colours, sizes = rng.choice(["red", "green"], n), rng.choice([0.0, 1.0, 2.0], n)
    ids = rng.choice(["a", "b"], n)
    elements = [(str(s), float(t), (str(c), float(z))) for s, t, c, z in zip(ids, ts, colours, sizes)]
    bad_elements = [("a", 3.0, ("blue", 1.0)), ("b", 70.0, ("red", 1.0))]
    weights = np.linspace(0.0, 1.0, UNIVERSE.size)
    queries = [(s, f"q{i}", t, weights.tolist()) for i, (s, t) in enumerate([("a", 5), ("a", 8), ("b", 6), ("b", 9)])]
    bad_queries = [("a", "early", 1, weights.tolist()), ("b", "never", 500, weights.tolist())]
    extra = dict(delta=1e-6) if mechanism == "bbimprover" else {}
    params = GrowingDatabaseParams(universe=UNIVERSE, n=4, epsilon=1.0, clock=CLOCK, mechanism=mechanism,
                                   snapshots=True, streams=STREAMS, noise_key=NoiseKey(domain=f"fam-{mechanism}"),
                                   **extra)
    return Case(mechanism, params, {"elements": elements[:4] + bad_elements + elements[4:],
                                    "queries": queries + bad_queries})


def _lifelong() -> Case:
    from beam_dp.beam.lifelong import END_OF_TASK, LifelongParams
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    rng = np.random.default_rng(5)
    config = BoundedAGEMConfig(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=4, task_ids=("t0", "t1"),
                               device="cpu", epsilon=1.0, delta=1e-5, task_size=8)
    rows = [(str(s), task, rng.normal(0, 0.5, 4).tolist(), int(rng.integers(0, 2)))
            for task in ("t0", "t1") for s in rng.choice(["a", "b"], 10)]
    bad = [("a", "t9", [0.0] * 4, 1), ("b", "t0", [0.0] * 4, 5)]
    elements = rows[:10] + [("a", "t0", END_OF_TASK)] + bad + rows[10:]
    params = LifelongParams(config, streams=STREAMS, noise_key=NoiseKey(domain="fam-lifelong"), allow_cuda=False)
    return Case("lifelong", params, {"elements": elements})


def cases() -> list[Case]:
    return [_online(), _regression(), _models("continual"), _models("multiresolution"), _models("sliding"),
            _growing("pmwg"), _growing("bbscheduler"), _growing("bbimprover"),
            _lifelong()]


def row_key(row: dict) -> tuple:
    """A release row's place: its stream, step and meta (a growing database's query id)."""
    return row["stream"], row["step"], json.dumps(row.get("meta"), sort_keys=True)


def assert_same_rows(got: list[dict], want: list[dict], tolerance: float = 1e-9) -> None:
    """The same rows (by :func:`row_key`), values within ``tolerance``, every other column equal."""
    got, want = sorted(got, key=row_key), sorted(want, key=row_key)
    assert [row_key(r) for r in got] == [row_key(r) for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g["value"], dtype=float), np.asarray(w["value"], dtype=float),
                                   rtol=tolerance, atol=tolerance)
        assert {k: v for k, v in g.items() if k != "value"} == {k: v for k, v in w.items() if k != "value"}


def letter_counts(letters: list[dict]) -> dict[str, int]:
    """Dead letters as ``{"reason/stream": count}``."""
    counts: dict[str, int] = {}
    for letter in letters:
        name = f"{letter['reason']}/{letter['stream']}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
