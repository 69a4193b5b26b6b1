"""Engine-independent core of beam_dp. Imports numpy and scipy only, never Apache Beam."""

from beam_dp.core.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    certify_gaussian,
    sigma_tree_004,
    sigma_window_002,
)
from beam_dp.core.clipping import clip_box, clip_l1, clip_l2
from beam_dp.core.clock import StepClock
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, PrivacyLedger, require_within_budget
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.state import decode_state, encode_state

__all__ = [
    "Charge",
    "ElementLoss",
    "Guarantee",
    "NoiseSource",
    "PrivacyLedger",
    "Release",
    "StepClock",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "certify_gaussian",
    "clip_box",
    "clip_l1",
    "clip_l2",
    "decode_state",
    "encode_state",
    "require_within_budget",
    "sigma_tree_004",
    "sigma_window_002",
]
