"""Convex constraint sets: Euclidean projections, local linear oracles, sizes and Gaussian widths.

Used by the online learners (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration"; Kasiviswanathan, Nissim & Jin, "Private Incremental Regression") and the
incremental regression mechanisms (§4–§6). Everything here is public geometry: no data, no noise,
so nothing in this module affects privacy (all uses are post-processing of private releases).

Sets (``dim = d``):

============================  ===============  ============  ===========  ================
set                           projection       LLO, ρ        D (diam.)    R_C = sup ‖θ‖
============================  ===============  ============  ===========  ================
``L2Ball(d, R)``              exact (scaling)  none         2R           R
``L1Ball(d, R)``              exact (sort)     lift, 2√d    2R           R
``Box(lower, upper)``         exact (clip)     exact, √d    ‖b − a‖      ‖max(|a|,|b|)‖
``Simplex(d, R)``             exact (sort)     greedy, √d   R√2          R
``Polytope(vertices)``        NNLS + KKT       LP, √d       max pair     max ‖v‖
``Polytope.from_halfspaces``  none             LP, √d       LP bounds    LP bounds
============================  ===============  ============  ===========  ================

A *local linear oracle* ``llo(x, r, c)`` (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration") returns ``p ∈ P`` with
``⟨p, c⟩ ≤ min{⟨y, c⟩ : y ∈ P, ‖y − x‖₂ ≤ r}`` and ``‖p − x‖₂ ≤ ρ r``, ``ρ = c_P √d``. Each oracle
here is the exact minimiser of ``⟨·, c⟩`` over a relaxation that contains ``B(x, r) ∩ P`` (so the
first property holds) and whose size gives the second.

Every set also works on a batch of points, one per row: ``project_rows(X)`` and ``llo_rows(X, r, C)``
(``X``, ``C`` of shape ``(n, d)``, one radius ``r`` for all rows), what the online learners use to step
a group of streams at once. The L2 ball, box, simplex and L1 ball do it in array operations (scaling,
clipping, the sort-based formulas), and their ``project``/``llo`` are the batch of one of the same
code; the general :class:`Polytope` solves one LP/NNLS per row.

:func:`make_convex_set` parses a declarative spec (``{"kind": "l1_ball", "radius": 1.0}``, ...);
unknown or non-convex kinds and empty sets raise ``ValueError``.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Mapping

import numpy as np

__all__ = [
    "Box",
    "ConvexSet",
    "L1Ball",
    "L2Ball",
    "Polytope",
    "Simplex",
    "gaussian_width_sparse",
    "gaussian_width_unit_l2",
    "make_convex_set",
    "project_simplex",
    "simplex_greedy_llo",
]

_WIDTH_DRAWS = 10_000  # Monte Carlo draws for Gaussian widths without a closed form
_WIDTH_SEED = 20_240_002  # fixed, public, data-independent


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def _dimension(dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    return int(dim)


def project_simplex(v: np.ndarray, radius: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{x >= 0, Σx = radius}`` (sort-based).

    Sort descending, find the largest k with ``u_k > (Σ_{i<=k} u_i − R)/k``, subtract that
    threshold, clip at 0. ``v`` may be ``(d,)`` or ``(n, d)`` (rows projected independently).
    """
    v = np.asarray(v, dtype=np.float64)
    rows = v[None, :] if v.ndim == 1 else v
    u = -np.sort(-rows, axis=1)
    css = np.cumsum(u, axis=1) - radius
    k = np.arange(1, rows.shape[1] + 1)
    cond = u - css / k > 0
    last = rows.shape[1] - 1 - np.argmax(cond[:, ::-1], axis=1)  # largest k (0-based) with cond
    theta = css[np.arange(rows.shape[0]), last] / (last + 1)
    out = np.maximum(rows - theta[:, None], 0.0)
    return out[0] if v.ndim == 1 else out


