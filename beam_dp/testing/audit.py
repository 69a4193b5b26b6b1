"""Empirical privacy audits: a high-confidence *lower bound* on epsilon from neighbouring runs.

Run a mechanism many times on a pair of neighbouring inputs D, D' (fresh noise each run), reduce
each run's releases to a scalar statistic, and test thresholds: for a rejection set
``S = {stat >= tau}`` (and its mirror), ``(epsilon, delta)``-DP implies
``P_D[S] <= e^epsilon P_D'[S] + delta``. With Clopper–Pearson bounds ``p_lo`` on ``P_D[S]`` and
``q_hi`` on ``P_D'[S]`` (Bonferroni-corrected over all thresholds and both directions),
``epsilon >= ln((p_lo - delta) / q_hi)`` holds with the stated confidence. A correct mechanism's
bound stays below its claim; a mechanism with too little noise exceeds it.

Thresholds are chosen on a first half of the samples and evaluated on the second half, so the
selection does not bias the bound.

The reusable harness around :func:`epsilon_lower_bound`:

* :class:`ScaledNoise` — the *mutant*: the real keyed samplers with every scale multiplied by
  ``factor`` (``0.5`` = half noise). It plugs into any mechanism that draws its noise from a
  ``NoiseSource`` sampler; ``generator()`` (sampling, permutations, Gumbel) is left untouched.
* :func:`run_stream` / :func:`release_matrix` — drive a pure mechanism over a list of blocks.
* :func:`linear_statistic_weights` — ``Σ⁻¹ Δm``: the likelihood-ratio statistic of a Gaussian
  linear mechanism (optimal there; a strong, law-agnostic attack otherwise). ``Δm`` comes from
  noise-free runs (``ZeroNoise``), ``Σ`` from separate noisy runs.
* :func:`audit_with_mutant` — one call that audits the honest mechanism and its half-noise mutant
  and returns an :class:`AuditReport` (lower bound vs claim, mutant caught).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats

from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release

__all__ = [
    "AuditReport",
    "AuditResult",
    "ScaledNoise",
    "audit_with_mutant",
    "epsilon_lower_bound",
    "linear_statistic_weights",
    "release_matrix",
    "run_audit",
    "run_stream",
    "seeded_key",
]


class AuditResult(tuple):
    """``(epsilon_lower_bound, threshold, direction)``."""

    @property
    def epsilon(self) -> float:
        return self[0]


def _cp_lower(k: int, n: int, alpha: float) -> float:
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def _cp_upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def _best_threshold(a: np.ndarray, b: np.ndarray, candidates: np.ndarray) -> tuple[float, float]:
    """Threshold maximising the plug-in ln(P_a[x>=t] / P_b[x>=t]) with at least 30 hits in b."""
    a_sorted, b_sorted = np.sort(a), np.sort(b)
    pa = 1.0 - np.searchsorted(a_sorted, candidates, side="left") / len(a)
    hits_b = len(b) - np.searchsorted(b_sorted, candidates, side="left")
    ok = hits_b >= 30
    if not ok.any():
        return float(candidates[0]), -math.inf
    ratio = np.where(ok, np.log(np.maximum(pa, 1e-300)) - np.log(np.maximum(hits_b, 1) / len(b)), -np.inf)
    i = int(np.argmax(ratio))
    return float(candidates[i]), float(ratio[i])


def epsilon_lower_bound(
    stat_d: np.ndarray, stat_d_prime: np.ndarray, delta: float = 0.0, confidence: float = 0.95
) -> AuditResult:
    """Lower bound on epsilon (with probability ``confidence``) from statistic samples under D and D'."""
    x, y = np.asarray(stat_d, dtype=float), np.asarray(stat_d_prime, dtype=float)
    hx, hy = len(x) // 2, len(y) // 2
    candidates = np.quantile(np.concatenate([x[:hx], y[:hy]]), np.linspace(0.001, 0.999, 400))
    best = AuditResult((0.0, float("nan"), ""))
    tests = []
    for direction, (a_sel, b_sel, a_ev, b_ev) in {
        "D>=t": (x[:hx], y[:hy], x[hx:], y[hy:]),
        "D'>=t": (y[:hy], x[:hx], y[hy:], x[hx:]),
        "D<=t": (-x[:hx], -y[:hy], -x[hx:], -y[hy:]),
        "D'<=t": (-y[:hy], -x[:hx], -y[hy:], -x[hx:]),
    }.items():
        cand = candidates if not direction.endswith("<=t") else -candidates[::-1]
        tau, _ = _best_threshold(a_sel, b_sel, cand)
        tests.append((direction, tau, int(np.sum(a_ev >= tau)), len(a_ev), int(np.sum(b_ev >= tau)), len(b_ev)))
    alpha = (1 - confidence) / len(tests)  # Bonferroni over the four one-sided tests
    for direction, tau, ka, na, kb, nb in tests:
        p_lo, q_hi = _cp_lower(ka, na, alpha), _cp_upper(kb, nb, alpha)
        if p_lo - delta > 0 and q_hi > 0:
            eps = math.log((p_lo - delta) / q_hi)
            if eps > best[0]:
                best = AuditResult((eps, tau, direction))
    return best


