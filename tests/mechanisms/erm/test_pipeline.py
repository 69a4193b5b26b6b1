"""Beam transforms on the FnApiRunner: snapshots equal the pure mechanism's under the same key;
dead letters; Parquet/JSONL round trip and ``load_model``."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam.erm import (
    ContinualModelParams,
    ContinualModelRelease,
    MultiResolutionParams,
    MultiResolutionRelease,
    SlidingWindowModelParams,
    SlidingWindowModelRelease,
)
from beam_dp.io import WriteReleasesToJsonLines, WriteReleasesToParquet, read_releases, release_to_row
from beam_dp.io.models import load_model
from beam_dp.mechanisms.erm import LabelledRows
from tests.beam.collect import run as collect
from tests.beam.helpers import assert_that, batch_options, domain_noise, labelled, reasons_are, rows_match

CLASSES = ("a", "b", "c")


def make_events(n_per_stream, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for stream in ("s1", "s2"):
        X = rng.normal(size=(n_per_stream, 3))
        y = [CLASSES[i] for i in rng.integers(0, 3, n_per_stream)]
        data[stream] = (X, y)
    events = [(s, X[i].tolist(), y[i]) for s, (X, y) in data.items() for i in range(n_per_stream)]
    return events, data


def expected(params, data, domain):
    """The pure mechanism's rows under the test key in the noise domain ``domain`` (the transform's full label)."""
    mech = params.build_mechanism()
    noise = domain_noise(params, domain)
    rows = []
    for stream, (X, y) in data.items():
        state = mech.init_state(stream)
        unit = params.block_size
        labels = np.array([CLASSES.index(v) for v in y])
        for start in range(0, len(X) - unit + 1, unit):
            state, rel = mech.step(state, LabelledRows(X[start:start + unit], labels[start:start + unit]), noise)
            rows += [release_to_row(r, mech.guarantee) for r in rel]
    return mech, labelled(rows, params, domain)


COMMON = dict(n_features=3, classes=CLASSES, lam=1.0, epsilon=1.0, clip_bound=2.0)
CASES = [
    (MultiResolutionRelease, MultiResolutionParams(block=4, **COMMON)),
    (ContinualModelRelease, ContinualModelParams(update=2, base=4, **COMMON)),
    (ContinualModelRelease, ContinualModelParams(update=2, base=4, sampling=True, **COMMON)),
    (SlidingWindowModelRelease, SlidingWindowModelParams(window=6, block=2, **COMMON)),
    (SlidingWindowModelRelease, SlidingWindowModelParams(window=6, block=2, noise="gaussian", delta=1e-6,
                                                         **COMMON)),
]


@pytest.mark.parametrize("transform,params", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_snapshots_equal_pure_mechanism(transform, params):
    events, data = make_events(17)  # the trailing incomplete block is never used
    _, want = expected(params, data, transform.__name__)  # applied with its default label
    assert want
    bad = [("s1", [1.0, 2.0], "a"), ("s1", [np.nan, 0.0, 0.0], "a"), ("s2", [0.0, 0.0, 0.0], "z"),
           ("s2", [0.0, np.inf, 0.0], "b"), ("", [0.0, 0.0, 0.0], "a"), ("s1", [0.0, 0.0])]
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(events[:5] + bad + events[5:]) | transform(params)
        assert_that(out.releases, rows_match(want), label="releases")
        assert_that(out.dead_letter, reasons_are({"wrong_shape": 1, "non_finite": 2, "bad_label": 1,
                                                  "bad_stream_id": 1, "malformed": 1}), label="dead")


def test_parquet_jsonl_round_trip_and_load_model(tmp_path):
    params = ContinualModelParams(update=4, base=8, **COMMON)
    events, data = make_events(24)
    mech, want = expected(params, data, "ContinualModelRelease")
    with beam.Pipeline(options=batch_options()) as p:
        out = p | beam.Create(events) | ContinualModelRelease(params)
        out.releases | WriteReleasesToParquet(str(tmp_path / "pq" / "models"))
        out.releases | WriteReleasesToJsonLines(str(tmp_path / "js" / "models"))
    for pattern in (str(tmp_path / "pq" / "*.parquet"), str(tmp_path / "js" / "*")):
        rows = read_releases(pattern)
        assert [(r["stream"], r["step"]) for r in rows] == sorted((r.stream, r.step) for r in want)
        last = rows[-1]
        assert last["meta"]["certified"] and last["meta"]["covers"] and last["meta"]["chain"]
        assert last["epsilon_spent"] <= 1.0 and last["epsilon_budget"] == 1.0
        predictor = load_model(last)
        X, y = data[last["stream"]]
        assert predictor.predict(X).shape == (len(X),) and set(predictor.predict(X)) <= set(CLASSES)
        ref = [r for r in want if (r.stream, r.step) == (last["stream"], last["step"])][0]
        direct = load_model(ref)
        assert np.allclose(predictor.decision_function(X), direct.decision_function(X), rtol=1e-12)


def test_declared_streams_and_collect():
    params = SlidingWindowModelParams(window=3, block=1, streams=("s1", "s2", "quiet"), **COMMON)
    events, data = make_events(5)
    rows = collect(lambda p: (p | beam.Create(events + [("other", [0.0, 0.0, 0.0], "a")])
                              | SlidingWindowModelRelease(params)).releases)
    assert sorted({r.stream for r in rows}) == ["s1", "s2"]
    assert [r.step for r in rows if r.stream == "s1"] == [3, 4, 5]  # window full at t = w = 3


def test_invalid_params():
    with pytest.raises(ValueError):
        ContinualModelParams(update=3, base=8, **COMMON)          # b0 does not divide B
    with pytest.raises(ValueError):
        SlidingWindowModelParams(window=8, block=2, **COMMON)     # 8 is not (2^k − 1)·2
    with pytest.raises(ValueError):
        MultiResolutionParams(block=4, **{**COMMON, "lam": 0.0})  # λ ≤ 0
    with pytest.raises(ValueError):
        MultiResolutionParams(block=4, sampling=True, noise="gaussian", delta=1e-6, **COMMON)
    with pytest.raises(TypeError):
        ContinualModelRelease(MultiResolutionParams(block=4, **COMMON))