def simplex_greedy_llo(x: np.ndarray, c: np.ndarray, mass: float) -> np.ndarray:
    """The simplex oracle's greedy move: remove a total ``mass`` from the coordinates in
    decreasing order of ``c`` (ties: lowest index first), taking ``min(p_j, remaining)`` from each,
    and add it to ``argmin c`` (lowest index on ties). Exact minimiser of ``⟨p, c⟩`` over
    ``{p in the simplex through x, ‖p − x‖₁ <= 2·mass}`` when ``mass <= Σx``.

    ``x``, ``c`` may be ``(d,)`` or ``(n, d)`` (rows moved independently, the same ``mass``)."""
    x, c = np.asarray(x, dtype=np.float64), np.asarray(c, dtype=np.float64)
    xs, cs = (x[None, :], c[None, :]) if x.ndim == 1 else (x, c)
    rows = np.arange(xs.shape[0])[:, None]
    order = np.argsort(-cs, axis=1, kind="stable")  # by c descending, then index ascending
    taken_sorted = xs[rows, order]
    before = np.cumsum(taken_sorted, axis=1) - taken_sorted
    removed = np.clip(mass - before, 0.0, taken_sorted)
    p = xs.copy()
    p[rows, order] -= removed
    p[rows[:, 0], np.argmin(cs, axis=1)] += removed.sum(axis=1)
    return p[0] if x.ndim == 1 else p


class ConvexSet(abc.ABC):
    """A closed, bounded, non-empty convex set in ``R^dim`` (public geometry).

    Attributes: ``dim``, ``diameter`` (D = max ‖x − y‖), ``radius`` (R_C = sup ‖θ‖), ``rho``
    (LLO constant ``c_P √d``; ``None`` without an oracle), ``kind`` (spec name).
    """

    kind: str = "convex_set"
    dim: int
    diameter: float
    radius: float
    rho: float | None = None

    def project(self, x: np.ndarray) -> np.ndarray:
        """Euclidean projection ``Π_C(x)`` of one point ``(d,)`` (the batch of one of ``project_rows``)."""
        return self.project_rows(self._vector(x)[None, :])[0]

    @abc.abstractmethod
    def project_rows(self, X: np.ndarray) -> np.ndarray:
        """Euclidean projection of every row of ``X`` ``(n, d)``."""

    @abc.abstractmethod
    def contains(self, x: np.ndarray, tol: float = 1e-12) -> bool:
        """Membership up to ``tol`` (absolute, in the set's natural constraints)."""

    @property
    def has_projection(self) -> bool:
        return True

    @property
    def has_llo(self) -> bool:
        return self.rho is not None

    def llo(self, x: np.ndarray, r: float, c: np.ndarray) -> np.ndarray:
        """Local linear oracle (see the module docstring) at one point (the batch of one of ``llo_rows``)."""
        return self.llo_rows(self._vector(x)[None, :], r, self._vector(c)[None, :])[0]

    def llo_rows(self, X: np.ndarray, r: float, C: np.ndarray) -> np.ndarray:
        """The local linear oracle of every row: ``p_i = LLO(X[i], r, C[i])`` for ``X``, ``C`` ``(n, d)``."""
        raise NotImplementedError(f"{self.kind} has no local linear oracle")

    def gauge(self, x: np.ndarray) -> float:
        """Minkowski functional ``‖x‖_C = inf{s >= 0 : x ∈ sC}`` (only for sets containing 0 as an
        interior point that define one here: L1 and L2 balls)."""
        raise NotImplementedError(f"{self.kind} has no Minkowski functional here")

    def gaussian_width(self) -> float:
        """``w(C) = E sup_{θ∈C} ⟨θ, g⟩``, ``g ~ N(0, I_d)``."""
        g = np.random.default_rng(_WIDTH_SEED).standard_normal((_WIDTH_DRAWS, self.dim))
        return float(np.mean(self._support(g)))

    def _support(self, g: np.ndarray) -> np.ndarray:
        """Support function ``sup_{θ∈C} ⟨θ, g⟩`` for rows ``g``."""
        raise NotImplementedError

    def start_point(self) -> np.ndarray:
        """Default public start ``Π_C(0)``."""
        return self.project(np.zeros(self.dim))

    def describe(self) -> dict:
        return {"kind": self.kind, "dim": self.dim}

    def _vector(self, x: Any) -> np.ndarray:
        arr = np.asarray(x, dtype=np.float64)
        if arr.shape != (self.dim,):
            raise ValueError(f"{self.kind}: expected a vector of shape ({self.dim},), got {arr.shape}")
        return arr

    def _rows(self, X: Any) -> np.ndarray:
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"{self.kind}: expected rows of shape (n, {self.dim}), got {arr.shape}")
        return arr


