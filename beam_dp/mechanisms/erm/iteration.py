"""What the certified solver's two backends share (:mod:`.solver` on numpy, :mod:`.solver_torch` on
torch): the result of a training call and the accelerated iteration's constants."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from beam_dp.mechanisms.erm.models import LinearModel

__all__ = ["SolveResult", "momentum"]


@dataclass(frozen=True)
class SolveResult:
    """A trained (not yet private) point and its certificate: ``grad_norm = ‖∇F(w)‖₂``."""

    w: np.ndarray
    grad_norm: float
    target: float
    iterations: int
    certified: bool
    backend: str


def momentum(model: LinearModel, lam: float) -> tuple[float, float]:
    """Nesterov's step ``1/β_F`` and momentum ``θ = (√κ−1)/(√κ+1)`` for F of smoothness
    ``β_F = β + 2λ`` and strong convexity ``2λ`` (``κ = β_F/(2λ)``)."""
    beta_f = model.smoothness + 2.0 * lam
    kappa = beta_f / (2.0 * lam)
    return 1.0 / beta_f, (math.sqrt(kappa) - 1.0) / (math.sqrt(kappa) + 1.0)
