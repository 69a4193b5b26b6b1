"""The learner of a lifelong config: :func:`build_learner`. The learners import torch, so they are imported
here on the first build: a pipeline graph holding a config does not need torch until a worker builds the
learner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_dp.mechanisms.lifelong.config import (
    AGEMConfig,
    BoundedAGEMConfig,
    L2DPConfig,
    LifelongConfig,
    NaiveGaussianConfig,
)

if TYPE_CHECKING:
    from beam_dp.mechanisms.lifelong.learner import Learner

__all__ = ["build_learner"]


def build_learner(config: LifelongConfig) -> Learner:
    """The learner ``config`` configures (``TypeError`` for a config of no learner)."""
    from beam_dp.mechanisms.lifelong.dpsgd import BoundedDPAGEM, NaiveGaussian, NonPrivateAGEM
    from beam_dp.mechanisms.lifelong.l2dp import L2DPML

    learners: dict[type, type[Learner]] = {L2DPConfig: L2DPML, NaiveGaussianConfig: NaiveGaussian,
                                           BoundedAGEMConfig: BoundedDPAGEM, AGEMConfig: NonPrivateAGEM}
    for cls in type(config).__mro__:
        if cls in learners:
            return learners[cls](config)
    raise TypeError(f"no lifelong learner is configured by a {type(config).__name__}")
