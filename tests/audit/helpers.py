"""Audit drivers shared by the mechanism audits (on top of ``beam_dp.testing.audit``).

Neighbours: one contribution changed from ``-R`` to ``+R`` at ``changed_step`` (the worst case of
replace-one under an L2 bound R: the step vector moves by Δ₂ = 2R); every other step is empty, which
does not matter for these linear mechanisms. The statistic is ``w · (s − m_D)`` with
``w = Σ⁺(m_D' − m_D)`` (``linear_statistic_weights``): noise-free means from ``ZeroNoise`` runs,
``Σ`` from separate noisy runs (a different salt), so the audited samples never tune the statistic.

Two samplers:

* ``per_run_samples`` — ``runs`` independent runs per neighbour, any noise law: one group step of
  ``runs`` streams (each stream its own noise cells) where the mechanism steps groups, else one run
  per key;
* ``coordinate_samples`` — for noise that is i.i.d. across coordinates (Gaussian): ONE run in
  ``dim = n`` dimensions where coordinate i carries its own 1-D neighbouring pair (a block of n
  contributions ``±R·e_i``), so each coordinate is an independent sample of the 1-D experiment.
  Valid because σ depends on R and the privacy parameters only (checked by ``same_calibration``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from beam_dp.mechanisms.base import ClippedSum, GroupSteppedSum
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import ScaledNoise, linear_statistic_weights, release_matrix, run_stream, seeded_key

R = 0.5


def _blocks(steps: int, changed_step: int, value: np.ndarray, count: int = 1) -> list:
    return [ClippedSum(value, count, 0) if t == changed_step else None for t in range(1, steps + 1)]


def per_run_samples(make: Callable[[], object], steps: int, changed_step: int, runs: int,
                    releases: slice = slice(None)) -> Callable[[float], tuple[np.ndarray, np.ndarray]]:
    """``sample(factor)`` for ``audit_with_mutant``: dim-1 runs, one fresh key per run."""
    mech = make()
    d = _blocks(steps, changed_step, np.array([-R]))
    dp = _blocks(steps, changed_step, np.array([R]))

    m_d = release_matrix(run_stream(mech, d, ZeroNoise()))[releases, 0]
    m_dp = release_matrix(run_stream(mech, dp, ZeroNoise()))[releases, 0]

    def matrix(blocks, n, salt, factor):
        """``(n, releases)``: n independent runs of ``blocks`` (dim 1)."""
        if isinstance(mech, GroupSteppedSum):
            return _group_runs(mech, blocks, n, ScaledNoise(seeded_key(0, salt), factor))[:, releases]
        return np.stack([release_matrix(run_stream(mech, blocks, ScaledNoise(seeded_key(s, salt), factor)))[releases, 0]
                         for s in range(n)])

    def sample(factor: float):
        w = linear_statistic_weights(m_d, m_dp, matrix(d, max(runs // 4, 500), b"cov", factor) - m_d)
        x = (matrix(d, runs, b"D", factor) - m_d) @ w
        y = (matrix(dp, runs, b"D'", factor) - m_d) @ w
        return x, y

    return sample


def _group_runs(mech: GroupSteppedSum, blocks: list, n: int, noise) -> np.ndarray:
    """``(n, steps)``: the releases of n streams stepped as one group, each fed ``blocks`` (dim 1)."""
    group, columns = mech.init_group([f"run-{i}" for i in range(n)]), []
    for block in blocks:
        sums, counts = np.zeros((n, 1)), np.zeros(n, dtype=np.int64)
        if block is not None:
            sums[:] = block.vector
            counts[:] = block.count
        group, batch = mech.step_group(group, sums, counts, noise)
        columns.append(batch.values[:, 0])
    return np.stack(columns, axis=1)


def coordinate_samples(make: Callable[[int], object], steps: int, changed_step: int, n: int,
                       releases: slice = slice(None)) -> Callable[[float], tuple[np.ndarray, np.ndarray]]:
    """``sample(factor)``: n independent 1-D experiments as the coordinates of one n-dim run."""
    mech = make(n)
    d = _blocks(steps, changed_step, np.full(n, -R), n)  # n contributions -R·e_i: norm R·sqrt(n) <= n·R
    dp = _blocks(steps, changed_step, np.full(n, R), n)
    small = make(1)
    m_d = release_matrix(run_stream(small, _blocks(steps, changed_step, np.array([-R])), ZeroNoise()))[releases, 0]
    m_dp = release_matrix(run_stream(small, _blocks(steps, changed_step, np.array([R])), ZeroNoise()))[releases, 0]

    def sample(factor: float):
        def noisy(blocks, salt, mech_=mech):
            return release_matrix(run_stream(mech_, blocks, ScaledNoise(seeded_key(0, salt), factor)))[releases]

        cov_mech = make(20_000)
        zero = _blocks(steps, changed_step, np.zeros(20_000), 20_000)
        w = linear_statistic_weights(m_d, m_dp, noisy(zero, b"cov", cov_mech).T)
        x = w @ (noisy(d, b"D") - m_d[:, None])
        y = w @ (noisy(dp, b"D'") - m_d[:, None])
        return x, y

    return sample


def same_calibration(make: Callable[[int], object], n: int) -> bool:
    """The coordinate trick is valid only if the noise law does not depend on the dimension."""
    one, many = make(1), make(n)
    return one.guarantee == many.guarantee and all(
        np.isclose(one.noise_var(t), many.noise_var(t)) for t in (1, 2, 3, 5, 8))
