"""Test-only helpers. Nothing here may be used to produce real releases."""

from beam_dp.testing.noise import ZeroNoise

__all__ = ["ZeroNoise"]
