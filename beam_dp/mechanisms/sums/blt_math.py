"""Exact arithmetic of buffered linear Toeplitz (BLT) factorizations, and their fitting.

A BLT with ``n`` buffers (Dvijotham et al. 2024; McMahan et al. 2024) has decays ``θ ∈ (0, 1)^n`` and
weights ``ω > 0^n``: ``C`` is lower-triangular Toeplitz with ``c_0 = 1``, ``c_j = Σ_i ω_i θ_i^{j−1}``
(``j >= 1``). As a linear system, ``y_t = x_t + ω·s_t``, ``s_{t+1} = θ∘s_t + x_t``. Its inverse is the
system ``x_t = y_t − ω·g_t``, ``g_{t+1} = M g_t + y_t`` with ``M = diag(θ) − 1ωᵀ``; ``M``'s eigenvalues
``λ`` are real (a diagonal minus a rank-one matrix with ``ω > 0`` interlaces with ``θ``: one below
``min θ`` and one between each pair), so ``C^{-1}`` has ``ĉ_0 = 1``, ``ĉ_j = Σ_i ω̂_i λ_i^{j−1}`` and
``B = A C^{-1}`` has ``b_j = Σ_{i<=j} ĉ_i = α + Σ_i β_i λ_i^j``.

Both quantities the mechanism needs are then closed-form O(n²) sums of geometric series:
``Σ_{j<t} c_j²`` (``t = ∞`` allowed: the sensitivity of the unbounded mode) and ``Σ_{j<t} b_j²`` (the
per-step variance over σ²). ``direct_*`` compute the same by explicit O(t·n) vectorised sums
(tests and benchmarks compare the two).

The mean per-step variance over ``t = 1..T`` is closed-form too: ``(1/T) Σ_{t<=T} Σ_{j<t} b_j² =
(1/T) Σ_{j<T} (T − j) b_j²``, a sum of weighted geometric series (:func:`_geom_weighted`).

``fit_blt`` minimises, at a horizon ``T``, the exact max per-step variance (``error="max"``:
``log Σ_{j<T'} c_j² + log Σ_{j<T} b_j²``) or the exact mean per-step variance over ``t <= T``
(``error="mean"``: ``log Σ_{j<T'} c_j² + log (1/T)Σ_{j<T}(T − j) b_j²``), ``T' = T`` bounded,
``T' = ∞`` unbounded, over ``θ_i = exp(−e^{a_i})``, ``ω_i = e^{b_i}``, from a few deterministic
starts (L-BFGS-B). Either way σ is calibrated on the same column norm ``Σ_{j<T'} c_j²``: the
objective picks the parameters, never the privacy accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BLT", "ERRORS", "fit_blt"]

#: the error objectives a BLT can be fitted for: the max or the mean per-step variance over the horizon
ERRORS = ("max", "mean")


def _geom(q: np.ndarray, t: float) -> np.ndarray:
    """``Σ_{j<t} q^j`` elementwise for ``q ∈ (−1, 1)`` (``t = ∞`` allowed)."""
    q = np.asarray(q, dtype=np.float64)
    if math.isinf(t):
        return 1.0 / (1.0 - q)
    out = np.empty_like(q)
    pos = q > 0
    out[pos] = -np.expm1(t * np.log(q[pos])) / (1.0 - q[pos])
    neg = ~pos
    out[neg] = (1.0 - np.power(q[neg], t)) / (1.0 - q[neg])
    return out


def _phi(y: np.ndarray) -> np.ndarray:
    """``e^{−y} − 1 + y`` for ``y >= 0`` without cancellation (a series below 10⁻³)."""
    y = np.asarray(y, dtype=np.float64)
    small = y < 1e-3
    ys = np.where(small, y, 0.0)
    series = ys * ys * (0.5 - ys * (1.0 / 6.0 - ys / 24.0))
    return np.where(small, series, np.expm1(-np.where(small, 1.0, y)) + np.where(small, 1.0, y))


def _geom_weighted(q: np.ndarray, t: int) -> np.ndarray:
    """``Σ_{j<t} (t − j) q^j = Σ_{s=1..t} Σ_{j<s} q^j`` elementwise for ``q ∈ (−1, 1)``, finite ``t``.
    ``q > 0`` (``q = e^{−x}``): ``(φ(tx) − tφ(x) + (1 − q)(1 − q^t))/(1 − q)²`` with
    ``φ(y) = e^{−y} − 1 + y`` (no cancellation as q → 1); ``q <= 0``: ``(t(1 − q) − q(1 − q^t))/(1 − q)²``."""
    q = np.asarray(q, dtype=np.float64)
    out = np.empty_like(q)
    pos = q > 0
    x = -np.log(q[pos])
    a, big_a = -np.expm1(-x), -np.expm1(-t * x)
    out[pos] = (_phi(t * x) - t * _phi(x) + a * big_a) / (a * a)
    neg = ~pos
    qn = q[neg]
    out[neg] = (t * (1.0 - qn) - qn * (1.0 - np.power(qn, t))) / (1.0 - qn) ** 2
    return out


@dataclass(frozen=True)
class BLT:
    """A BLT factorization: decays ``theta`` and weights ``omega`` (equal length, the buffers)."""

    theta: tuple[float, ...]
    omega: tuple[float, ...]

    def __post_init__(self) -> None:
        th, om = np.asarray(self.theta, float), np.asarray(self.omega, float)
        if th.ndim != 1 or th.shape != om.shape or th.size < 1:
            raise ValueError("a BLT needs equal-length, non-empty theta and omega")
        if not (np.all(np.isfinite(th)) and np.all((th > 0) & (th < 1))):
            raise ValueError("BLT decays theta must lie in (0, 1)")
        if not (np.all(np.isfinite(om)) and np.all(om > 0)):
            raise ValueError("BLT weights omega must be finite and > 0")
        lam, w_hat = self._inverse(th, om)
        object.__setattr__(self, "_lam", lam)
        object.__setattr__(self, "_w_hat", w_hat)

    @staticmethod
    def _inverse(theta: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = np.diag(theta) - np.outer(np.ones_like(theta), omega)
        lam, vec = np.linalg.eig(m)
        w_hat = -(omega @ vec) * np.linalg.solve(vec, np.ones_like(theta))
        if np.max(np.abs(lam.imag)) > 1e-9 or np.max(np.abs(w_hat.imag)) > 1e-9 * (1 + np.max(np.abs(w_hat))):
            raise ValueError("BLT inverse has complex modes; theta/omega are not a valid real BLT")
        return lam.real, w_hat.real

    @property
    def buffers(self) -> int:
        return len(self.theta)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.theta, float), np.asarray(self.omega, float)

    @property
    def inverse_modes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(λ, ω̂)`` of ``C^{-1}``."""
        return self._lam, self._w_hat

    def state_matrix_inverse(self) -> np.ndarray:
        """``M = diag(θ) − 1ωᵀ`` of the inverse system (used by the streaming noise)."""
        theta, omega = self.arrays
        return np.diag(theta) - np.outer(np.ones_like(theta), omega)

    # -- closed forms ------------------------------------------------------------------------------
    def col_norm_sq(self, t: float) -> float:
        """``Σ_{j<t} c_j²`` (``t >= 1``; ``t = ∞`` gives the limit)."""
        if t <= 1:
            return 1.0
        theta, omega = self.arrays
        q = np.outer(theta, theta)
        return float(1.0 + omega @ _geom(q, t - 1) @ omega)

    def row_norm_sq(self, t: float) -> float:
        """``Σ_{j<t} b_j²`` (``t >= 1``)."""
        lam, w_hat = self._lam, self._w_hat
        beta = -w_hat / (1.0 - lam)
        alpha = 1.0 - beta.sum()
        total = t * alpha**2 + 2.0 * alpha * beta @ _geom(lam, t) + beta @ _geom(np.outer(lam, lam), t) @ beta
        return float(total)

    def mean_row_norm_sq(self, t: int) -> float:
        """``(1/t) Σ_{s<=t} Σ_{j<s} b_j² = (1/t) Σ_{j<t} (t − j) b_j²``: the mean over steps ``1..t`` of
        the per-step variance over σ² (finite ``t >= 1``)."""
        lam, w_hat = self._lam, self._w_hat
        beta = -w_hat / (1.0 - lam)
        alpha = 1.0 - beta.sum()
        total = (t * (t + 1) / 2.0 * alpha**2 + 2.0 * alpha * beta @ _geom_weighted(lam, t)
                 + beta @ _geom_weighted(np.outer(lam, lam), t) @ beta)
        return float(total / t)

    # -- explicit O(t·n) forms -------------------------------------------------------------------
    def c_coeffs(self, n: int) -> np.ndarray:
        theta, omega = self.arrays
        j = np.arange(max(n - 1, 0), dtype=np.float64)
        tail = omega @ np.exp(np.outer(np.log(theta), j)) if n > 1 else np.zeros(0)
        return np.concatenate([[1.0], tail])[:n]

    def inverse_coeffs(self, n: int) -> np.ndarray:
        lam, w_hat = self._lam, self._w_hat
        j = np.arange(max(n - 1, 0), dtype=np.float64)
        tail = w_hat @ np.power(lam[:, None], j[None, :]) if n > 1 else np.zeros(0)
        return np.concatenate([[1.0], tail])[:n]

    def b_coeffs(self, n: int) -> np.ndarray:
        return np.cumsum(self.inverse_coeffs(n))

    def direct_col_norm_sq(self, n: int) -> np.ndarray:
        """``Σ_{j<t} c_j²`` for ``t = 1..n``."""
        return np.cumsum(self.c_coeffs(n) ** 2)

    def direct_row_norm_sq(self, n: int) -> np.ndarray:
        """``Σ_{j<t} b_j²`` for ``t = 1..n``."""
        return np.cumsum(self.b_coeffs(n) ** 2)

    def max_variance_units(self, horizon: int, unbounded: bool = False) -> float:
        """Max per-step variance over ``t <= horizon`` in units of ``z²Δ₂²`` (``z``: noise multiplier)."""
        return self.col_norm_sq(math.inf if unbounded else horizon) * self.row_norm_sq(horizon)

    def mean_variance_units(self, horizon: int, unbounded: bool = False) -> float:
        """Mean per-step variance over ``t = 1..horizon`` in units of ``z²Δ₂²``."""
        return self.col_norm_sq(math.inf if unbounded else horizon) * self.mean_row_norm_sq(horizon)

    def variance_units(self, horizon: int, unbounded: bool = False, error: str = "max") -> float:
        """The ``error`` objective (:data:`ERRORS`): max or mean per-step variance over ``t <= horizon``."""
        if error not in ERRORS:
            raise ValueError(f"error must be one of {ERRORS}, got {error!r}")
        return (self.max_variance_units if error == "max" else self.mean_variance_units)(horizon, unbounded)


