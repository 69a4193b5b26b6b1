"""The engine-free replay: releases into a sink step by step, identical for any group size."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.core.clock import StepClock
from beam_dp.mechanisms import BinaryTreeSum
from beam_dp.mechanisms.replay import replay_batches, replay_event_time
from beam_dp.mechanisms.sums import make_counter

KEY = bytes(range(32))
CLOCK = StepClock(start=0.0, period=10.0, end=120.0)  # 12 steps


def _events(n: int = 400, seed: int = 2):
    rng = np.random.default_rng(seed)
    ids = rng.choice([f"u{i}" for i in range(11)], n)
    ts = rng.uniform(-5.0, 130.0, n)  # some outside the schedule (ignored)
    return ids, ts, rng.normal(0, 1.0, (n, 2))


@pytest.mark.parametrize("counter,noise", [("blt", "gaussian"), ("kary", "gamma")])
def test_releases_do_not_depend_on_the_group_size(counter, noise):
    kw = {"delta": 1e-6} if noise == "gaussian" else {}
    mech = make_counter(counter, noise=noise, horizon=12, dim=2, epsilon=1.0, clip_bound=1.0, **kw)
    ids, ts, values = _events()
    runs = {}
    for size in (None, 1, 4):
        batches = []
        declared = tuple(f"u{i}" for i in range(10)) + ("quiet",)  # u10's events are ignored
        replay_batches(mech, ids, ts, values, CLOCK, NoiseSource(KEY), batches.append, streams=declared, group_size=size)
        assert [b.step for b in batches] == sorted(b.step for b in batches)  # step order
        assert sum(len(b) for b in batches) == 11 * 12  # 10 streams with data + 1 declared without, 12 steps
        runs[size] = {(r.stream, r.step): r for b in batches for r in b.rows()}
    for size in (1, 4):
        assert runs[size].keys() == runs[None].keys()
        for k, r in runs[None].items():
            np.testing.assert_allclose(runs[size][k].value, r.value, rtol=1e-12, atol=1e-12)
            assert runs[size][k].epsilon_spent == r.epsilon_spent


def test_replay_event_time_matches_stepping_by_hand_for_a_per_stream_mechanism():
    mech = BinaryTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, horizon=12)
    ids, ts, values = _events(60, seed=4)
    got = replay_event_time(mech, ids, ts, values, CLOCK, NoiseSource(KEY))
    assert list(got) == sorted(set(ids.tolist()))
    noise = NoiseSource(KEY)
    steps = np.floor(ts / 10.0).astype(int) + 1
    for stream, releases in got.items():
        state = mech.init_state(stream)
        for t in range(1, 13):
            block = values[(ids == stream) & (ts >= 0) & (ts < 120) & (steps == t)]
            state, (expected,) = mech.step(state, block if len(block) else None, noise)
            assert releases[t - 1].step == t
            np.testing.assert_allclose(releases[t - 1].value, expected.value, rtol=1e-12, atol=1e-12)


def test_replay_refuses_a_bad_group_size():
    mech = make_counter("blt", noise="gaussian", delta=1e-6, horizon=12, dim=2, epsilon=1.0, clip_bound=1.0)
    with pytest.raises(ValueError, match="group_size"):
        replay_batches(mech, *_events(10), CLOCK, NoiseSource(KEY), lambda b: None, group_size=0)
