"""Lifelong (continual) learning with differential privacy: L2DP-ML and DP-SGD + A-GEM learners.

The only part of beam_dp that imports torch. The configs, the accounting and the metrics are
torch-free; the learners (``L2DPML``, ``NaiveGaussian``, ``BoundedDPAGEM``, ``NonPrivateAGEM``) are
imported on first use, so ``import beam_dp.mechanisms.lifelong`` works without torch.
"""

from beam_dp.mechanisms.lifelong.config import (
    AGEMConfig,
    BoundedAGEMConfig,
    L2DPConfig,
    LifelongConfig,
    NaiveGaussianConfig,
    TaskData,
)
from beam_dp.mechanisms.lifelong.metrics import average_accuracy, average_forgetting, curve_p_value, forgetting

_LAZY = {
    "L2DPML": "beam_dp.mechanisms.lifelong.l2dp",
    "NaiveGaussian": "beam_dp.mechanisms.lifelong.dpsgd",
    "BoundedDPAGEM": "beam_dp.mechanisms.lifelong.dpsgd",
    "NonPrivateAGEM": "beam_dp.mechanisms.lifelong.dpsgd",
    "LifelongState": "beam_dp.mechanisms.lifelong.learner",
    "TaskOrderError": "beam_dp.mechanisms.lifelong.learner",
    "resolve_device": "beam_dp.mechanisms.torch_device",
    "set_threads": "beam_dp.mechanisms.torch_device",
    "Learner": "beam_dp.mechanisms.lifelong.learner",
    "build_learner": "beam_dp.mechanisms.lifelong.factory",
}

__all__ = [
    "AGEMConfig",
    "BoundedAGEMConfig",
    "L2DPConfig",
    "LifelongConfig",
    "NaiveGaussianConfig",
    "TaskData",
    "average_accuracy",
    "average_forgetting",
    "curve_p_value",
    "forgetting",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
