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

A loss that is not a sum of such terms (a subsampled-Gaussian accountant, advanced composition of
reruns, an objective perturbation) is declared as *accounts* ``{"kind": ..., <public parameters>}``:
each kind names a function of those parameters returning the account's ``(epsilon, delta)``
(``ACCOUNT_KINDS``, functions of :mod:`beam_dp.core.accounting`), the very function the mechanism used.
A declaration's loss is the basic composition of its accounts and its terms, the terms' Gaussian part
taking the delta the accounts leave (``recomputed_epsilon``).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Callable, NamedTuple

from beam_dp.core.accounting import erm, growing_db, lifelong, regression
from beam_dp.core.calibration import analytic_gaussian_epsilon

__all__ = ["ACCOUNT_KINDS", "GAUSSIAN_LAWS", "PURE_LAWS", "Account", "DeclaredLoss", "NoiseTerm", "account",
           "combined_declaration", "declaration_json", "declared_terms", "loss_of_declaration", "merge_terms",
           "recomputed_epsilon"]

PURE_LAWS = ("gamma", "laplace", "discrete_laplace")
GAUSSIAN_LAWS = ("gaussian",)
NoiseTerm = tuple[str, float, float, float]  # (law, sensitivity, scale, weight)
Account = tuple[str, tuple[tuple[str, float], ...]]  # (kind, its public parameters sorted by name)

#: account kind -> its function in :mod:`beam_dp.core.accounting`: it takes the account's parameters as
#: keywords and returns its ``(epsilon, delta)``, raising ``ValueError`` on parameters out of its range.
ACCOUNT_KINDS: dict[str, Callable[..., tuple[float, float]]] = {
    # ERM sampling variants: K-norm output perturbation on a Bernoulli(p) sample (amplified pure ε)
    "erm_sampled_k_norm": erm.sampled_k_norm_loss,
    # growing databases: PMWG's sparse-vector segments, the schedulers' per-run composition
    "pmwg": growing_db.pmwg_spend,
    "bbscheduler": growing_db.bbscheduler_spend,
    "bbimprover": growing_db.bbimprover_spend,
    # lifelong learners and PRIVINCERM
    "dpsgd": lifelong.dpsgd_spend,
    "dpsgd_pld": lifelong.dpsgd_pld_spend,
    "l2dp_ml": lifelong.l2dp_claim,
    "advanced_composition": regression.advanced_composition,
}


class DeclaredLoss(NamedTuple):
    """A declaration's loss: pure epsilon and Gaussian ``mu^2`` of its terms, and the basic
    composition ``(epsilon, delta)`` of its accounts."""

    pure_epsilon: float
    gaussian_mu_sq: float
    account_epsilon: float = 0.0
    account_delta: float = 0.0


def account(kind: str, **params: float) -> Account:
    """An account of ``kind`` (a key of ``ACCOUNT_KINDS``) with its public parameters."""
    if kind not in ACCOUNT_KINDS:
        raise ValueError(f"unknown account kind {kind!r}; known: {sorted(ACCOUNT_KINDS)}")
    return kind, tuple(sorted((name, float(value)) for name, value in params.items()))


def _account_function(kind: str) -> Callable[..., tuple[float, float]]:
    if kind not in ACCOUNT_KINDS:
        raise ValueError(f"unknown account kind {kind!r}")
    return ACCOUNT_KINDS[kind]


def merge_terms(a: tuple[NoiseTerm, ...], b: tuple[NoiseTerm, ...]) -> tuple[NoiseTerm, ...]:
    """The terms of two losses added: weights of equal (law, sensitivity, scale) summed."""
    if not a or not b:
        return a or b
    merged: dict[tuple[str, float, float], float] = {}
    for law, sensitivity, scale, weight in a + b:
        merged[(law, sensitivity, scale)] = merged.get((law, sensitivity, scale), 0.0) + weight
    return tuple((law, sensitivity, scale, weight) for (law, sensitivity, scale), weight in merged.items())


@functools.lru_cache(maxsize=4096)
def declaration_json(terms: tuple[NoiseTerm, ...], accounts: tuple[Account, ...] = ()) -> str:
    """The ``noise`` column text of ``terms`` and ``accounts`` (``""`` for none); memoised: a
    mechanism's worst loss takes few distinct values."""
    if not terms and not accounts:
        return ""
    text: dict = {"terms": [[law, float(sensitivity), float(scale), float(weight)]
                            for law, sensitivity, scale, weight in sorted(terms)]}
    if accounts:
        text["accounts"] = [{"kind": kind, **dict(params)} for kind, params in accounts]
    return json.dumps(text, sort_keys=True)


