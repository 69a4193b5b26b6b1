"""Pure mechanisms: the papers' algorithms as state machines over numpy. No Beam imports."""

from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism, Mechanism, NodeNoise

__all__ = ["ClippedSum", "ContinualSumMechanism", "Mechanism", "NodeNoise"]
