"""Shared fixtures of the counter tests: the counters under test and a half-noise negative control."""

from __future__ import annotations

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.base import GroupSteppedSum
from beam_dp.mechanisms.sums import make_counter

KEY = bytes(range(32))
GAUSS = dict(epsilon=1.0, delta=1e-6)
PURE = dict(epsilon=1.0)

# (counter, noise law): every counter of the package under each law it supports
CASES = [
    ("honaker", "gaussian"),
    ("honaker", "gamma"),
    ("toeplitz", "gaussian"),
    ("blt", "gaussian"),
    ("kary", "gamma"),
]


def build(counter: str, noise: str, horizon: int | None = 64, dim: int = 1, clip_bound: float = 1.0, **extra):
    privacy = GAUSS if noise == "gaussian" else PURE
    return make_counter(counter, horizon=horizon, noise=noise, dim=dim, clip_bound=clip_bound, **privacy, **extra)


class HalfNoise(NoiseSource):
    """NEGATIVE CONTROL: every draw of the real keyed sampler, halved (a mis-calibrated mechanism)."""

    def gaussian(self, stream, purpose, index, sigma, size):
        return 0.5 * super().gaussian(stream, purpose, index, sigma, size)

    def k_norm(self, stream, purpose, index, scale, dim):
        return 0.5 * super().k_norm(stream, purpose, index, scale, dim)


def run_errors(mechanism, noise: NoiseSource, runs: int, steps: int) -> np.ndarray:
    """Errors ``(runs, steps)`` of coordinate 0 on zero data; runs use distinct streams, hence
    independent noise."""
    out = np.empty((runs, steps))
    if isinstance(mechanism, GroupSteppedSum):  # all runs as one group: the same noise cells, one array step
        group = mechanism.init_group([f"run-{r}" for r in range(runs)])
        for t in range(steps):
            group, batch = mechanism.step_group(group, np.zeros((runs, mechanism.dim)), np.zeros(runs), noise)
            out[:, t] = batch.values[:, 0]
        return out
    for r in range(runs):
        state = mechanism.init_state(f"run-{r}")
        for t in range(steps):
            state, (release,) = mechanism.step(state, None, noise)
            out[r, t] = release.value[0]
    return out
