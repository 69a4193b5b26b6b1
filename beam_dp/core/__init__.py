"""Engine-independent core of beam_dp. Imports numpy and scipy only, never Apache Beam.

Exports are loaded on first use (``beam_dp.lazy``): importing the package imports none of its modules.
"""

from beam_dp.lazy import lazy_exports

_EXPORTS = {
    "Charge": "beam_dp.core.guarantee",
    "ElementLoss": "beam_dp.core.guarantee",
    "Guarantee": "beam_dp.core.guarantee",
    "PrivacyLedger": "beam_dp.core.guarantee",
    "require_within_budget": "beam_dp.core.guarantee",
    "NoiseSource": "beam_dp.core.noise",
    "Release": "beam_dp.core.release",
    "StepClock": "beam_dp.core.clock",
    "analytic_gaussian_delta": "beam_dp.core.calibration",
    "analytic_gaussian_epsilon": "beam_dp.core.calibration",
    "analytic_gaussian_sigma": "beam_dp.core.calibration",
    "certify_gaussian": "beam_dp.core.calibration",
    "sigma_tree_004": "beam_dp.core.calibration",
    "sigma_window_002": "beam_dp.core.calibration",
    "clip_box": "beam_dp.core.clipping",
    "clip_l1": "beam_dp.core.clipping",
    "clip_l2": "beam_dp.core.clipping",
    "decode_state": "beam_dp.core.state",
    "encode_state": "beam_dp.core.state",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
