"""Pure mechanisms: the papers' algorithms as state machines over numpy. No Beam imports."""

from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism, Mechanism, NodeNoise
from beam_dp.mechanisms.online import WDPCOCOL, WDPCOCOP, OnlineLoss
from beam_dp.mechanisms.regression import PrivIncERM, PrivIncReg1, PrivIncReg2
from beam_dp.mechanisms.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum, make_tree_sum
from beam_dp.mechanisms.window_tree import WindowTreeSum

__all__ = [
    "BinaryTreeSum",
    "ClippedSum",
    "ContinualSumMechanism",
    "DoublingTreeSum",
    "HybridTreeSum",
    "Mechanism",
    "NodeNoise",
    "OnlineLoss",
    "PrivIncERM",
    "PrivIncReg1",
    "PrivIncReg2",
    "WDPCOCOL",
    "WDPCOCOP",
    "WindowTreeSum",
    "make_tree_sum",
]