def _parsed(text: str) -> tuple[tuple[NoiseTerm, ...], tuple[Account, ...]]:
    data = json.loads(text)
    terms = tuple((str(law), float(s), float(c), float(w)) for law, s, c, w in data["terms"])
    accounts = tuple(account(str(a.pop("kind")), **a) for a in (dict(a) for a in data.get("accounts", ())))
    return terms, accounts


def declared_terms(text: str) -> tuple[tuple[NoiseTerm, ...], tuple[Account, ...]]:
    """The terms and accounts a ``noise`` declaration states, as written (``ValueError`` when malformed;
    :func:`loss_of_declaration` checks their ranges)."""
    try:
        return _parsed(text)
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed noise declaration: {type(exc).__name__}: {exc}") from None


def combined_declaration(*texts: str) -> str:
    """The declaration of a release whose loss is the sum of the losses the declarations ``texts`` state
    (e.g. a model computed from two trees' releases): their terms merged; ``""`` if any declares none
    (a partial declaration would understate the loss)."""
    if not texts or not all(texts):
        return ""
    terms: tuple[NoiseTerm, ...] = ()
    accounts: tuple[Account, ...] = ()
    for text in texts:
        more_terms, more_accounts = _parsed(text)
        terms, accounts = merge_terms(terms, more_terms), accounts + more_accounts
    return declaration_json(terms, accounts)


def loss_of_declaration(text: str) -> DeclaredLoss:
    """The loss recomputed from a ``noise`` declaration; ``ValueError`` when it is malformed (an
    unknown law or account kind, a scale <= 0, a weight <= 0, account parameters out of range) or
    declares nothing (no term and no account: no mechanism writes that, ``""`` is a release without
    a declaration)."""
    try:
        terms, accounts = _parsed(text)
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed noise declaration: {type(exc).__name__}: {exc}") from None
    if not terms and not accounts:
        raise ValueError("an empty noise declaration (no term, no account)")
    pure = mu_sq = account_epsilon = account_delta = 0.0
    for law, sensitivity, scale, weight in terms:
        # a term is a node (or factorization column) the worst-hit element lies in: weight > 0 (a
        # mechanism leaves out the nodes an element is not in, it never writes them with weight 0)
        if not (math.isfinite(sensitivity) and sensitivity > 0 and math.isfinite(scale) and scale > 0
                and math.isfinite(weight) and weight > 0):
            raise ValueError(f"a term ({law}, {sensitivity}, {scale}, {weight}) out of range")
        if law in PURE_LAWS:
            pure += weight * sensitivity / scale
        elif law in GAUSSIAN_LAWS:
            mu_sq += weight * (sensitivity / scale) ** 2
        else:
            raise ValueError(f"unknown noise law {law!r}")
    for kind, params in accounts:
        try:
            epsilon, delta = _account_function(kind)(**dict(params))
        except TypeError as exc:
            raise ValueError(f"account {kind!r}: {exc}") from None
        if not (epsilon >= 0 and 0 <= delta <= 1):
            raise ValueError(f"account {kind!r} recomputes to ({epsilon}, {delta})")
        account_epsilon, account_delta = account_epsilon + epsilon, account_delta + delta
    return DeclaredLoss(pure, mu_sq, account_epsilon, account_delta)


def recomputed_epsilon(loss: DeclaredLoss, delta: float) -> float:
    """Epsilon at ``delta`` of a recomputed loss: its accounts' epsilon plus its terms' at the delta the
    accounts leave (``inf`` when they leave none that a Gaussian part needs, or need more than ``delta``)."""
    remaining = delta - loss.account_delta
    if remaining < -1e-12 * max(delta, 1e-300):
        return math.inf
    epsilon = loss.pure_epsilon + loss.account_epsilon
    if loss.gaussian_mu_sq == 0.0:
        return epsilon
    if remaining <= 0.0:
        return math.inf
    return epsilon + analytic_gaussian_epsilon(math.sqrt(loss.gaussian_mu_sq), remaining)
