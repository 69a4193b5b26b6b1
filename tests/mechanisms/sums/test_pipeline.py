"""ContinualSum(counter=...) on the FnApiRunner equals the pure mechanism under the same key."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dp.beam import ContinualCount, ContinualCountParams, ContinualSum, ContinualSumParams
from beam_dp.core import StepClock
from tests.beam.helpers import batch_options, expected_rows, rows_match

pytestmark = pytest.mark.pipeline

CLOCK = StepClock(start=0.0, period=10.0, end=10.0 * 37)  # 37 steps, public end = horizon for the counters


def _events(n=400, dim=2, seed=11):
    rng = np.random.default_rng(seed)
    ids = rng.choice(["a", "b"], size=n)
    ts = rng.random(n) * CLOCK.end
    values = rng.normal(0, 1.0, size=(n, dim))
    return ids, ts, values


def test_every_counter_in_beam_equals_the_pure_mechanism():
    ids, ts, values = _events()
    gauss = dict(dim=2, epsilon=1.0, delta=1e-6, noise="gaussian", clip_bound=1.5, clock=CLOCK)
    pure = dict(dim=2, epsilon=1.0, noise="gamma", clip_bound=1.5, clock=CLOCK)
    cases = {
        "auto-gauss": ContinualSumParams(**gauss),
        "auto-pure": ContinualSumParams(**pure),
        "honaker": ContinualSumParams(counter="honaker", **gauss),
        "toeplitz": ContinualSumParams(counter="toeplitz", **gauss),
        "blt-unbounded": ContinualSumParams(counter="blt", block_size=1000, **{k: v for k, v in gauss.items() if k != "clock"}),
        "kary": ContinualSumParams(counter="kary", horizon=64, **pure),
    }
    names = {k: p.build_mechanism().name for k, p in cases.items()}
    assert names == {"auto-gauss": "blt", "auto-pure": "kary_tree", "honaker": "honaker_tree",
                     "toeplitz": "toeplitz_sqrt", "blt-unbounded": "blt", "kary": "kary_tree"}
    assert cases["auto-gauss"].build_mechanism().horizon == 37  # the clock's public end
    assert cases["blt-unbounded"].build_mechanism().horizon is None
    events = [(str(i), float(t), v.tolist()) for i, t, v in zip(ids, ts, values)]
    count_params = ContinualCountParams(epsilon=1.0, clock=CLOCK, counter="honaker")
    count_expected = expected_rows(count_params.as_sum_params(), ids, ts, np.ones((len(ids), 1)))
    with beam.Pipeline(options=batch_options()) as p:
        pcoll = p | beam.Create(events)
        for label, params in cases.items():
            if params.clock is None:
                continue
            out = pcoll | f"Sum-{label}" >> ContinualSum(params)
            want = expected_rows(params, ids, ts, values, domain=f"Sum-{label}")  # its label is its noise domain
            assert_that(out.releases, rows_match(want), label=f"releases-{label}")
            assert_that(out.dead_letter, equal_to([]), label=f"dead-{label}")
        count = pcoll | "Count" >> beam.Map(lambda e: (e[0], e[1])) | ContinualCount(count_params)
        assert_that(count.releases, rows_match(count_expected), label="count")
