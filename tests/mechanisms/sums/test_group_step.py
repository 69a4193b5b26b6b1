"""Group stepping (``GroupSteppedSum.step_group``): a group of streams stepped in one array operation
per step releases exactly what the per-stream steps release, with the same noise cells."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.base import ClippedSum, GroupSteppedSum
from beam_dp.testing.noise import ZeroNoise
from tests.mechanisms.sums.helpers import KEY, HalfNoise, build
from tests.release_checks import assert_release_matches

GROUPED = [("blt", "gaussian"), ("toeplitz", "gaussian"), ("kary", "gamma"), ("honaker", "gamma"), ("honaker", "gaussian")]


def _blocks(mech, streams: int, steps: int, seed: int = 3):
    """Per step: clipped sums ``(streams, d)`` and counts, with some empty (stream, step) cells."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        n = rng.integers(0, 4, streams)
        rows = rng.normal(0, 2.0, (int(n.sum()), mech.dim))
        sums, counts, clipped = mech.clip_and_sum_groups(rows, np.repeat(np.arange(streams), n), streams)
        yield sums, counts, clipped


@pytest.mark.parametrize("counter,noise", GROUPED, ids=[f"{c}-{n}" for c, n in GROUPED])
def test_group_step_equals_per_stream_steps(counter, noise):
    mech = build(counter, noise, horizon=64, dim=3, clip_bound=1.5)
    assert isinstance(mech, GroupSteppedSum)
    source = NoiseSource(KEY)
    streams = [f"user-{i}" for i in range(9)]  # > 4 cells: the array Philox path, not numpy's
    group, states = mech.init_group(streams), [mech.init_state(s) for s in streams]
    for t, (sums, counts, clipped) in enumerate(_blocks(mech, 9, 40), start=1):
        group, batch = mech.step_group(group, sums, counts, source)
        assert batch.step == t and batch.streams == tuple(streams) and batch.values.shape == (9, 3)
        for i, row in enumerate(batch.rows()):
            states[i], (single,) = mech.step(states[i], ClippedSum(sums[i], int(counts[i]), int(clipped[i])), source)
            # the same noise cells and the same elementwise arithmetic; BLAS may round matrix products
            # differently for other batch shapes, so values are compared to float tolerance
            assert_release_matches(row, single)
    for state, back in zip(states, mech.unstack(group)):
        assert state.t == back.t == 40
        assert mech.decode_state(mech.encode_state(back)).stream == state.stream


@pytest.mark.parametrize("counter,noise", GROUPED[:3], ids=[f"{c}-{n}" for c, n in GROUPED[:3]])
def test_group_zero_noise_is_exact_and_half_noise_is_honoured(counter, noise):
    mech = build(counter, noise, horizon=16, dim=2, clip_bound=1.0)
    streams = ["a", "b", "c", "d", "e", "f"]
    zero, half, full = (mech.init_group(streams) for _ in range(3))
    total = np.zeros((6, 2))
    for sums, counts, _ in _blocks(mech, 6, 16, seed=5):
        total += sums
        zero, exact = mech.step_group(zero, sums, counts, ZeroNoise())
        np.testing.assert_allclose(exact.values, total, atol=1e-9)
        half, halved = mech.step_group(half, sums, counts, HalfNoise(KEY))
        full, noisy = mech.step_group(full, sums, counts, NoiseSource(KEY))
    # a test double that halves each cell's draw is applied cell by cell in a batch (linear mechanisms)
    np.testing.assert_allclose(halved.values - total, 0.5 * (noisy.values - total), rtol=1e-9, atol=1e-9)


def test_group_refuses_bad_input():
    mech = build("blt", "gaussian", horizon=8, dim=2, clip_bound=1.0)
    group = mech.init_group(["a", "b"])
    source = NoiseSource(KEY)
    with pytest.raises(ValueError, match="count × clip_bound"):
        mech.step_group(group, np.array([[3.0, 0.0], [0.0, 0.0]]), np.array([1, 0]), source)
    with pytest.raises(ValueError, match="finite"):
        mech.step_group(group, np.array([[np.nan, 0.0], [0.0, 0.0]]), np.array([1, 0]), source)
    with pytest.raises(ValueError, match="expected sums"):
        mech.step_group(group, np.zeros((3, 2)), np.zeros(3), source)
    with pytest.raises(ValueError, match="distinct"):
        mech.init_group(["a", "a"])
    a, b = mech.init_state("a"), mech.init_state("b")
    a, _ = mech.step(a, None, source)
    with pytest.raises(ValueError, match="same step"):
        mech.stack([a, b])
    for _ in range(8):
        group, _ = mech.step_group(group, np.zeros((2, 2)), np.zeros(2), source)
    with pytest.raises(ValueError, match="horizon"):
        mech.step_group(group, np.zeros((2, 2)), np.zeros(2), source)
