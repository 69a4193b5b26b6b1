"""Square-root Toeplitz noise spans computed incrementally (issue 26.4): the same noise as the direct
convolution of the keyed draws, the same floats however the work was paced, and each span ready before
its first step (no step pays for a whole span)."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.toeplitz import SPAN_STEPS, _SpanJob

H, D, STREAMS = 12_000, 2, ("a", "b")  # spans [0, 4096), [4096, 8192), [8192, 12000)


def _mech():
    return make_counter("toeplitz", noise="gaussian", horizon=H, dim=D, epsilon=1.0, delta=1e-6, clip_bound=1.0)


@pytest.fixture(scope="module")
def stepped():
    """``Σ_{j<t} c_j z_{t−j}`` at every t = 1..H, asked step by step (the paced path), and the work left on the
    span [8192, 12000) after the last step before it."""
    mech, noise = _mech(), NoiseSource(bytes(range(32)))
    rows, left = [], None
    for t in range(1, H + 1):
        rows.append(mech._span_noise(noise, STREAMS, t))
        if t == 2 * SPAN_STEPS:
            left = mech._cache[noise][(STREAMS, 2 * SPAN_STEPS, 1)].remaining
    return mech, noise, np.stack(rows, axis=1), left


def test_span_noise_is_the_convolution_of_the_keyed_draws(stepped):
    mech, noise, got, _ = stepped
    z, c = mech.noise_history(noise, STREAMS, H), mech.c_coeffs(H)
    want = np.stack([np.stack([np.convolve(z[i, :, j], c)[:H] for j in range(D)], axis=1) for i in range(len(STREAMS))])
    # FFT round-off: each output is a sum of <= H products of O(σ) terms; relative error ~ 1e-16 · log2(FFT length)
    # per pass, far below 1e-9 of the largest value (a wrong coefficient or a shifted block is O(σ) off)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("t", [1, SPAN_STEPS + 1, 9000, H])
def test_a_fresh_worker_computes_the_same_floats(stepped, t):
    mech, noise, got, _ = stepped
    fresh = _mech()  # a new cache: the span holding t is computed at once, not paced
    # exact: the same units run in the same order whatever the pacing, so the floats are the same by construction
    np.testing.assert_array_equal(fresh._span_noise(noise, STREAMS, t), got[:, t - 1])


def test_the_next_span_is_ready_before_its_first_step(stepped):
    assert stepped[3] == 0  # the span [8192, 12000): all its work done during the steps of [4096, 8192)


@pytest.mark.parametrize("lo, hi, span", [(0, 4096, 4096), (4096, 8192, 4096), (8192, 12000, 8192)])
def test_the_unit_count_paces_all_the_work(lo, hi, span):
    job = _SpanJob(_mech(), NoiseSource(bytes(32)), STREAMS, lo, hi, span)
    assert job.remaining == sum(1 for _ in job._units)
