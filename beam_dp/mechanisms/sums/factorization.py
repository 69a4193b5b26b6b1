"""Shared base of the Gaussian Toeplitz matrix-factorization counters (square root, BLT).

Prefix sums are ``A x`` with ``A`` the lower-triangular all-ones matrix. A factorization ``A = B C``
with ``C`` lower-triangular Toeplitz (coefficients ``c_0 = 1, c_1, ...``) releases
``B(Cx + z) = Ax + Bz`` with ``z_r ~ N(0, σ² I_d)`` i.i.d. per step; ``B = A C^{-1}`` is lower-triangular
Toeplitz too, with coefficients ``b_j = Σ_{i<=j} ĉ_i`` (``ĉ`` those of ``C^{-1}``).

Privacy (replace-one, ``Δ₂ = 2R``). The releases ``1..t`` are a bijective post-processing of
``(Cx + z)_{1..t}``. Moving one contribution (value and step may change) moves that vector by at most
``R(‖c_s‖ + ‖c_s'‖) <= Δ₂ · max_s ‖C_{1..t, s}‖``, the largest column norm, which for a Toeplitz ``C`` is
the first column's: ``‖C_{1..t, 1}‖² = Σ_{j<t} c_j²``. So the mechanism is one Gaussian mechanism with
``mu_t² = Δ₂² Σ_{j<t} c_j² / σ²``; ``σ`` is calibrated with the exact analytic Gaussian at ``(ε, δ)``
on the sensitivity over the horizon (or over all steps, when that sum converges). Per-element
ledger: at step ``t`` an element of step ``s <= t`` is charged ``mu² = (Δ₂ c_{t−s}/σ)²`` (``t`` charges,
exact; their Gaussian composition is the column-norm loss above).

Error: ``noise_var(t) = σ² Σ_{j<t} b_j²`` per coordinate, exactly (increasing in ``t``).
"""

from __future__ import annotations

import abc
import itertools
import math
from typing import Any, Generator

import numpy as np

from beam_dp.core.calibration import analytic_gaussian_sigma, certify_gaussian
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, require_within_budget, spends_paced
from beam_dp.core.limits import check_count
from beam_dp.core.paced import Paced, run_to_end
from beam_dp.mechanisms.base import GroupState, GroupSteppedSum, SumSpec
from beam_dp.mechanisms.sums.tree import MAX_STEP, _check_purpose, _check_step_number

__all__ = ["ToeplitzFactorizationSum"]

_FACTS_CHUNK = 256  # steps whose facts (noise std, worst loss, epsilon_spent) are computed together
_FACTS_PER_UNIT = 4  # steps' closed forms per unit of paced work (~5-10 µs each)
_MEMO_STEPS = 4096  # steps whose facts stay memoised
_AHEAD_JOBS = 4  # paced chunks kept at once (groups at different steps)


def _chunk_of(t: int) -> tuple[int, int]:
    """The steps ``[first, last]`` whose facts are computed with step ``t``'s: ``[2^k, 2^(k+1))`` for
    ``t < _FACTS_CHUNK`` (so a short job computes at most twice its steps), then aligned blocks of
    ``_FACTS_CHUNK``. A function of ``t`` only, so every run computes each step's facts the same way."""
    if t < _FACTS_CHUNK:
        first = 1 << (t.bit_length() - 1)
        return first, 2 * first - 1
    first = t // _FACTS_CHUNK * _FACTS_CHUNK
    return first, first + _FACTS_CHUNK - 1


