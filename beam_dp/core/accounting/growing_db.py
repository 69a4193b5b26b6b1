"""Spend of the growing-database mechanisms (PMWG, BBScheduler, BBImprover): pure functions of public
parameters, the very functions the mechanisms report their spend with and the verifier recomputes a
declared account with (kinds ``"pmwg"``, ``"bbscheduler"``, ``"bbimprover"``).

Units: ε in nats of privacy loss, δ a probability; database sizes ``n``, ``t`` are counts of elements
(one arrives per time step). Pure costs add (δ = 0); with δ > 0 squared costs compose by the CDP
formula (:func:`cdp_epsilon`). Neighbouring streams: substitute one element from its arrival on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_SEGMENTS",
    "SEGMENT_COST",
    "EpochPlan",
    "bbimprover_epsilon",
    "bbimprover_spend",
    "bbimprover_spent_sq",
    "bbscheduler_plan",
    "bbscheduler_spend",
    "cdp_budget_sq",
    "cdp_epsilon",
    "charged",
    "check_int",
    "check_positive",
    "greedy_worst_case_spend",
    "hard_query_bound",
    "planned_xi_n",
    "pmwg_spend",
    "segment_cost",
    "segment_load",
    "spent",
    "whole_number",
    "worst_case_xi_n",
]

#: ε of a sparse-vector segment opened at t0, in units of ``s_{t0} = 1/(t0 ξ_{t0})``: AboveThreshold's
#: ``2 s`` plus the numeric answer's ``s/4``
SEGMENT_COST = 2.25
#: the default number K of segments PMWG's default noise plans for (:func:`planned_xi_n`)
DEFAULT_SEGMENTS = 16


# -- checks of public parameters -----------------------------------------------------------------
def check_positive(name: str, value: Any, upper: float | None = None) -> float:
    """``value`` as a float if it is a finite number > 0 (and <= ``upper``); ``ValueError`` otherwise."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0 or (upper is not None and value > upper):
        bound = "" if upper is None else f" and <= {upper}"
        raise ValueError(f"{name} must be a finite number > 0{bound}, got {value!r}")
    return float(value)


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` if it is an integer >= ``low`` (not a bool); ``ValueError`` otherwise."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def whole_number(name: str, value: float, low: float) -> int:
    """``value`` as an int if it is a whole number >= ``low`` (a count read back from JSON as a float)."""
    if not (math.isfinite(value) and float(value).is_integer() and value >= low):
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


# -- composition ---------------------------------------------------------------------------------
def cdp_epsilon(sum_sq: float, delta: float) -> float:
    """CDP conversion (paper Theorem 4): pieces with ε_i-DP compose to ``½S + √(2S ln(1/δ))``, S = Σε_i²."""
    if sum_sq <= 0.0:
        return 0.0
    return 0.5 * sum_sq + math.sqrt(2.0 * sum_sq * math.log(1.0 / delta))


def cdp_budget_sq(epsilon: float, delta: float) -> float:
    """The largest S with ``cdp_epsilon(S, δ) = ε``: ``(√(2 ln(1/δ) + 2ε) − √(2 ln(1/δ)))²``."""
    L = 2.0 * math.log(1.0 / delta)
    return (math.sqrt(L + 2.0 * epsilon) - math.sqrt(L)) ** 2


def charged(total: float, cost: float, delta: float) -> float:
    """An accountant total after charging a piece of ``cost``-DP: pure (δ = 0) costs add; δ > 0 sums
    the squared costs (the S of :func:`cdp_epsilon`)."""
    return total + cost if delta == 0.0 else total + cost * cost


def spent(total: float, delta: float) -> float:
    """ε of an accountant total built by :func:`charged` (pure: the sum; δ > 0: CDP conversion of S)."""
    return total if delta == 0.0 else cdp_epsilon(total, delta)


# -- PMWG ----------------------------------------------------------------------------------------
def hard_query_bound(t: int | np.ndarray, N: int, n: int, alpha: float) -> np.ndarray:
    """H(t) of paper Lemma 6 / Corollary 7: the most hard queries up to size t on the good event."""
    t_arr = np.atleast_1d(np.asarray(t, dtype=np.int64))
    top = int(t_arr.max())
    tau = np.arange(n + 1, max(top, n) + 1, dtype=np.float64)
    growth = math.log(N) / tau + np.log(tau - 1) / tau + np.log(tau / (tau - 1))
    cum = np.concatenate([[0.0], np.cumsum(growth)])
    return (36.0 / alpha**2) * (math.log(N) + cum[np.clip(t_arr - n, 0, None)])


def planned_xi_n(n: int, epsilon: float, delta: float = 0.0, segments: int = DEFAULT_SEGMENTS) -> float:
    """The default ξ_n: the smallest noise under which ``segments`` segments, all opened at the start
    size n (their most expensive time: a segment opened at t costs ``2.25/(t ξ_t)``, decreasing in t
    for a < 1), fit the budget: pure ``2.25·K/(n ε)``; δ > 0 ``2.25·√K/(n·√S)``, S = cdp_budget_sq(ε, δ).
    Public inputs only (n, ε, δ and the constant K), so privacy does not depend on it; segments opened
    later are cheaper, so more than K fit. When the budget is spent the accountant pauses (answers
    from the public histogram, flagged ``unchecked``). K = 16 was chosen on the synthetic stream of
    ``benchmarks/bench_growing_db.py`` (docs/growing_db.md), never on user data."""
    check_int("segments", segments, 1)
    if delta == 0.0:
        return SEGMENT_COST * segments / (n * epsilon)
    return SEGMENT_COST * math.sqrt(segments) / (n * math.sqrt(cdp_budget_sq(epsilon, delta)))


def worst_case_xi_n(N: int, n: int, epsilon: float, alpha: float, delta: float = 0.0, a: float = 0.5) -> float:
    """ξ_n (ours, worst case): the accountant never refuses while the subroutine is α/3-accurate (the
    worst case of Lemma 6: noise sized for H(t) hard queries; answers within α only from n ≈ 10^6)."""
    c = 36.0 / alpha**2
    if delta == 0.0:
        K = 1.0 + c * (math.log(N) + (math.log(N * n) + 2.0) / (1.0 - a) + 1.0 / (1.0 - a) ** 2)
        return SEGMENT_COST * K / (epsilon * n)
    K = 1.0 + c * (math.log(N) + (math.log(N * n) + 2.0) / (2.0 - 2.0 * a) + 1.0 / (2.0 - 2.0 * a) ** 2)
    return SEGMENT_COST * math.sqrt(K) / (n * math.sqrt(cdp_budget_sq(epsilon, delta)))


def segment_cost(t0: float, *, n: float, xi_n: float, a: float) -> float:
    """ε charged for a sparse-vector segment opened at size ``t0``: ``2.25·s_{t0}``, ``s_t = 1/(t ξ_t)``,
    ``ξ_t = ξ_n (n/t)^a``."""
    return SEGMENT_COST * (1.0 / (t0 * (xi_n * (n / t0) ** a)))


def segment_load(opens: np.ndarray, *, n: float, a: float, delta: float) -> float:
    """The accountant total of segments opened at the sizes ``opens``, in units of a segment opened at
    n: ``Σ (n/t0)^{1−a}`` (δ = 0, the costs' sum over ``segment_cost(n)``) or ``Σ (n/t0)^{2(1−a)}``
    (δ > 0, their squares' sum over its square); each term is at most 1."""
    power = (1.0 - a) * (1.0 if delta == 0.0 else 2.0)
    return float(np.sum((n / np.asarray(opens, dtype=np.float64)) ** power))


def pmwg_spend(*, n: float, xi_n: float, a: float, delta: float, segments: float, load: float
               ) -> tuple[float, float]:
    """PMWG's accountant: ``(ε, δ)`` spent by an element in all ``segments`` sparse-vector segments
    opened so far (the worst one, present from n), of :func:`segment_load` ``load``: each segment opened
    at t0 is charged :func:`segment_cost` = ``segment_cost(n)·(n/t0)^{1−a}``; δ = 0 the costs add, δ > 0
    their squares compose by CDP. The mechanism reports its spend and filters segments with this
    function and declares its parameters (a ``"pmwg"`` account, :mod:`beam_dp.core.noise_declaration`),
    all public: the start size, the noise function, and a load of the opening sizes (a segment opens at
    the first checked query after the released hard answer closing the last). ``ValueError`` on
    parameters out of range (a load above the number of segments: no segment opened before n)."""
    n, count = whole_number("n", n, 1), whole_number("segments", segments, 0)
    xi_n = check_positive("xi_n", xi_n)
    if not (0.0 <= a < 1.0 and 0.0 <= delta < 1.0):
        raise ValueError(f"a and delta must lie in [0, 1), got a = {a!r}, delta = {delta!r}")
    if not (0.0 <= load <= count * (1.0 + 1e-12) and (load > 0.0) == (count > 0)):
        raise ValueError(f"the load of {count} segments lies in (0, {count}], got {load!r}")
    unit = segment_cost(n, n=n, xi_n=xi_n, a=a)  # a segment opened at n: 2.25/(n ξ_n)
    total = load * (unit if delta == 0.0 else unit * unit)
    return spent(total, delta), (delta if delta > 0.0 and total > 0.0 else 0.0)


def greedy_worst_case_spend(N: int, n: int, alpha: float, epsilon: float, horizon: int, *, delta: float = 0.0,
                            a: float = 0.5, xi_n: float | None = None) -> float:
    """ε spent by the accountant's worst case up to ``horizon``: hard queries as
    early as H(t) allows, each segment opening at the previous hard query (the first at n), plus the
    segment open at the end."""
    xi_n = worst_case_xi_n(N, n, epsilon, alpha, delta, a) if xi_n is None else xi_n
    H = np.floor(hard_query_bound(np.arange(n, horizon + 1), N, n, alpha) + 1e-9)
    k = np.arange(1, int(H[-1]) + 1)
    hard_times = n + np.searchsorted(H, k, side="left")  # first t with H(t) >= k
    opens = np.concatenate([[n], hard_times]).astype(np.float64)  # segment k opens at hard query k−1
    cost = SEGMENT_COST * opens ** (a - 1.0) * n ** (-a) / xi_n
    return float(cost.sum()) if delta == 0.0 else cdp_epsilon(float((cost**2).sum()), delta)


# -- BBScheduler ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpochPlan:
    """BBScheduler's public schedule: γ, x, the per-epoch ε_i (closed form), β_i, α_i."""

    n: int
    epsilon: float
    delta: float
    beta: float
    gamma: float
    c: float  # δ > 0: ε_i = c (i+1)/(1+γ)^i
    alpha: float | None

    def epoch_time(self, i: int) -> int:
        return math.ceil(self.n * (1.0 + self.gamma) ** i - 1e-9)

    def epsilon_i(self, i: int) -> float:
        return _epoch_epsilon(i, self.epsilon, self.delta, self.gamma, self.c)

    def beta_i(self, i: int) -> float:
        return (self.beta / (1.0 + self.beta)) ** (i + 1)

    def spent_after(self, last: int) -> float:
        """Worst element's ε after epochs 0..last (:func:`bbscheduler_spend`)."""
        return bbscheduler_spend(epsilon=self.epsilon, delta=self.delta, gamma=self.gamma, epochs=last + 1)[0]


def _epoch_epsilon(i: int, epsilon: float, delta: float, gamma: float, c: float) -> float:
    """BBScheduler's ε_i: ``γ²(i+1)ε/(1+γ)^{i+2}`` (δ = 0) or ``c(i+1)/(1+γ)^i`` (δ > 0)."""
    x = 1.0 / (1.0 + gamma)  # powers of x underflow to 0 harmlessly; (1+γ)^i would overflow
    if delta == 0.0:
        return gamma**2 * (i + 1) * epsilon * x ** (i + 2)
    return c * (i + 1) * x**i


def _cdp_rate(epsilon: float, delta: float, gamma: float) -> float:
    """The δ > 0 constant c of ε_i = c(i+1)/(1+γ)^i: Σ_i ε_i² = S_tot = cdp_budget_sq(ε, δ)."""
    x = (1.0 + gamma) ** -2
    return math.sqrt(cdp_budget_sq(epsilon, delta) * (1 - x) ** 3 / (1 + x))


def bbscheduler_spend(*, epsilon: float, delta: float, gamma: float, epochs: float) -> tuple[float, float]:
    """BBScheduler's ``(ε, δ)`` spent by an element in the first ``epochs`` runs (the worst one, present
    from n), for the transform's budget ``(epsilon, delta)`` and epoch growth ``gamma`` (all public):
    δ = 0 the closed form ``ε[1 − (I+2)x^{I+1} + (I+1)x^{I+2}]`` of ``Σ_{i ≤ I} ε_i`` (x = 1/(1+γ),
    I = epochs − 1); δ > 0 the CDP conversion of ``Σ_{i ≤ I} ε_i²``. ``ValueError`` out of range."""
    epsilon, gamma = check_positive("epsilon", epsilon), check_positive("gamma", gamma)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    last = whole_number("epochs", epochs, 0) - 1
    if last < 0:
        return 0.0, 0.0
    if delta == 0.0:
        x = 1.0 / (1.0 + gamma)
        return epsilon * (1.0 - (last + 2) * x ** (last + 1) + (last + 1) * x ** (last + 2)), 0.0
    c = _cdp_rate(epsilon, delta, gamma)
    return cdp_epsilon(sum(_epoch_epsilon(i, epsilon, delta, gamma, c) ** 2 for i in range(last + 1)), delta), delta


def bbscheduler_plan(*, n: int, epsilon: float, beta: float, delta: float = 0.0, p: float | None = None,
                     g: float | None = None, gamma: float | None = None) -> EpochPlan:
    """Validate and build BBScheduler's schedule (γ/§3.2 unless given)."""
    n = check_int("n", n, 1)
    epsilon = check_positive("epsilon", epsilon)
    beta = check_positive("beta", beta, upper=math.exp(-1.0))
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    if gamma is None:
        if p is None or g is None:
            raise ValueError("a black box without a certified (p, g) needs an explicit gamma")
        if delta == 0.0:
            gamma = g ** (1 / (2 * p + 1)) * (math.log(1 / beta) / (epsilon * n)) ** (p / (2 * p + 1))
        else:
            gamma = g ** (1 / (1.5 * p + 1)) * (math.sqrt(math.log(1 / delta)) * math.log(1 / beta)
                                                / (epsilon * n)) ** (p / (1.5 * p + 1))
    gamma = check_positive("gamma", gamma)
    c = 0.0
    alpha = None
    if delta == 0.0:
        if p is not None and g is not None:
            alpha = g * ((1 + gamma) ** 2 * math.log((1 + beta) / beta) / (gamma**2 * epsilon * n)) ** p
    else:
        c = _cdp_rate(epsilon, delta, gamma)
        if p is not None and g is not None:
            alpha = g * (math.log((1 + beta) / beta) / (c * n)) ** p
    return EpochPlan(n, epsilon, float(delta), beta, gamma, c, alpha)


# -- BBImprover ----------------------------------------------------------------------------------
def bbimprover_epsilon(t: int | np.ndarray, n: int, s_tot: float) -> np.ndarray:
    """ε_t = √(S_tot ln(n−1) (1/ln(t−1) − 1/ln t)) for t ≥ n ≥ 3."""
    t = np.asarray(t, dtype=np.float64)
    return np.sqrt(s_tot * math.log(n - 1) * (1.0 / np.log(t - 1.0) - 1.0 / np.log(t)))


def bbimprover_spent_sq(t: int, n: int, s_tot: float) -> float:
    """S(t) = Σ_{n ≤ τ ≤ t} ε_τ² = S_tot ln(n−1)(1/ln(n−1) − 1/ln t) (0 before n)."""
    if t < n:
        return 0.0
    return s_tot * math.log(n - 1) * (1.0 / math.log(n - 1) - 1.0 / math.log(t))


def bbimprover_spend(*, n: float, epsilon: float, delta: float, t: float) -> tuple[float, float]:
    """BBImprover's ``(ε, δ)`` at size ``t``: the CDP conversion of S(t), a run charged at every size
    n ≤ τ ≤ t whether or not it was evaluated, for start size ``n`` and budget ``(epsilon, delta)``
    (all public, t the public database size). ``ValueError`` out of range."""
    n, t = whole_number("n", n, 3), whole_number("t", t, 0)
    epsilon = check_positive("epsilon", epsilon)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    s = bbimprover_spent_sq(t, n, cdp_budget_sq(epsilon, delta))
    return cdp_epsilon(s, delta), (delta if s > 0 else 0.0)
