"""Shared setups of the online-learning tests (checks 4–6, 8)."""

from __future__ import annotations

import numpy as np

from beam_dp.mechanisms.online.learners import OnlineLoss


def quadratic_loss(mu: float = 1.0, lipschitz: float = 2.4) -> OnlineLoss:
    """f_t(x) = (μ/2)‖x − z_t‖² as a custom loss; record a = z_t (no feature clipping)."""
    return OnlineLoss(kind="custom", mu=mu, lipschitz=lipschitz, gradient=lambda x, a, b: mu * (x - a),
                      value=lambda x, a, b: 0.5 * mu * float((x - a) @ (x - a)))


def ball_points(T: int, d: int, seed: int) -> np.ndarray:
    """z_t = (0.9, 0, ..., 0) + a uniform point of the ball of radius 0.5."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((T, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    z = u * (0.5 * rng.random(T) ** (1.0 / d))[:, None]
    z[:, 0] += 0.9
    return z


def played_points(mechanism, releases) -> np.ndarray:
    """x̂_1..x̂_T: the public start, then each release's next point (the last release is unused)."""
    return np.vstack([mechanism.x1] + [r.value["x"] for r in releases[:-1]])


def quadratic_regret(mechanism, releases, z: np.ndarray, mu: float, horizons) -> np.ndarray:
    """Regret(T) for each T in ``horizons``: the comparator is Π_C(mean z_{1..T})."""
    X = played_points(mechanism, releases)
    cum = np.cumsum(0.5 * mu * ((X - z) ** 2).sum(axis=1))
    out = []
    for T in horizons:
        best = mechanism.constraint.project(z[:T].mean(axis=0))
        out.append(cum[T - 1] - 0.5 * mu * ((best - z[:T]) ** 2).sum())
    return np.array(out)