class L2Ball(ConvexSet):
    """``{θ : ‖θ‖₂ <= R}``. Projection ``x·min(1, R/‖x‖)``; no LLO (not a polytope)."""

    kind = "l2_ball"

    def __init__(self, dim: int, radius: float = 1.0) -> None:
        self.dim = _dimension(dim)
        self.R = _positive("radius", radius)
        self.diameter = 2.0 * self.R
        self.radius = self.R

    def project_rows(self, X):
        X = self._rows(X)
        norms = np.sqrt(np.einsum("ij,ij->i", X, X))
        outside = norms > self.R
        return X * np.where(outside, self.R / np.where(outside, norms, 1.0), 1.0)[:, None]

    def contains(self, x, tol=1e-12):
        return bool(np.linalg.norm(self._vector(x)) <= self.R * (1 + tol) + tol)

    def gauge(self, x):
        return float(np.linalg.norm(x)) / self.R

    def gaussian_width(self):
        return self.R * gaussian_width_unit_l2(self.dim)

    def describe(self):
        return {"kind": self.kind, "dim": self.dim, "radius": self.R}


class L1Ball(ConvexSet):
    """``{θ : ‖θ‖₁ <= R}``. Projection ``sign(x) ⊙ Π_{R-simplex}(|x|)`` when outside; LLO by lifting
    to the simplex of ``R^{2d+1}`` (``ρ = 2√d``)."""

    kind = "l1_ball"

    def __init__(self, dim: int, radius: float = 1.0) -> None:
        self.dim = _dimension(dim)
        self.R = _positive("radius", radius)
        self.diameter = 2.0 * self.R
        self.radius = self.R
        self.rho = 2.0 * math.sqrt(self.dim)

    def project_rows(self, X):
        X = self._rows(X)
        inside = np.abs(X).sum(axis=1) <= self.R
        out = np.sign(X) * project_simplex(np.abs(X), self.R)
        out[inside] = X[inside]
        return out

    def contains(self, x, tol=1e-12):
        return bool(np.abs(self._vector(x)).sum() <= self.R * (1 + tol) + tol)

    def gauge(self, x):
        return float(np.abs(x).sum()) / self.R

    def llo_rows(self, X, r, C):
        X, C = self._rows(X), self._rows(C)
        d, R, zero = self.dim, self.R, np.zeros((X.shape[0], 1))
        z = np.concatenate([np.maximum(X, 0.0), np.maximum(-X, 0.0), zero], axis=1) / R
        z[:, -1] = np.maximum(0.0, 1.0 - z[:, :-1].sum(axis=1))
        lifted = np.concatenate([R * C, -R * C, zero], axis=1)
        p = simplex_greedy_llo(z, lifted, min(math.sqrt(d) * r / R, 1.0))
        return R * (p[:, :d] - p[:, d : 2 * d])

    def _support(self, g):
        return self.R * np.abs(g).max(axis=1)

    def describe(self):
        return {"kind": self.kind, "dim": self.dim, "radius": self.R}


class Box(ConvexSet):
    """``{θ : a <= θ <= b}`` (coordinate-wise). Projection is clipping; LLO
    ``p_i = clip(x_i − r·sign(c_i), a_i, b_i)`` (``ρ = √d``)."""

    kind = "box"

    def __init__(self, lower: Any, upper: Any, dim: int | None = None) -> None:
        lo = np.asarray(lower, dtype=np.float64)
        hi = np.asarray(upper, dtype=np.float64)
        if dim is not None:
            lo, hi = np.broadcast_to(lo, (_dimension(dim),)).copy(), np.broadcast_to(hi, (int(dim),)).copy()
        if lo.ndim != 1 or lo.shape != hi.shape or lo.size == 0:
            raise ValueError("box bounds must be vectors of equal length >= 1 (or scalars with dim=)")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError("box bounds must be finite (a bounded set)")
        if np.any(lo > hi):
            raise ValueError("empty box: some lower bound exceeds its upper bound")
        self.lower, self.upper = lo, hi
        self.dim = lo.size
        self.diameter = float(np.linalg.norm(hi - lo))
        self.radius = float(np.linalg.norm(np.maximum(np.abs(lo), np.abs(hi))))
        self.rho = math.sqrt(self.dim)

    def project_rows(self, X):
        return np.clip(self._rows(X), self.lower, self.upper)

    def contains(self, x, tol=1e-12):
        x = self._vector(x)
        return bool(np.all(x >= self.lower - tol) and np.all(x <= self.upper + tol))

    def llo_rows(self, X, r, C):
        return np.clip(self._rows(X) - r * np.sign(self._rows(C)), self.lower, self.upper)

    def _support(self, g):
        return np.maximum(g * self.lower, g * self.upper).sum(axis=1)

    def gaussian_width(self):
        return float((self.upper - self.lower).sum() / math.sqrt(2 * math.pi))

    def describe(self):
        return {"kind": self.kind, "dim": self.dim, "lower": self.lower.tolist(), "upper": self.upper.tolist()}


