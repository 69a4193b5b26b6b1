"""A release's noise declaration: what the worst-hit element's noise was, so that anyone holding the
release can recompute its spend (``python -m beam_dp.verify`` does).

A declaration is a list of terms ``(law, sensitivity, scale, weight)``: the worst-hit element so far
lies in noise of law ``law`` (``"gamma"``, ``"laplace"``, ``"discrete_laplace"``: pure epsilon-DP;
``"gaussian"``) of scale ``scale`` (the K-norm/Laplace ``c`` or the Gaussian ``sigma``), at L2
sensitivity ``sensitivity`` (``Δ₂ = 2R``), ``weight`` times (a number of tree nodes, or a
factorization's squared column norm). Its loss is the pure part ``Σ weight·Δ₂/scale`` plus the
Gaussian part ``mu² = Σ weight·(Δ₂/scale)²``, reported at the release's delta by basic composition
(``beam_dp.core.guarantee.ElementLoss``). Mechanisms fill it where they build the loss from their
node noise (``ElementLoss.of_noise``); rows carry it as JSON text in the ``noise`` column (``""``:
the mechanism declares none).
"""

from __future__ import annotations

import functools
import json
import math

from beam_dp.core.calibration import analytic_gaussian_epsilon

__all__ = ["GAUSSIAN_LAWS", "PURE_LAWS", "NoiseTerm", "combined_declaration", "declaration_json",
           "loss_of_declaration", "merge_terms", "recomputed_epsilon"]

PURE_LAWS = ("gamma", "laplace", "discrete_laplace")
GAUSSIAN_LAWS = ("gaussian",)
NoiseTerm = tuple[str, float, float, float]  # (law, sensitivity, scale, weight)


def merge_terms(a: tuple[NoiseTerm, ...], b: tuple[NoiseTerm, ...]) -> tuple[NoiseTerm, ...]:
    """The terms of two losses added: weights of equal (law, sensitivity, scale) summed."""
    if not a or not b:
        return a or b
    merged: dict[tuple[str, float, float], float] = {}
    for law, sensitivity, scale, weight in a + b:
        merged[(law, sensitivity, scale)] = merged.get((law, sensitivity, scale), 0.0) + weight
    return tuple((law, sensitivity, scale, weight) for (law, sensitivity, scale), weight in merged.items())


@functools.lru_cache(maxsize=4096)
def declaration_json(terms: tuple[NoiseTerm, ...]) -> str:
    """The ``noise`` column text of ``terms`` (``""`` for none); memoised: a mechanism's worst loss takes
    few distinct values."""
    if not terms:
        return ""
    return json.dumps({"terms": [[law, float(sensitivity), float(scale), float(weight)]
                                 for law, sensitivity, scale, weight in sorted(terms)]}, sort_keys=True)


def combined_declaration(*texts: str) -> str:
    """The declaration of a release whose loss is the sum of the losses the declarations ``texts`` state
    (e.g. a model computed from two trees' releases): their terms merged; ``""`` if any declares none
    (a partial declaration would understate the loss)."""
    if not texts or not all(texts):
        return ""
    terms: tuple[NoiseTerm, ...] = ()
    for text in texts:
        terms = merge_terms(terms, tuple((str(law), float(s), float(c), float(w))
                                         for law, s, c, w in json.loads(text)["terms"]))
    return declaration_json(terms)


def loss_of_declaration(text: str) -> tuple[float, float]:
    """``(pure_epsilon, gaussian_mu_sq)`` recomputed from a ``noise`` declaration; ``ValueError`` when
    it is malformed (an unknown law, a scale <= 0, a negative weight)."""
    try:
        terms = json.loads(text)["terms"]
        pure = mu_sq = 0.0
        for law, sensitivity, scale, weight in terms:
            sensitivity, scale, weight = float(sensitivity), float(scale), float(weight)
            if not (math.isfinite(sensitivity) and sensitivity > 0 and math.isfinite(scale) and scale > 0
                    and math.isfinite(weight) and weight >= 0):
                raise ValueError(f"a term ({law}, {sensitivity}, {scale}, {weight}) out of range")
            if law in PURE_LAWS:
                pure += weight * sensitivity / scale
            elif law in GAUSSIAN_LAWS:
                mu_sq += weight * (sensitivity / scale) ** 2
            else:
                raise ValueError(f"unknown noise law {law!r}")
        return pure, mu_sq
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed noise declaration: {type(exc).__name__}") from None


def recomputed_epsilon(pure_epsilon: float, gaussian_mu_sq: float, delta: float) -> float:
    """Epsilon at ``delta`` of a recomputed loss (``inf`` for a Gaussian part at delta 0)."""
    if gaussian_mu_sq == 0.0:
        return pure_epsilon
    if delta <= 0.0:
        return math.inf
    return pure_epsilon + analytic_gaussian_epsilon(math.sqrt(gaussian_mu_sq), delta)
