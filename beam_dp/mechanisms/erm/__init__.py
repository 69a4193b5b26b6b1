"""Continual and sliding-window private model release (Watson et al., "Continual and Sliding Window Release for Private Empirical Risk Minimization").

Pure state machines over numpy (no Beam): models with data-independent Lipschitz constants, the
certified solver, output perturbation with K-norm (pure ε) or Gaussian ((ε, δ)) noise, and the
mechanisms of Algorithms 1–8. Releases are ``Release``s whose value is
``{"weights": (C, f), "intercepts": (C,)}`` and whose meta logs every training call; their spend is
re-derived from that log by :mod:`beam_dp.core.accounting.erm_log`.
"""

from beam_dp.mechanisms.erm.base import ERMMechanism, LabelledRows, call_sensitivity, sampling_probability
from beam_dp.mechanisms.erm.continual import ContinualReleaseMechanism
from beam_dp.mechanisms.erm.models import HuberRegression, LinearModel, SoftmaxRegression
from beam_dp.mechanisms.erm.multires import MultiResolutionMechanism
from beam_dp.mechanisms.erm.sliding import SlidingWindowMechanism
from beam_dp.mechanisms.erm.solver import CertificateError, SGDConfig, certified_slack, certified_solve, sgd_solve

__all__ = [
    "CertificateError",
    "ContinualReleaseMechanism",
    "ERMMechanism",
    "HuberRegression",
    "LabelledRows",
    "LinearModel",
    "MultiResolutionMechanism",
    "SGDConfig",
    "SlidingWindowMechanism",
    "SoftmaxRegression",
    "call_sensitivity",
    "certified_slack",
    "certified_solve",
    "sampling_probability",
    "sgd_solve",
]
