"""Black-box schedulers for growing databases: BBScheduler and BBImprover (Cummings et al., "Differential Privacy for Growing Databases").

A **(p, g)-black box** (paper Definition 4) is an ε-DP algorithm ``M(x, ε, α, β, t)`` whose output
answers every query of its class within α with probability ≥ 1 − β whenever
``α ≥ g·(ln(1/β)/(ε t))^p``. Any object meeting :class:`BlackBox` can be scheduled:

* ``run(counts, t, epsilon, alpha, beta, noise: BoxNoise) -> dict[str, ndarray]`` (the synopsis;
  it lives in mechanism state, so it is a dict of arrays) -- must be ``epsilon``-DP for databases of
  size ``t`` under substitution, drawing all randomness from ``noise`` (keyed, each sub-key once);
* ``answer(synopsis, weights) -> float`` and ``histogram(synopsis) -> ndarray | None`` (post-processing);
* attributes ``name``, ``p``, ``g`` (``None`` when no (p, g) is certified).

Provided: :class:`LaplaceHistogram` (discrete Laplace integer counts, an exact (1, 2N(1+ln 2N)) box, the
certified substitute),
:class:`SmallDB` (exact (1/3, g) box, exponential: tiny instances only) and :class:`MWEM`
(no certified (p, g): accuracy claims empirical only).

**BBScheduler** runs M at epochs ``t_i = ⌈(1+γ)^i n⌉`` on the whole database with
``ε_i, α_i, β_i``; a query at size t is answered by the latest run with ``t_i ≤ t``. δ = 0: ``Σ ε_i = ε``
(basic composition); δ > 0: ``Σ ε_i² = S_tot`` (CDP). **BBImprover** runs M at every size
``t ≥ n`` with ``ε_t² = S_tot ln(n−1)(1/ln(t−1) − 1/ln t)`` (telescoping, Σ < S_tot), (ε, δ)-DP. Its runs
are evaluated lazily, only at sizes where a query (or snapshot) needs them: the noise is keyed by t,
so the output equals that of an eager run, and the accountant charges every size regardless.

Neighbouring streams and units as in :mod:`beam_dp.mechanisms.growing_db.base`. ``epsilon_spent`` is the spend
of the worst element (one present from t = n): the runs' ε summed (δ = 0) or CDP-composed (δ > 0),
computed by ``bbscheduler_spend`` (ε, δ, γ, the number of epochs run) or ``bbimprover_spend`` (n, ε, δ,
the size t) of :mod:`beam_dp.core.accounting.growing_db`, which every release declares as an account of the same name
(:mod:`beam_dp.core.noise_declaration`) so that ``python -m beam_dp.verify`` recomputes it.
Noise purposes: ``("bbs", (epoch, sub))`` and ``("bbi", (t, sub))`` (plus ``-gen`` for generators).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol, Sequence

import numpy as np

from beam_dp.core.accounting.growing_db import (
    EpochPlan,
    bbimprover_epsilon,
    bbimprover_spend,
    bbimprover_spent_sq,
    bbscheduler_plan,
    bbscheduler_spend,
    cdp_budget_sq,
    check_int,
    check_positive,
)
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.growing_db.base import NEIGHBOURING, GrowingQueryMechanism, Query, dot
from beam_dp.mechanisms.growing_db.universe import check_query, clamp_answer

__all__ = [
    "BBImprover",
    "BBScheduler",
    "BlackBox",
    "BoxNoise",
    "LaplaceHistogram",
    "MWEM",
    "SchedulerState",
    "SmallDB",
]


# -- the black-box interface -------------------------------------------------------------------
@dataclass(frozen=True)
class BoxNoise:
    """Keyed noise for one black-box run: sub-key ``sub`` must be used for one draw only."""

    noise: NoiseSource
    stream: str
    purpose: str
    index: tuple[int, ...]

    def laplace(self, sub: int, scale: float, size: int) -> np.ndarray:
        return self.noise.laplace(self.stream, self.purpose, self.index + (sub,), scale, size)

    def discrete_laplace(self, sub: int, scale: float, size: int) -> np.ndarray:
        """Integer draws ``P(x) ∝ exp(−|x|/scale)`` (exact on the integers; see docs/reliability.md §6)."""
        return self.noise.discrete_laplace(self.stream, self.purpose, self.index + (sub,), scale, size)

    def generator(self, sub: int) -> np.random.Generator:
        """A keyed generator (for Gumbel/uniform draws), distinct from the Laplace keys."""
        return self.noise.generator(self.stream, f"{self.purpose}-gen", *self.index, sub)


class BlackBox(Protocol):
    name: str
    p: float | None
    g: float | None

    def run(self, counts: np.ndarray, t: int, epsilon: float, alpha: float | None, beta: float,
            noise: BoxNoise) -> dict[str, np.ndarray]: ...

    def answer(self, synopsis: dict[str, np.ndarray], weights: np.ndarray) -> float: ...

    def histogram(self, synopsis: dict[str, np.ndarray]) -> np.ndarray | None: ...


class LaplaceHistogram:
    """Noisy integer histogram: ``c̃ = counts + DLap(2/ε)^N`` (discrete Laplace, L1 sensitivity 2 under
    substitution on the integer counts): ε-DP, and exact on the integers, so the released counts carry
    no floating-point pattern of the data (Mironov 2012). The synopsis is ``x̃ = c̃/t`` (post-processing).

    Answers ``clip(⟨f, x̃⟩, 0, 1)``. A discrete Laplace coordinate has ``P(|ν| > a) < 2e^{−a ε/2}``, so
    ``‖ν‖₁/t ≤ 2N ln(2N/β)/(ε t)`` w.p. ≥ 1−β: a (1, 2N(1 + ln 2N)) box (with the factor 2 of
    the discrete tail).
    """

    name = "laplace_histogram"
    p = 1.0

    def __init__(self, universe_size: int):
        self.N = check_int("universe_size", universe_size, 2)
        self.g = 2.0 * self.N * (1.0 + math.log(2.0 * self.N))

    def run(self, counts, t, epsilon, alpha, beta, noise: BoxNoise) -> dict[str, np.ndarray]:
        noisy_counts = np.asarray(counts, dtype=np.int64) + noise.discrete_laplace(0, 2.0 / epsilon, self.N)
        return {"histogram": noisy_counts / t}

    def answer(self, synopsis, weights) -> float:
        return float(np.clip(dot(weights, synopsis["histogram"]), 0.0, 1.0))

    def histogram(self, synopsis) -> np.ndarray:
        return synopsis["histogram"]


class SmallDB:
    """SmallDB (Blum–Ligett–Roth; Dwork–Roth §4.1) over a finite query class ``queries`` (k × N).

    Range: histograms of all multisets of size ``m = ⌈ln k/α'²⌉`` (α' = α/2); output ∝ exp(ε t u/2) with
    ``u = −max_f |f(x) − f(y)|`` (sensitivity 1/t): ε-DP. (1/3, (16 ln N ln k + 4)^{1/3}) box. Exact
    sampling by enumeration (Gumbel-max); refuses ranges above ``max_range``."""

    name = "smalldb"
    p = 1.0 / 3.0

    def __init__(self, queries: np.ndarray, max_range: int = 10**6):
        q = np.asarray(queries, dtype=np.float64)
        if q.ndim != 2 or q.shape[0] < 2 or q.shape[1] < 2:
            raise ValueError("SmallDB needs a (k >= 2, N >= 2) matrix of queries")
        for row in q:
            check_query(row, q.shape[1])
        self.queries, self.max_range = q, int(max_range)
        self.N, self.k = q.shape[1], q.shape[0]
        self.g = (16.0 * math.log(self.N) * math.log(self.k) + 4.0) ** (1.0 / 3.0)

    def range_size(self, alpha_prime: float) -> tuple[int, int]:
        m = math.ceil(math.log(self.k) / alpha_prime**2)
        return m, math.comb(self.N + m - 1, m)

    def candidates(self, alpha_prime: float) -> np.ndarray:
        """All histograms of multisets of size m over 𝒳, as rows (|𝓡| × N)."""
        m, size = self.range_size(alpha_prime)
        if size > self.max_range:
            raise ValueError(f"SmallDB range has {size} points (> {self.max_range}): instance too large")
        rows = np.zeros((size, self.N))
        for r, combo in enumerate(itertools.combinations_with_replacement(range(self.N), m)):
            np.add.at(rows[r], list(combo), 1.0 / m)
        return rows

    def run(self, counts, t, epsilon, alpha, beta, noise: BoxNoise) -> dict[str, np.ndarray]:
        if alpha is None:
            raise ValueError("SmallDB needs alpha")
        cands = self.candidates(alpha / 2.0)
        x = counts / t
        utility = -np.max(np.abs(cands @ self.queries.T - self.queries @ x), axis=1)
        gumbel = noise.generator(0).gumbel(size=len(cands))
        return {"histogram": cands[int(np.argmax(epsilon * t * utility / 2.0 + gumbel))]}

    def answer(self, synopsis, weights) -> float:
        return dot(weights, synopsis["histogram"])

    def histogram(self, synopsis) -> np.ndarray:
        return synopsis["histogram"]


class MWEM:
    """MWEM (Hardt–Ligett–McSherry 2012) over a finite query class (k × N), ``rounds`` T: each round
    spends ε/(2T) selecting a query (exponential mechanism, score |q(A) − q(x)|, sensitivity 1/t) and
    ε/(2T) measuring it (Lap(2T/(ε t))); output the average of A_1…A_T. ε-DP. **No certified (p, g)**:
    schedule it with an explicit γ; its accuracy is empirical only."""

    name = "mwem"
    p = None
    g = None

    def __init__(self, queries: np.ndarray, rounds: int = 10):
        q = np.asarray(queries, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] < 2 or q.shape[0] < 1:
            raise ValueError("MWEM needs a (k >= 1, N >= 2) matrix of queries")
        for row in q:
            check_query(row, q.shape[1])
        self.queries, self.rounds = q, check_int("rounds", rounds, 1)
        self.N = q.shape[1]

    def run(self, counts, t, epsilon, alpha, beta, noise: BoxNoise) -> dict[str, np.ndarray]:
        T, Q = self.rounds, self.queries
        x = counts / t
        truth = Q @ x  # private
        A = np.full(self.N, 1.0 / self.N)
        total = np.zeros(self.N)
        eps_round = epsilon / (2.0 * T)
        for r in range(T):  # loop over rounds, each a vectorised pass over N
            score = np.abs(Q @ A - truth)
            gumbel = noise.generator(r).gumbel(size=len(Q))
            i = int(np.argmax(eps_round * t * score / 2.0 + gumbel))
            measured = truth[i] + float(noise.laplace(r, 1.0 / (eps_round * t), 1)[0])
            A = A * np.exp(Q[i] * (measured - Q[i] @ A) / 2.0)
            A /= A.sum()
            total += A
        return {"histogram": total / T}

    def answer(self, synopsis, weights) -> float:
        return dot(weights, synopsis["histogram"])

    def histogram(self, synopsis) -> np.ndarray:
        return synopsis["histogram"]


# -- the schedulers ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SchedulerState:
    """``counts`` and ``t`` (private counts, public size); ``synopsis`` (the latest run's output,
    public); ``run`` (epoch i or size t of that run, −1 before any); ``next_epoch`` (BBScheduler)."""

    STATE_VERSION: ClassVar[int] = 1

    stream: str
    t: int
    counts: np.ndarray
    synopsis: dict
    run: int
    next_epoch: int


class _Scheduler(GrowingQueryMechanism):
    purpose: str
    state_type = SchedulerState

    def __init__(self, black_box: BlackBox, universe_size: int, n: int, epsilon: float, delta: float, beta: float,
                 release_runs: bool):
        self.black_box = black_box
        self.universe_size = check_int("universe_size", universe_size, 2)
        self.n = check_int("n", n, 1)
        self.release_runs = bool(release_runs)
        self.guarantee = Guarantee(epsilon, delta, neighbouring=NEIGHBOURING)
        self.beta = beta
        #: public schedule inputs every release's meta states, for the verifier's recompute
        self.plan_meta: dict = {}

    def init_state(self, stream: str) -> SchedulerState:
        return SchedulerState(stream=stream, t=0, counts=np.zeros(self.universe_size, np.int64), synopsis={},
                              run=-1, next_epoch=0)

    def _run(self, state: SchedulerState, run: int, eps: float, alpha: float | None, beta: float,
             noise: NoiseSource) -> tuple[SchedulerState, list[Release]]:
        box_noise = BoxNoise(noise, state.stream, self.purpose, (run,))
        synopsis = self.black_box.run(state.counts, state.t, eps, alpha, beta, box_noise)
        state = replace(state, synopsis={k: np.asarray(v, dtype=np.float64) for k, v in synopsis.items()}, run=run)
        if not self.release_runs:
            return state, []
        hist = self.black_box.histogram(state.synopsis)
        value = hist if hist is not None else state.synopsis
        spent, delta, declared = self.spend(state)
        meta = {"kind": "black_box_run", "run": run, "t": state.t, "black_box": self.black_box.name,
                "epsilon_run": eps, "alpha": alpha, "beta": beta, **self.plan_meta}
        return state, [Release(state.stream, state.t, f"{self.name}_run", value, spent, delta, meta,
                               purpose=f"run:{run}", noise=declared)]

    def _answer(self, state: SchedulerState, query: Query, weights: np.ndarray, noise: NoiseSource):
        state, releases = self._ensure_run(state, noise)
        spent, delta, declared = self.spend(state)
        meta = {"query_id": query.query_id, "t": state.t, "run": state.run, "alpha": self._alpha_of(state.run),
                **self.plan_meta}
        value = np.array([clamp_answer(self.black_box.answer(state.synopsis, weights), weights)])
        return state, releases + [Release(state.stream, state.t, self.name, value, spent, delta, meta,
                                          purpose=f"query:{query.query_id}", noise=declared)]

    def snapshot(self, state: SchedulerState) -> Release | None:
        if state.run < 0:
            return None
        hist = self.black_box.histogram(state.synopsis)
        if hist is None:
            return None
        spent, delta, declared = self.spend(state)
        return Release(state.stream, state.t, f"{self.name}_synthetic", hist, spent, delta,
                       {"t": state.t, "run": state.run, "kind": "synthetic_histogram", **self.plan_meta},
                       purpose="synthetic",
                       noise=declared)

    def _ensure_run(self, state, noise):
        return state, []


class BBScheduler(_Scheduler):
    """BBScheduler: fixed accuracy α_i as data accumulate, runs at ``t_i = ⌈(1+γ)^i n⌉``.

    Guarantee: ε-DP (δ = 0, Σ ε_i = ε) or (ε, δ)-DP (δ > 0, Σ ε_i² = S_tot, CDP) for neighbouring
    database streams. An element arriving at t* is in the runs with t_i ≥ t*; ``epsilon_spent`` is the
    spend of an element present from n: ``Σ_{i ≤ I} ε_i`` (δ = 0) after epoch I."""

    name = "bbscheduler"
    purpose = "bbs"
    account_kind = "bbscheduler"
    spend_function = staticmethod(bbscheduler_spend)

    def __init__(self, black_box: BlackBox, *, universe_size: int, n: int, epsilon: float, beta: float = 0.05,
                 delta: float = 0.0, gamma: float | None = None, release_runs: bool = True):
        self.plan = bbscheduler_plan(n=n, epsilon=epsilon, beta=beta, delta=delta, p=black_box.p, g=black_box.g,
                                     gamma=gamma)
        super().__init__(black_box, universe_size, n, epsilon, delta, beta, release_runs)
        # γ of §3.2 from these (``None``: γ given)
        self.plan_meta = {"gamma_plan": None if gamma is not None else {"n": self.n, "beta": beta, "p": black_box.p,
                                                                          "g": black_box.g}}

    def _alpha_of(self, run: int) -> float | None:
        return self.plan.alpha

    def _account_params(self, state: SchedulerState) -> dict[str, float]:
        return {"epsilon": self.plan.epsilon, "delta": self.plan.delta, "gamma": self.plan.gamma,
                "epochs": state.next_epoch}

    def _absorb(self, state: SchedulerState, elements: np.ndarray, noise: NoiseSource):
        releases: list[Release] = []
        done = 0
        while done < len(elements):
            target = self.plan.epoch_time(state.next_epoch)
            take = min(len(elements) - done, max(target - state.t, 0))
            if take:
                counts = state.counts + np.bincount(elements[done : done + take], minlength=self.universe_size)
                state = replace(state, t=state.t + take, counts=counts)
                done += take
            while state.t == self.plan.epoch_time(state.next_epoch):  # equal rounded epochs all run
                i = state.next_epoch
                state = replace(state, next_epoch=i + 1)
                state, rel = self._run(state, i, self.plan.epsilon_i(i), self.plan.alpha, self.plan.beta_i(i), noise)
                releases.extend(rel)
        return state, releases


class BBImprover(_Scheduler):
    """BBImprover: a run at every size t ≥ n with ε_t (squares telescoping to < S_tot),
    β_t = βn/(t(t+1)), α_t = g (ln(1/β_t)/(ε_t t))^p. (ε, δ)-DP, δ > 0 required; ``epsilon_spent`` at
    size t is the CDP conversion of S(t) = S_tot ln(n−1)(1/ln(n−1) − 1/ln t), charged for every size
    whether or not its (lazy) run was evaluated."""

    name = "bbimprover"
    purpose = "bbi"
    account_kind = "bbimprover"
    spend_function = staticmethod(bbimprover_spend)

    def __init__(self, black_box: BlackBox, *, universe_size: int, n: int, epsilon: float, delta: float,
                 beta: float = 0.05, release_runs: bool = True):
        check_int("n", n, 3)
        epsilon = check_positive("epsilon", epsilon)
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise ValueError(f"BBImprover is (epsilon, delta)-DP: delta must lie in (0, 1), got {delta!r}")
        beta = check_positive("beta", beta, upper=math.exp(-1.0))
        self.s_tot = cdp_budget_sq(epsilon, delta)
        super().__init__(black_box, universe_size, n, epsilon, delta, beta, release_runs)

    def epsilon_t(self, t: int) -> float:
        return float(bbimprover_epsilon(t, self.n, self.s_tot))

    def beta_t(self, t: int) -> float:
        return self.beta * self.n / (t * (t + 1))

    def alpha_t(self, t: int) -> float | None:
        p, g = self.black_box.p, self.black_box.g
        if p is None or g is None:
            return None
        return g * (math.log(1.0 / self.beta_t(t)) / (self.epsilon_t(t) * t)) ** p

    def _alpha_of(self, run: int) -> float | None:
        return self.alpha_t(run) if run >= self.n else None

    def spent_sq(self, t: int) -> float:
        return bbimprover_spent_sq(t, self.n, self.s_tot)

    def _account_params(self, state: SchedulerState) -> dict[str, float]:
        return {"n": self.n, "epsilon": self.guarantee.epsilon, "delta": self.guarantee.delta, "t": state.t}

    def _absorb(self, state: SchedulerState, elements: np.ndarray, noise: NoiseSource):
        counts = state.counts + np.bincount(elements, minlength=self.universe_size)
        return replace(state, t=state.t + len(elements), counts=counts), []

    def _ensure_run(self, state: SchedulerState, noise: NoiseSource):
        if state.run == state.t:
            return state, []
        t = state.t
        return self._run(state, t, self.epsilon_t(t), self.alpha_t(t), self.beta_t(t), noise)


def plan_table(plan: EpochPlan, epochs: int) -> Sequence[tuple[int, float, float]]:
    """``(t_i, ε_i, β_i)`` for the first ``epochs`` epochs (docs and benchmarks)."""
    return [(plan.epoch_time(i), plan.epsilon_i(i), plan.beta_i(i)) for i in range(epochs)]