class Simplex(ConvexSet):
    """``{θ >= 0 : Σθ = R}`` (probability simplex for ``R = 1``). Sort-based projection; greedy LLO
    moving ``Δ = min(√d·r/2, R)`` mass to the cheapest coordinate (``ρ = √d``)."""

    kind = "simplex"

    def __init__(self, dim: int, radius: float = 1.0) -> None:
        self.dim = _dimension(dim)
        self.R = _positive("radius", radius)
        self.diameter = self.R * math.sqrt(2.0) if self.dim > 1 else 0.0
        self.radius = self.R
        self.rho = math.sqrt(self.dim)

    def project_rows(self, X):
        return project_simplex(self._rows(X), self.R)

    def contains(self, x, tol=1e-12):
        x = self._vector(x)
        return bool(np.all(x >= -tol) and abs(x.sum() - self.R) <= tol * max(1.0, self.R))

    def llo_rows(self, X, r, C):
        return simplex_greedy_llo(np.maximum(self._rows(X), 0.0), self._rows(C), min(math.sqrt(self.dim) * r / 2.0, self.R))

    def _support(self, g):
        return self.R * g.max(axis=1)

    def describe(self):
        return {"kind": self.kind, "dim": self.dim, "radius": self.R}


class Polytope(ConvexSet):
    """A bounded polytope, given by its vertices ``V`` (rows) or by halfspaces ``{y : A y <= b}``.

    LLO (``ρ = √d``): the LP ``min ⟨c, y⟩`` over ``P ∩ {‖y − x‖₁ <= √d r}`` (``linprog``, HiGHS);
    the L1 ball of radius ``√d r`` contains the L2 ball of radius r. Projection: only for the vertex
    form (active set by NNLS, then an exact KKT solve on the support). ``project_rows``/``llo_rows``
    do not vectorise: they solve one problem per row, in a Python loop.
    """

    kind = "polytope"

    def __init__(self, vertices: Any = None, *, A: Any = None, b: Any = None) -> None:
        from scipy.optimize import linprog  # on first use: scipy.optimize costs ~0.3 s of start-up

        self.vertices = None
        if vertices is None and A is None:
            raise ValueError("empty polytope: give vertices or halfspaces")
        if vertices is not None:
            V = np.asarray(vertices, dtype=np.float64)
            if V.ndim != 2 or V.shape[0] == 0 or V.shape[1] == 0:
                raise ValueError("empty polytope: give at least one vertex as rows of a 2-D array")
            if not np.all(np.isfinite(V)):
                raise ValueError("polytope vertices must be finite")
            self.vertices = V
            self.dim = V.shape[1]
            diffs = V[:, None, :] - V[None, :, :]
            self.diameter = float(np.sqrt((diffs**2).sum(axis=2)).max())
            self.radius = float(np.linalg.norm(V, axis=1).max())
        else:
            A = np.asarray(A, dtype=np.float64)
            b = np.asarray(b, dtype=np.float64)
            if A.ndim != 2 or b.shape != (A.shape[0],) or A.shape[0] == 0:
                raise ValueError("halfspaces need A (m, d) and b (m,) with m >= 1")
            if not (np.all(np.isfinite(A)) and np.all(np.isfinite(b))):
                raise ValueError("halfspaces must be finite")
            self.A, self.b = A, b
            self.dim = A.shape[1]
            lo, hi = np.empty(self.dim), np.empty(self.dim)
            for i in range(self.dim):  # bounding box by 2d LPs: checks non-empty and bounded
                e = np.zeros(self.dim)
                e[i] = 1.0
                for sign, out in ((1.0, lo), (-1.0, hi)):
                    res = linprog(sign * e, A_ub=A, b_ub=b, bounds=[(None, None)] * self.dim, method="highs")
                    if res.status == 2:
                        raise ValueError("empty polytope: the halfspaces are infeasible")
                    if res.status == 3:
                        raise ValueError("unbounded polytope: the halfspaces do not bound a compact set")
                    if not res.success:
                        raise ValueError(f"could not analyse the halfspaces: {res.message}")
                    out[i] = res.x[i]
            self.diameter = float(np.linalg.norm(hi - lo))
            self.radius = float(np.linalg.norm(np.maximum(np.abs(lo), np.abs(hi))))  # upper bound
        self.rho = math.sqrt(self.dim)

    @classmethod
    def from_halfspaces(cls, A: Any, b: Any) -> "Polytope":
        return cls(A=A, b=b)

    @property
    def has_projection(self) -> bool:
        return self.vertices is not None

    def _weights_to_point(self, lam: np.ndarray) -> np.ndarray:
        return lam @ self.vertices

    def project_rows(self, X):
        X = self._rows(X)
        return np.array([self.project(x) for x in X]).reshape(X.shape)

    def llo_rows(self, X, r, C):
        X, C = self._rows(X), self._rows(C)
        return np.array([self.llo(x, r, c) for x, c in zip(X, C)]).reshape(X.shape)

    def project(self, x):
        if self.vertices is None:
            raise NotImplementedError("projection onto a halfspace polytope is not provided; use its LLO")
        from scipy.optimize import nnls

        x = self._vector(x)
        V = self.vertices
        n = V.shape[0]
        # active set by NNLS on the penalised problem, then the exact KKT solve on that support
        w = 1e4 * (1.0 + float(np.abs(V).max()) + float(np.abs(x).max()))
        lam, _ = nnls(np.vstack([V.T, w * np.ones((1, n))]), np.concatenate([x, [w]]), maxiter=50 * n)
        support = np.flatnonzero(lam > 0)
        Vs = V[support]
        k = support.size
        kkt = np.block([[2.0 * Vs @ Vs.T, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
        try:
            sol = np.linalg.lstsq(kkt, np.concatenate([2.0 * Vs @ x, [1.0]]), rcond=None)[0][:k]
            if np.all(sol >= 0):
                lam = np.zeros(n)
                lam[support] = sol
        except np.linalg.LinAlgError:
            pass
        lam = np.maximum(lam, 0.0)
        return (lam / lam.sum()) @ V

    def contains(self, x, tol=1e-12):
        x = self._vector(x)
        if self.vertices is None:
            return bool(np.all(self.A @ x <= self.b + tol * (1 + np.abs(self.b))))
        # min Σs s.t. |Vᵀλ − x| <= s, λ in the simplex: the L1 distance from x to P
        from scipy.optimize import linprog

        V, d = self.vertices, self.dim
        n = V.shape[0]
        eye = np.eye(d)
        res = linprog(np.concatenate([np.zeros(n), np.ones(d)]),
                      A_ub=np.block([[V.T, -eye], [-V.T, -eye]]), b_ub=np.concatenate([x, -x]),
                      A_eq=np.concatenate([np.ones((1, n)), np.zeros((1, d))], axis=1), b_eq=[1.0],
                      bounds=[(0, None)] * (n + d), method="highs")
        return bool(res.success and res.fun <= max(tol, 1e-9) * (1 + np.abs(x).sum()))

    def llo(self, x, r, c):
        from scipy.optimize import linprog

        x, c = self._vector(x), self._vector(c)
        d = self.dim
        budget = math.sqrt(d) * r
        if self.vertices is None:
            # variables (y, s): min c·y  s.t.  A y <= b,  |y − x| <= s,  Σs <= budget
            n_aux = d
            obj = np.concatenate([c, np.zeros(n_aux)])
            eye = np.eye(d)
            A_ub = np.block([[self.A, np.zeros((self.A.shape[0], d))], [eye, -eye], [-eye, -eye],
                             [np.zeros((1, d)), np.ones((1, d))]])
            b_ub = np.concatenate([self.b, x, -x, [budget]])
            res = linprog(obj, A_ub=A_ub, b_ub=b_ub, bounds=[(None, None)] * d + [(0, None)] * d, method="highs")
            if not res.success:
                return x.copy()  # x itself is feasible; only fails for numerical reasons
            return res.x[:d]
        # variables (λ, s): min (V c)·λ  s.t.  λ in simplex,  |Vᵀλ − x| <= s,  Σs <= budget
        V = self.vertices
        n = V.shape[0]
        obj = np.concatenate([V @ c, np.zeros(d)])
        eye = np.eye(d)
        A_ub = np.block([[V.T, -eye], [-V.T, -eye], [np.zeros((1, n)), np.ones((1, d))]])
        b_ub = np.concatenate([x, -x, [budget]])
        A_eq = np.concatenate([np.ones((1, n)), np.zeros((1, d))], axis=1)
        res = linprog(obj, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0], bounds=[(0, None)] * (n + d), method="highs")
        if not res.success:
            return x.copy()
        return res.x[:n] @ V

    def _support(self, g):
        if self.vertices is None:
            raise NotImplementedError("Gaussian width of a halfspace polytope is not provided")
        return (g @ self.vertices.T).max(axis=1)

    def describe(self):
        if self.vertices is None:
            return {"kind": self.kind, "dim": self.dim, "halfspaces": int(self.A.shape[0])}
        return {"kind": self.kind, "dim": self.dim, "vertices": int(self.vertices.shape[0])}


def gaussian_width_unit_l2(d: int) -> float:
    """``w(B₂^d) = √2·Γ((d+1)/2)/Γ(d/2)`` (= E‖g‖, ≈ √d)."""
    return float(math.sqrt(2.0) * math.exp(math.lgamma((d + 1) / 2.0) - math.lgamma(d / 2.0)))


def gaussian_width_sparse(d: int, k: int) -> float:
    """Width of k-sparse vectors of L2 norm <= 1: ``E √(sum of the k largest g_i²)`` (Monte Carlo,
    fixed public seed; ≈ √(2k ln(e d/k)))."""
    d, k = _dimension(d), _dimension(k)
    if k > d:
        raise ValueError(f"sparsity k={k} exceeds the dimension d={d}")
    g2 = np.random.default_rng(_WIDTH_SEED).standard_normal((_WIDTH_DRAWS, d)) ** 2
    top = -np.partition(-g2, k - 1, axis=1)[:, :k] if k < d else g2
    return float(np.mean(np.sqrt(top.sum(axis=1))))


_KINDS = {"l2_ball", "l1_ball", "box", "simplex", "polytope", "halfspaces"}


def make_convex_set(spec: Any, dim: int | None = None) -> ConvexSet:
    """A ``ConvexSet`` from a set object or a declarative spec.

    Specs: ``"l2_ball"``/``{"kind": "l2_ball", "radius": R}``, ``"l1_ball"``, ``"simplex"``,
    ``{"kind": "box", "lower": a, "upper": b}``, ``{"kind": "polytope", "vertices": V}``,
    ``{"kind": "halfspaces", "A": A, "b": b}``. ``dim`` is required where the spec does not fix it.
    Unknown kinds (e.g. a sphere, an L0 ball, a union) are not convex sets here: ``ValueError``.
    """
    if isinstance(spec, ConvexSet):
        if dim is not None and spec.dim != dim:
            raise ValueError(f"constraint set has dim {spec.dim}, expected {dim}")
        return spec
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise ValueError(f"a constraint spec is a ConvexSet, a kind name or a mapping with 'kind', got {spec!r}")
    kind = spec["kind"]
    if kind not in _KINDS:
        raise ValueError(
            f"constraint kind {kind!r} is not a supported convex set (one of {sorted(_KINDS)}); "
            "non-convex sets (spheres, sparsity constraints, unions) cannot be used"
        )
    extra = set(spec) - {"kind", "radius", "lower", "upper", "vertices", "A", "b", "dim"}
    if extra:
        raise ValueError(f"unknown constraint spec fields {sorted(extra)}")
    d = spec.get("dim", dim)
    if kind == "l2_ball":
        out: ConvexSet = L2Ball(_dimension(d), spec.get("radius", 1.0))
    elif kind == "l1_ball":
        out = L1Ball(_dimension(d), spec.get("radius", 1.0))
    elif kind == "simplex":
        out = Simplex(_dimension(d), spec.get("radius", 1.0))
    elif kind == "box":
        if "lower" not in spec or "upper" not in spec:
            raise ValueError("a box needs 'lower' and 'upper'")
        out = Box(spec["lower"], spec["upper"], dim=d if np.ndim(spec["lower"]) == 0 else None)
    elif kind == "polytope":
        out = Polytope(spec.get("vertices"))
    else:
        out = Polytope.from_halfspaces(spec.get("A"), spec.get("b"))
    if dim is not None and out.dim != dim:
        raise ValueError(f"constraint set has dim {out.dim}, expected {dim}")
    return out