def run_audit(
    run: Callable[[bool, int], float], runs: int, delta: float = 0.0, confidence: float = 0.95
) -> AuditResult:
    """``run(neighbour, seed) -> statistic`` for ``seed in range(runs)`` on D (False) and D' (True)."""
    d = np.array([run(False, seed) for seed in range(runs)])
    d_prime = np.array([run(True, seed) for seed in range(runs)])
    return epsilon_lower_bound(d, d_prime, delta, confidence)


# -- the reusable harness -----------------------------------------------------------------------
class ScaledNoise(NoiseSource):
    """MUTANT (tests only): the real keyed samplers with every noise scale multiplied by ``factor``.

    ``ScaledNoise(key, 0.5)`` is the half-noise variant of any mechanism drawing from
    ``laplace``/``gaussian``/``k_norm``/``discrete_laplace``/``discrete_gaussian``; ``factor=1`` is
    the honest source. ``generator()`` (subsampling, permutations, exponential mechanisms) is unchanged.
    """

    def __init__(self, key: bytes, factor: float = 0.5):
        super().__init__(key)
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError("factor must be a finite number > 0")
        self.factor = float(factor)

    def __repr__(self) -> str:
        return f"ScaledNoise(<secret key>, factor={self.factor})"

    def _sample(self, law, streams, purpose, index, scale, size):
        # every keyed draw (one cell or many) goes through here: scaling it scales every law alike
        return super()._sample(law, streams, purpose, index, scale * self.factor, size)


def seeded_key(seed: int, salt: bytes = b"") -> bytes:
    """A 32-byte audit key for run ``seed`` (audits need fresh, independent noise per run)."""
    return (int(seed).to_bytes(8, "little") + salt.ljust(8, b"\0")[:8]) * 2


def run_stream(mechanism: Any, blocks: Sequence[Any], noise: NoiseSource, stream: str = "audit") -> list[Release]:
    """Feed ``blocks`` (one per step, ``None`` = empty step) to ``mechanism``; return every release."""
    state, out = mechanism.init_state(stream), []
    for block in blocks:
        state, releases = mechanism.step(state, block, noise)
        out.extend(releases)
    return out


def release_matrix(releases: Sequence[Release]) -> np.ndarray:
    """Release values stacked ``(n_releases, size)`` (mapping values: their arrays concatenated)."""
    rows = []
    for release in releases:
        value = release.value
        if isinstance(value, dict):
            value = np.concatenate([np.ravel(value[k]) for k in sorted(value)])
        rows.append(np.ravel(np.asarray(value, dtype=np.float64)))
    return np.stack(rows)


def linear_statistic_weights(mean_d: np.ndarray, mean_d_prime: np.ndarray, noise_samples: np.ndarray) -> np.ndarray:
    """``w = Σ⁺ (m' − m)``: the log-likelihood-ratio direction of a Gaussian linear mechanism.

    ``noise_samples`` (n, k): release noise (release minus its noise-free value) from runs *not*
    used for the audit itself; ``Σ`` is their covariance (pseudo-inverse if singular).
    """
    cov = np.atleast_2d(np.cov(np.asarray(noise_samples, dtype=np.float64), rowvar=False))
    return np.linalg.pinv(cov, hermitian=True) @ (np.ravel(mean_d_prime) - np.ravel(mean_d))


@dataclass(frozen=True)
class AuditReport:
    """One mechanism's audit: the claim, the honest lower bound and the half-noise mutant's."""

    mechanism: str
    claimed_epsilon: float
    claimed_delta: float
    lower_bound: float
    mutant_lower_bound: float
    samples: int  # statistic samples per neighbour, per variant

    @property
    def honest_ok(self) -> bool:
        return self.lower_bound <= self.claimed_epsilon

    @property
    def mutant_caught(self) -> bool:
        return self.mutant_lower_bound > self.claimed_epsilon

    def row(self) -> str:
        """A Markdown table row for docs/reliability.md."""
        delta = f"{self.claimed_delta:g}" if self.claimed_delta else "0"
        return (f"| {self.mechanism} | {self.claimed_epsilon:g} | {delta} | {self.lower_bound:.3f} | "
                f"{self.mutant_lower_bound:.3f} | {'yes' if self.mutant_caught else 'no'} | {self.samples} |")


def audit_with_mutant(
    name: str,
    sample: Callable[[float], tuple[np.ndarray, np.ndarray]],
    claimed_epsilon: float,
    claimed_delta: float = 0.0,
    mutant_factor: float = 0.5,
    confidence: float = 0.95,
) -> AuditReport:
    """``sample(noise_factor) -> (stats under D, stats under D')``; ``noise_factor=1`` is the honest
    mechanism, ``mutant_factor`` the mutant (use :class:`ScaledNoise`). Both are bounded at the
    claimed delta with the same confidence."""
    honest = sample(1.0)
    mutant = sample(mutant_factor)
    return AuditReport(
        mechanism=name,
        claimed_epsilon=float(claimed_epsilon),
        claimed_delta=float(claimed_delta),
        lower_bound=epsilon_lower_bound(*honest, claimed_delta, confidence).epsilon,
        mutant_lower_bound=epsilon_lower_bound(*mutant, claimed_delta, confidence).epsilon,
        samples=len(honest[0]),
    )
