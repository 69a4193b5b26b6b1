"""Small helpers of the ERM tests: a tiny model, random blocks, running a mechanism."""

from __future__ import annotations

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.erm import LabelledRows, SoftmaxRegression
from beam_dp.testing import ZeroNoise
from tests.conftest import TEST_KEY

TINY = SoftmaxRegression(n_features=1, clip_bound=1.0, n_classes=2)  # d = 4


def blocks(n_blocks: int, size: int, n_features: int = 1, n_classes: int = 2, seed: int = 0) -> list[LabelledRows]:
    rng = np.random.default_rng(seed)
    return [LabelledRows(rng.normal(size=(size, n_features)), rng.integers(0, n_classes, size)) for _ in range(n_blocks)]


def run(mechanism, data: list[LabelledRows], noise=None, stream: str = "s") -> list[list]:
    """Releases per step."""
    noise = noise if noise is not None else ZeroNoise()
    state = mechanism.init_state(stream)
    out = []
    for block in data:
        state, releases = mechanism.step(state, block, noise)
        out.append(releases)
    return out


def test_noise() -> NoiseSource:
    return NoiseSource(TEST_KEY)


test_noise.__test__ = False
