"""``ZeroNoise``: the test-only switch that disables noise, to check exactness of mechanisms."""

from __future__ import annotations

import numpy as np

from beam_dp.core.noise import NoiseSource


class ZeroNoise(NoiseSource):
    """TEST ONLY. Every sampler returns zeros, so releases equal the clean prefix sums.

    Releases made with it are not private. The Beam adapter never builds one.
    """

    def __init__(self) -> None:
        super().__init__(b"\x00" * 32)

    def __repr__(self) -> str:
        return "ZeroNoise(<test only: no noise>)"

    def laplace(self, stream, purpose, index, scale, size):
        return np.zeros(size)

    def gaussian(self, stream, purpose, index, sigma, size):
        return np.zeros(size)

    def k_norm(self, stream, purpose, index, scale, dim):
        return np.zeros(dim)

    def discrete_laplace(self, stream, purpose, index, scale, size):
        return np.zeros(size, dtype=np.int64)

    def discrete_gaussian(self, stream, purpose, index, sigma, size):
        return np.zeros(size, dtype=np.int64)