def _from_vector(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(x) // 2
    return np.exp(-np.exp(x[:n])), np.exp(x[n:])


def _objective(x: np.ndarray, horizon: int, unbounded: bool, error: str = "max") -> float:
    theta, omega = _from_vector(x)
    if not (np.all((theta > 0) & (theta < 1)) and np.all(np.isfinite(omega)) and np.all(omega > 0)):
        return 1e6
    try:
        blt = BLT(tuple(theta), tuple(omega))
        value = blt.variance_units(horizon, unbounded, error)
    except (ValueError, np.linalg.LinAlgError, FloatingPointError):
        return 1e6
    return math.log(value) if math.isfinite(value) and value > 0 else 1e6


def fit_blt(horizon: int, buffers: int = 4, unbounded: bool = False, starts: int = 10, seed: int = 0,
            error: str = "max") -> BLT:
    """BLT parameters minimising the exact max (``error="max"``) or mean (``error="mean"``) per-step
    variance over ``t <= horizon``.

    ``unbounded=True`` calibrates to the sensitivity over all steps (``Σ_{j<∞} c_j²``), so the
    guarantee holds forever while the error is optimised up to ``horizon``. Starts (seeded, so the
    fit is reproducible): decay rates ``−ln θ`` log-uniform in ``[0.3/T, 2]`` with weights from the
    integral ``j^{−1/2} ∝ ∫ s^{−1/2} e^{−s j} ds`` of the square-root coefficients; L-BFGS-B from each,
    then a Nelder–Mead polish of the best.
    """
    if horizon < 1 or buffers < 1:
        raise ValueError("horizon and buffers must be >= 1")
    if error not in ERRORS:
        raise ValueError(f"error must be one of {ERRORS}, got {error!r}")
    from scipy.optimize import minimize  # on first use (a fit not in the table): ~0.3 s of start-up

    rng = np.random.default_rng(seed)
    best = None
    with np.errstate(all="ignore"):
        for _ in range(starts):
            rates = np.sort(np.exp(rng.uniform(math.log(0.3 / max(horizon, 2)), math.log(2.0), buffers)))
            weights = np.sqrt(rates) * math.log(max(horizon, 2)) / (buffers * math.pi) * np.exp(rng.normal(0, 0.3, buffers))
            x0 = np.concatenate([np.log(rates), np.log(weights)])
            res = minimize(_objective, x0, args=(horizon, unbounded, error), method="L-BFGS-B",
                           options={"maxiter": 3000})
            if best is None or res.fun < best.fun:
                best = res
        polish = minimize(_objective, best.x, args=(horizon, unbounded, error), method="Nelder-Mead",
                          options={"maxiter": 4000, "xatol": 1e-9, "fatol": 1e-12})
        if polish.fun < best.fun:
            best = polish
    theta, omega = _from_vector(best.x)
    order = np.argsort(-theta)
    return BLT(tuple(float(v) for v in theta[order]), tuple(float(v) for v in omega[order]))
