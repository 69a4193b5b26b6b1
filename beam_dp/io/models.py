"""Turn a released model snapshot back into a predictor: ``load_model(release_or_row)``.

A snapshot is a ``Release`` (or a ``ReleaseRow``, or a row dict from ``read_releases``) of the ERM
family: value ``{"weights": (C, f), "intercepts": (C,)}`` and meta naming the model (``softmax`` or
``huber``), the feature clipping bound and the class labels. The predictor applies the same
preprocessing as training (features clipped to L2 norm ``clip_bound``), then the linear map.
Post-processing of a private release: using it costs no privacy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from beam_dp.core.clipping import clip_l2
from beam_dp.core.release import Release

__all__ = ["LinearPredictor", "load_model"]


@dataclass(frozen=True)
class LinearPredictor:
    """``scores = clip(X) @ weights.T + intercepts``; classification picks the best class label."""

    weights: np.ndarray
    intercepts: np.ndarray
    kind: str
    clip_bound: float
    labels: tuple = ()

    def decision_function(self, X: Any) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != self.weights.shape[1]:
            raise ValueError(f"expected {self.weights.shape[1]} features, got {X.shape[1]}")
        clipped, _ = clip_l2(X, self.clip_bound)
        return clipped @ self.weights.T + self.intercepts

    def predict_proba(self, X: Any) -> np.ndarray:
        if self.kind != "softmax":
            raise ValueError("predict_proba is defined for softmax models only")
        s = self.decision_function(X)
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        s = self.decision_function(X)
        if self.kind == "softmax":
            return np.asarray(self.labels, dtype=object if any(isinstance(c, str) for c in self.labels) else None)[
                s.argmax(axis=1)]
        return s[:, 0]

    def score(self, X: Any, y: Any) -> float:
        """Accuracy (softmax) or mean squared error (regression)."""
        pred = self.predict(X)
        y = np.asarray(y)
        return float(np.mean(pred == y)) if self.kind == "softmax" else float(np.mean((pred - y) ** 2))


def _as_release(snapshot: Any) -> Release:
    if isinstance(snapshot, Release):
        return snapshot
    from beam_dp.io.readers import row_to_release

    row = snapshot._asdict() if hasattr(snapshot, "_asdict") else dict(snapshot)
    return row_to_release(row)


def load_model(snapshot: Any) -> LinearPredictor:
    """A predictor from a model snapshot (``Release``, ``ReleaseRow`` or row dict)."""
    release = _as_release(snapshot)
    meta = release.meta if isinstance(release.meta, Mapping) else json.loads(release.meta)
    arrays = release.arrays()
    if set(arrays) != {"weights", "intercepts"} or meta.get("model") not in ("softmax", "huber"):
        raise ValueError("not an ERM model snapshot (needs weights, intercepts and meta['model'])")
    labels = tuple(meta.get("labels") or range(arrays["weights"].shape[0]))
    return LinearPredictor(np.asarray(arrays["weights"]), np.asarray(arrays["intercepts"]), meta["model"],
                           float(meta["clip_bound"]), labels)
