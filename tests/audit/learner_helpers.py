"""Audit drivers for the online learners and incremental regressions (``test_audit_learners.py``).

A driver is ``runs(neighbour, n, noise_of) -> np.ndarray``: n independent runs of the real mechanism
on D (``neighbour=False``) or D' (``True``), one row of audited releases (flattened) per run; run ``i``
draws from ``noise_of(i)``. :func:`per_run` makes one from a single run through ``init_state``/``step``
(one key per run); :func:`regression_group_runs` steps the n runs as one group of n streams
(``init_group``/``step_group``, each stream its own noise cells, so one key serves them all).
:func:`llr_samples` turns a driver into ``sample(factor)`` for ``audit_with_mutant``: noise-free
means from ``ZeroNoise`` runs, ``Σ`` from separate noisy runs (salt ``cov``), and the log-likelihood
ratio of releases that are linear in Gaussian (``w · (s − m_D)``, ``w = Σ⁺(m_D' − m_D)``) or Laplace
node noise. The audited configurations keep the releases (near-)linear in the noise: projections
stay inactive.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.online.learners import OnlineLoss, OnlineRecord
from beam_dp.mechanisms.online.regression import RegressionBlock
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import ScaledNoise, linear_statistic_weights, seeded_key

Run = Callable[[bool, NoiseSource], np.ndarray]
Runs = Callable[[bool, int, Callable[[int], NoiseSource]], np.ndarray]

# Online learners: L = μ = 1 on the box [−1/2, 1/2] (D = 1), so μD = L and the tree's
# Δ₂ = max(2L, L + μD) = 2L is attained by two gradients ±L.
L = 1.0
BOX = {"kind": "box", "lower": -0.5, "upper": 0.5}


def constant_gradient_loss() -> OnlineLoss:
    """Custom loss with ``∇f(x; a, b) = a``: the record *is* its gradient, so a neighbour pair can put
    ``−L`` and ``+L`` into the tree (privacy never relies on the declared μ/L, only on the clip)."""
    return OnlineLoss(kind="custom", mu=1.0, lipschitz=L, gradient=lambda x, a, b: np.array(a, dtype=np.float64))


def per_run(run: Run) -> Runs:
    """The driver of ``run``: n runs one after another, run ``i`` on ``noise_of(i)``."""
    return lambda neighbour, n, noise_of: np.stack([run(neighbour, noise_of(i)) for i in range(n)])


def llr_samples(driver: Runs, runs: int, law: str = "gaussian",
                cov_runs: int = 1000) -> Callable[[float], tuple[np.ndarray, np.ndarray]]:
    """``sample(factor)``: ``runs`` statistics per neighbour, a fresh ``ScaledNoise`` key per run.

    ``law="gaussian"``: the harness's ``w · (s − m_D)``, ``w = Σ⁺Δm``. ``law="laplace"``: the releases
    are a causal (lower-triangular) linear map of independent Laplace node noises, so whitening by the
    Cholesky factor of ``Σ`` recovers those noises up to scale, ``u``; the statistic is their summed
    Laplace log-likelihood ratio ``Σ_i |u_i| − |u_i − Δu_i|`` (exact up to one common factor).
    """
    m_d, m_dp = (driver(neighbour, 1, lambda i: ZeroNoise())[0] for neighbour in (False, True))

    def sample(factor: float) -> tuple[np.ndarray, np.ndarray]:
        def noisy(neighbour: bool, n: int, salt: bytes) -> np.ndarray:
            return driver(neighbour, n, lambda i: ScaledNoise(seeded_key(i, salt), factor)) - m_d

        cov_rows = noisy(False, cov_runs, b"cov")
        if law == "laplace":
            chol = np.linalg.cholesky(np.atleast_2d(np.cov(cov_rows, rowvar=False)))
            du = np.linalg.solve(chol, m_dp - m_d)

            def statistic(v: np.ndarray) -> float:
                u = np.linalg.solve(chol, v)
                return float(np.sum(np.abs(u) - np.abs(u - du)))
        else:
            w = linear_statistic_weights(m_d, m_dp, cov_rows)

            def statistic(v: np.ndarray) -> float:
                return float(w @ v)

        # row by row: the Laplace statistic has atoms, whose ties a batched solve would round differently
        return tuple(np.array([statistic(v) for v in noisy(neighbour, runs, salt)])
                     for neighbour, salt in ((False, b"D"), (True, b"D'")))

    return sample


def online_run(mech, changed_step: int) -> Run:
    """WDP-COCOP/COCOL: the record at ``changed_step`` is ``a = −L`` (D) or ``+L`` (D'); every other
    record has gradient 0. Returns the ``B`` releases made while it is protected (steps
    ``changed_step .. changed_step + B − 1``).

    The ``changed_step − 1`` earlier steps are one fixed prefix (its own key), run once and forked
    (stepping a state twice is supported). Its releases do not depend on the changed record, so window
    DP must hold conditionally on it; it only makes ``t`` large, so that the FTAL point
    ``(S_t − ĝ_t/μ)/t`` stays inside the box (noise/(μt) ≪ D) and the releases are linear in ĝ.
    ``changed_step`` should start a block (``≡ 1 mod B``) so the audited releases isolate its nodes.
    """
    zero = OnlineRecord(np.zeros(mech.dim), 0.0)
    state = mech.init_state("audit")
    prefix_noise = NoiseSource(seeded_key(0, b"prefix"))
    for _ in range(changed_step - 1):
        state, _ = mech.step(state, zero, prefix_noise)
    first = {False: OnlineRecord(np.full(mech.dim, -L), 0.0), True: OnlineRecord(np.full(mech.dim, L), 0.0)}

    def run(neighbour: bool, noise: NoiseSource) -> np.ndarray:
        s, out = state, []
        for k in range(mech.tree.block):
            s, (release,) = mech.step(s, first[neighbour] if k == 0 else zero, noise)
            out.append(release.value["x"])
        return np.concatenate(out)

    return run


def regression_run(mech, steps: int, x: np.ndarray, padding: int = 0) -> Run:
    """Incremental regression: step 1 holds the record ``(x, −1)`` (D) or ``(x, +1)`` (D') plus
    ``padding`` records ``(0, 0)`` (zero gradient; they only shrink PRIVINCERM's step size); steps
    ``2..steps`` are empty. Returns every release ``θ_1..θ_steps``."""
    X = np.vstack([x[None, :], np.zeros((padding, x.size))])

    def run(neighbour: bool, noise: NoiseSource) -> np.ndarray:
        y = np.zeros(padding + 1)
        y[0] = 1.0 if neighbour else -1.0
        releases = mech.run("audit", [RegressionBlock(X, y)] + [None] * (steps - 1), noise)
        return np.concatenate([r.value["theta"] for r in releases])

    return run


def regression_group_runs(mech, steps: int, x: np.ndarray) -> Runs:
    """:func:`regression_run` (no padding) for a mechanism that steps groups of streams: the n runs are
    the streams of one group, each fed its own record at step 1; one key (``noise_of(0)``) for them all."""
    empty = (np.zeros((0, x.size)), np.zeros(0), np.zeros(0, dtype=np.intp))

    def runs(neighbour: bool, n: int, noise_of: Callable[[int], NoiseSource]) -> np.ndarray:
        group, noise, out = mech.init_group([f"run-{i}" for i in range(n)]), noise_of(0), []
        first = (np.tile(x, (n, 1)), np.full(n, 1.0 if neighbour else -1.0), np.arange(n))
        for t in range(steps):
            group, batch = mech.step_group(group, *(first if t == 0 else empty), noise)
            if batch is not None:
                out.append(batch.values)
        return np.concatenate(out, axis=1)

    return runs
