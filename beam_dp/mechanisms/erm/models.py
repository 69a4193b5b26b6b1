"""Linear models with data-independent Lipschitz constants (Watson et al., "Continual and Sliding Window Release for Private Empirical Risk Minimization").

Every feature vector is clipped to L2 norm ``clip_bound`` (R_x) and a constant bias coordinate 1 is
appended, so the augmented vector has ``‖x̃‖₂ ≤ R = sqrt(R_x² + 1)``. Parameters are a matrix
``W`` of shape ``(outputs, features + 1)`` (last column: intercepts) flattened row-major into a
vector of length ``d = outputs·(features + 1)``.

* :class:`SoftmaxRegression` — multiclass logistic regression (cross-entropy). Per-example gradient
  ``(p − e_y) x̃ᵀ`` has Frobenius norm ``≤ √2·R``: **L = √2·R**; Hessian ``≤ R²/2``: **β = R²/2**.
* :class:`HuberRegression` — linear ("ridge") regression with the Huber loss of threshold ``h``
  (the squared loss ``r²/2`` for residuals ``|r| ≤ h``, linear beyond). The squared loss has no
  data-independent Lipschitz constant on an unbounded domain; the Huber loss has ``L = h·R``,
  ``β = R²``. Choose ``h`` ≥ the typical residual (e.g. the label range) to get plain ridge.

Units: ``loss_grad`` returns the *sum* over the given rows of the loss and of its gradient (the
solver divides by the public normaliser ``n_norm``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from beam_dp.core.clipping import clip_l2

__all__ = ["HuberRegression", "LinearModel", "SoftmaxRegression"]


@dataclass(frozen=True)
class LinearModel:
    """Common part: feature width, clipping bound, parameter layout and prediction."""

    n_features: int
    clip_bound: float = 1.0

    kind = "linear"

    def __post_init__(self) -> None:
        if not isinstance(self.n_features, (int, np.integer)) or self.n_features < 1:
            raise ValueError(f"n_features must be an integer >= 1, got {self.n_features!r}")
        if not (isinstance(self.clip_bound, (int, float)) and math.isfinite(self.clip_bound) and self.clip_bound > 0):
            raise ValueError(f"clip_bound must be a finite number > 0, got {self.clip_bound!r}")

    # -- layout -----------------------------------------------------------------------------
    @property
    def n_outputs(self) -> int:
        raise NotImplementedError

    @property
    def dim(self) -> int:
        """Length d of the flattened parameter vector."""
        return self.n_outputs * (self.n_features + 1)

    @property
    def radius(self) -> float:
        """R: bound on the L2 norm of an augmented feature vector (features clipped, bias 1)."""
        return math.sqrt(self.clip_bound**2 + 1.0)

    @property
    def lipschitz(self) -> float:
        raise NotImplementedError

    @property
    def smoothness(self) -> float:
        raise NotImplementedError

    def sensitivity(self, lam: float, n_norm: int, slack: float = 1.0) -> float:
        """Δ(n) = (1 + slack)·L/(λn): L2 sensitivity of a training call whose returned point lies within
        ``slack·L/(2λn)`` of the exact minimiser (``solver.certified_slack``). ``L/(λn)`` is the exact
        minimiser's move (∇F moves by ≤ 2L/n, F is 2λ-strongly convex); ``slack = 1`` is the spec's
        2L/(λn) (solver stopped at ‖∇F‖ ≤ L/n)."""
        return (1.0 + slack) * self.lipschitz / (lam * n_norm)

    # -- data ---------------------------------------------------------------------------------
    def augment(self, features: np.ndarray) -> np.ndarray:
        """Validate, clip to ``clip_bound`` and append the bias column. Raises ``ValueError``."""
        X = np.asarray(features, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"wrong_shape: expected features of shape (n, {self.n_features}), got {X.shape}")
        if X.shape[0] == 0:
            return np.zeros((0, self.n_features + 1))
        clipped, _ = clip_l2(X, self.clip_bound)  # raises on NaN/inf
        return np.hstack([clipped, np.ones((len(X), 1))])

    def check_labels(self, labels: Any, n: int) -> np.ndarray:
        raise NotImplementedError

    def to_value(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """The release value ``{"weights": (outputs, features), "intercepts": (outputs,)}``."""
        W = np.asarray(w, dtype=np.float64).reshape(self.n_outputs, self.n_features + 1)
        return {"weights": W[:, :-1].copy(), "intercepts": W[:, -1].copy()}

    def describe(self) -> dict:
        return {"model": self.kind, "n_features": int(self.n_features), "clip_bound": float(self.clip_bound)}

    def loss_grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        raise NotImplementedError


@dataclass(frozen=True)
class SoftmaxRegression(LinearModel):
    """Multiclass logistic regression over ``n_classes`` classes (labels are class indices 0..C-1)."""

    n_classes: int = 2
    labels: tuple | None = None  # public class labels (ints or strings) of indices 0..C-1, for predictors

    kind = "softmax"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.n_classes, (int, np.integer)) or self.n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2, got {self.n_classes!r}")
        if self.labels is not None and (len(self.labels) != self.n_classes or len(set(self.labels)) != self.n_classes
                                        or not all(isinstance(c, (int, str)) for c in self.labels)):
            raise ValueError("labels must be n_classes distinct ints or strings")

    @property
    def n_outputs(self) -> int:
        return int(self.n_classes)

    @property
    def lipschitz(self) -> float:
        return math.sqrt(2.0) * self.radius

    @property
    def smoothness(self) -> float:
        return 0.5 * self.radius**2

    def check_labels(self, labels: Any, n: int) -> np.ndarray:
        y = np.asarray(labels)
        integral = y.dtype.kind in "iu" or (y.dtype.kind == "f" and bool(np.all(np.isfinite(y)))
                                            and bool(np.all(y == np.round(y))))
        if y.shape != (n,) or not integral:
            raise ValueError(f"bad_label: expected {n} integer class indices")
        y = y.astype(np.int64)
        if n and (y.min() < 0 or y.max() >= self.n_classes):
            raise ValueError(f"bad_label: class index outside 0..{self.n_classes - 1}")
        return y

    def describe(self) -> dict:
        labels = list(self.labels) if self.labels is not None else list(range(self.n_classes))
        return {**super().describe(), "n_classes": int(self.n_classes), "labels": labels}

    def loss_grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        W = w.reshape(self.n_classes, self.n_features + 1)
        scores = X @ W.T
        scores -= scores.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(scores).sum(axis=1))
        rows = np.arange(len(y))
        loss = float(np.sum(log_norm - scores[rows, y]))
        P = np.exp(scores - log_norm[:, None])
        P[rows, y] -= 1.0
        return loss, (P.T @ X).ravel()


@dataclass(frozen=True)
class HuberRegression(LinearModel):
    """Linear regression with the Huber loss of threshold ``huber`` (labels: finite floats)."""

    huber: float = 1.0

    kind = "huber"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.huber, (int, float)) and math.isfinite(self.huber) and self.huber > 0):
            raise ValueError(f"huber must be a finite number > 0, got {self.huber!r}")

    @property
    def n_outputs(self) -> int:
        return 1

    @property
    def lipschitz(self) -> float:
        return self.huber * self.radius

    @property
    def smoothness(self) -> float:
        return self.radius**2

    def check_labels(self, labels: Any, n: int) -> np.ndarray:
        y = np.asarray(labels)
        if y.shape != (n,) or y.dtype.kind not in "iuf":
            raise ValueError(f"bad_label: expected {n} numeric labels")
        y = y.astype(np.float64)
        if not np.all(np.isfinite(y)):
            raise ValueError("non_finite: label is NaN or inf")
        return y

    def describe(self) -> dict:
        return {**super().describe(), "huber": float(self.huber)}

    def loss_grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        r = X @ w - y
        a = np.abs(r)
        h = self.huber
        loss = float(np.sum(np.where(a <= h, 0.5 * r * r, h * a - 0.5 * h * h)))
        return loss, X.T @ np.clip(r, -h, h)
