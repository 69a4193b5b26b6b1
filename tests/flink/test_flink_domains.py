"""Two release functions in one real Flink job (PyFlink MiniCluster): each draws in its own noise domain,
and a domain is never claimed twice. Needs .venv-flink (``make flink-test``)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyflink")

from beam_dp.core import StepClock  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream, to_event  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402
from beam_dp.steps.params import NoiseKey  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLOCK = StepClock(start=0.0, period=10.0, end=100.0)  # 10 steps
R = 2.0  # the sum's clip bound; the count sums 1 per event (clip 1)


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _params(clip_bound: float, **kwargs) -> FlinkReleaseParams:
    build = functools.partial(make_tree_sum, horizon=CLOCK.last_step, dim=1, epsilon=1.0, clip_bound=clip_bound,
                              noise="gamma")
    return FlinkReleaseParams(build=build, clock=CLOCK, **kwargs)


def test_a_domain_is_claimed_once_per_job_and_never_by_default():
    env = local_environment(1)
    events = env.from_collection([to_event("a", 1.0, [0.5])], type_info=EVENT_TYPE)
    with pytest.raises(ValueError, match="no default domain"):
        release_stream(env, events, _params(R))
    release_stream(env, events, _params(R), uid="sum")
    with pytest.raises(ValueError, match="already claimed"):
        release_stream(env, events, _params(1.0), uid="sum")
    with pytest.raises(ValueError, match="already claimed"):
        release_stream(env, events, _params(1.0, noise_key=NoiseKey(domain="sum")), uid="count")
    release_stream(env, events, _params(1.0), uid="count")  # a new job (a new environment) starts empty
    fresh = local_environment(1)  # with its own events: a stream belongs to the job that built it
    assert release_stream(fresh, fresh.from_collection([to_event("a", 1.0, [0.5])], type_info=EVENT_TYPE),
                          _params(1.0), uid="sum")


def test_a_sum_and_a_count_in_one_job_draw_independent_noise():
    """The statistic that cancels shared noise: with one domain, the sum's noise is R times the count's
    (same tree, scale proportional to the clip bound), so ``sum − R·count`` equals the exact
    ``S_t − R·C_t`` to ~1e-15. In their own domains, z = (difference − exact) / sqrt(σ_sum² + R²σ_count²)
    (σ from each row's ``noise_std``) has E z² = 1. Tolerance: over 100 independent streams (steps of one
    stream are correlated through shared tree nodes, so count each stream once) the mean of z² has sd
    ≤ sqrt(Var z² / 100) ≤ sqrt(5 / 100) = 0.22 (Laplace-like nodes, E z⁴ ≤ 6), so [0.3, 3] is over 3 sd
    wide on each side; shared noise gives ~1e-30."""
    rng = np.random.default_rng(11)
    streams = [f"s{i}" for i in range(100)]
    n = 600
    ids = rng.choice(streams, n)
    ts = np.sort(rng.random(n) * 99.0)
    values = rng.uniform(-R, R, n)  # within the clip bound: the exact sums are the data's
    plain = [(str(s), float(t), float(v)) for s, t, v in zip(ids, ts, values)]  # Flink's collection: no numpy
    env = local_environment(2)
    sums, _ = release_stream(env, env.from_collection([to_event(s, t, [v]) for s, t, v in plain],
                                                      type_info=EVENT_TYPE), _params(R, streams=tuple(streams)),
                             uid="sum")
    counts, _ = release_stream(env, env.from_collection([to_event(s, t, [1.0]) for s, t, _ in plain],
                                                        type_info=EVENT_TYPE), _params(1.0, streams=tuple(streams)),
                               uid="count")
    with sums.union(counts).execute_and_collect() as results:
        rows = [json.loads(r) for r in results]
    by = {(r["noise_domain"], r["stream"], r["step"]): r for r in rows}
    assert {r["noise_domain"] for r in rows} == {"sum", "count"} and len(by) == 2 * len(streams) * 10
    steps = np.array([CLOCK.step_of(t) for t in ts]).astype(int)
    z = []
    for stream in streams:
        mine = ids == stream
        for step in range(1, 11):
            upto = mine & (steps <= step)
            exact = values[upto].sum() - R * upto.sum()
            s, c = by[("sum", stream, step)], by[("count", stream, step)]
            sd = np.hypot(json.loads(s["meta"])["noise_std"], R * json.loads(c["meta"])["noise_std"])
            z.append((s["value"][0] - R * c["value"][0] - exact) / sd)
    assert 0.3 < float(np.mean(np.square(z))) < 3.0, np.mean(np.square(z))