class ToeplitzFactorizationSum(GroupSteppedSum):
    """Base class: Gaussian noise through a Toeplitz factorization (see the module docstring).

    Subclasses give the coefficient sums (``col_norm_sq(t) = Σ_{j<t} c_j²``, ``row_norm_sq(t) =
    Σ_{j<t} b_j²``, ``t = math.inf`` allowed in ``col_norm_sq`` when the sum converges), the
    coefficients ``c_coeffs(n)`` and the streaming state machine.
    """

    noise_laws = ("gaussian",)
    fixed_calibration = "analytic"

    def __init__(self, spec: SumSpec | None = None, /, *, horizon: int | None, purpose: str, **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as
                keywords); ``noise="gaussian"`` only, always calibrated exactly.
            horizon: the public last step ``T``, in ``[1, 2**62]``, or None (all steps).
            purpose: the noise purpose.
        """
        super().__init__(spec, **given)
        self.horizon = None if horizon is None else check_count("horizon", horizon, 1, MAX_STEP)
        self.purpose = _check_purpose(purpose)
        self.guarantee = Guarantee(self.epsilon, self.delta)

    def _calibrate(self) -> None:
        """Exact sigma on the sensitivity over the horizon (or all steps); certify; check the budget."""
        col = self.col_norm_sq(math.inf if self.horizon is None else self.horizon)
        if not math.isfinite(col):
            raise ValueError(f"{self.name}: the column norm diverges; an unbounded horizon is not possible")
        self.max_col_norm = math.sqrt(col)
        joint = self.sensitivity * self.max_col_norm
        self.sigma = analytic_gaussian_sigma(self.epsilon, self.delta, joint)
        certify_gaussian(self.sigma, joint, 1, self.epsilon, self.delta)
        require_within_budget(self.guarantee, self._loss(col), self.name)

    # -- coefficients (subclasses) ---------------------------------------------------------------
    @abc.abstractmethod
    def c_coeffs(self, n: int) -> np.ndarray:
        """``c_0..c_{n−1}`` of ``C``."""

    @abc.abstractmethod
    def col_norm_sq(self, t: float) -> float:
        """``Σ_{j<t} c_j²`` (``t`` may be ``math.inf``)."""

    @abc.abstractmethod
    def row_norm_sq(self, t: int) -> float:
        """``Σ_{j<t} b_j²``."""

    # -- privacy and error -----------------------------------------------------------------------
    def _loss(self, col_sq: float) -> ElementLoss:
        return ElementLoss.of_noise("gaussian", self.sensitivity, self.sigma, col_sq)

    def _check_t(self, t: Any) -> int:
        t = _check_step_number(t)
        if self.horizon is not None and t > self.horizon:
            raise ValueError(f"step {t} is beyond the horizon T={self.horizon} of {self.name}")
        return t

    def noise_var(self, t: int) -> float:
        return self.sigma**2 * self.row_norm_sq(self._check_t(t))

    def charges_at(self, t: int) -> list[Charge]:
        """One charge per earlier step ``s``: ``mu² = (Δ₂ c_{t−s}/σ)²`` (O(t) charges)."""
        t = self._check_t(t)
        mu_sq = (self.sensitivity / self.sigma) ** 2 * self.c_coeffs(t)[::-1] ** 2
        return [Charge(s, s, ElementLoss(gaussian_mu_sq=float(m)), f"{self.purpose}[{t},{s}]")
                for s, m in enumerate(mu_sq, start=1)]

    def _step_facts(self, t: int) -> tuple[float, ElementLoss]:
        """``(noise_std, worst loss)`` of step ``t``: closed forms, memoised per step (every stream, or
        every group, at step ``t`` shares them). The facts of a chunk of steps (``_chunk_of``: noise std,
        loss, and ``epsilon_spent`` primed in one vectorised bisection) are computed while the steps of
        the chunk before it run, one small unit per call (``_facts_units``), so that no step pays for a
        whole chunk; a miss (first chunk, fresh worker, jump) computes its chunk at once,
        with the same floats."""
        memo = self.__dict__.setdefault("_facts_memo", {})
        hit = memo.get(t)
        if hit is None:
            chunk = self._facts_chunk(int(t))
            job = self.__dict__.setdefault("_facts_ahead", {}).pop(chunk, None)
            if job is None:
                run_to_end(self._facts_units(memo, *chunk))
            else:
                job.finish()
            hit = memo[t]
        self._pace_next_facts(memo, int(t))
        return hit

    def _facts_chunk(self, t: int) -> tuple[int, int]:
        first, last = _chunk_of(t)
        return first, min(last, MAX_STEP if self.horizon is None else self.horizon)

    def _pace_next_facts(self, memo: dict, t: int) -> None:
        """One unit of work on the facts of the chunk after ``t``'s (a worker-local cache of at most
        ``_AHEAD_JOBS`` jobs, for groups that lag one another)."""
        last = self._facts_chunk(t)[1]
        if last >= (MAX_STEP if self.horizon is None else self.horizon):
            return
        chunk = self._facts_chunk(last + 1)
        jobs = self.__dict__.setdefault("_facts_ahead", {})
        job = jobs.get(chunk)
        if job is None:
            if chunk[0] in memo:  # done (its steps are memoised)
                return
            if len(jobs) >= _AHEAD_JOBS:
                jobs.pop(next(iter(jobs)))
            job = jobs[chunk] = Paced(self._facts_units(memo, *chunk))
        if job.advance():
            del jobs[chunk]

    def _facts_units(self, memo: dict, first: int, last: int) -> Generator[None, None, None]:
        """Memoise the facts of steps ``first..last`` as a paced computation (``beam_dp.core.paced``):
        units of ``_FACTS_PER_UNIT`` steps' closed forms, one per bisection step of their spends, then
        units of ``_FACTS_PER_UNIT · 8`` steps memoised (the oldest steps evicted first), the first step
        last (its presence marks the chunk done)."""
        entries = []
        for s in range(first, last + 1):
            entries.append((math.sqrt(self.noise_var(s)), self._loss(self.col_norm_sq(s))))
            if len(entries) % _FACTS_PER_UNIT == 0:
                yield
        losses = [loss for _, loss in entries]
        spent = yield from spends_paced(losses, self.delta)
        step = 8 * _FACTS_PER_UNIT
        for lo in reversed(range(0, len(entries), step)):
            hi = min(lo + step, len(entries))
            for s in list(itertools.islice(memo, max(len(memo) + hi - lo - _MEMO_STEPS, 0))):
                del memo[s]
            memo.update(zip(range(first + lo, first + hi), entries[lo:hi]))
            self.remember_spends(losses[lo:hi], spent[lo:hi])
            yield

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_facts_ahead", None)  # worker-local paced jobs (generators), recomputed on demand
        return state

    def _worst_loss(self, t: int) -> ElementLoss:
        return self._step_facts(t)[1]

    def _meta(self, t: int, **extra: Any) -> dict[str, Any]:
        meta = {
            "noise": "gaussian",
            "scale": float(self.sigma),
            "noise_std": self._step_facts(t)[0],
            "calibration": "analytic",
            "horizon": self.horizon,
            "window": None,
        }
        meta.update(extra)
        return meta

    def _next_t(self, group: GroupState) -> int:
        """The step a group advances to (refused beyond the horizon)."""
        t = group.t + 1
        if self.horizon is not None and t > self.horizon:
            raise ValueError(f"step {t} is beyond the horizon T={self.horizon} of {self.name}")
        if t > MAX_STEP:
            raise ValueError(f"step {t} exceeds the supported {MAX_STEP} steps")
        return t
