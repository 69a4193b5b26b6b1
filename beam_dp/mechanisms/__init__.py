"""Pure mechanisms: the papers' algorithms as state machines over numpy. No Beam imports.

Exports are loaded on first use (``beam_dp.lazy``): importing the package imports none of its modules.
"""

from beam_dp.lazy import lazy_exports

_EXPORTS = {
    "BinaryTreeSum": "beam_dp.mechanisms.sums.tree",
    "DoublingTreeSum": "beam_dp.mechanisms.sums.tree",
    "HybridTreeSum": "beam_dp.mechanisms.sums.tree",
    "make_tree_sum": "beam_dp.mechanisms.sums.tree",
    "ClippedSum": "beam_dp.mechanisms.base",
    "ContinualSumMechanism": "beam_dp.mechanisms.base",
    "Mechanism": "beam_dp.mechanisms.base",
    "NodeNoise": "beam_dp.mechanisms.base",
    "SumSpec": "beam_dp.mechanisms.base",
    "OnlineLoss": "beam_dp.mechanisms.online.learners",
    "WDPCOCOL": "beam_dp.mechanisms.online.learners",
    "WDPCOCOP": "beam_dp.mechanisms.online.learners",
    "PrivIncERM": "beam_dp.mechanisms.online.regression",
    "PrivIncReg1": "beam_dp.mechanisms.online.regression",
    "PrivIncReg2": "beam_dp.mechanisms.online.regression",
    "WindowTreeSum": "beam_dp.mechanisms.sums.window_tree",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
