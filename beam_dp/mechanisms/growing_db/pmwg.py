"""PMWG: private multiplicative weights for growing databases (Cummings et al., "Differential Privacy for Growing Databases").

Setting. Universe 𝒳 = {0, …, N−1}; one element arrives per time step, so t is both the
time and the database size; the analysis starts at the public size ``n``. A linear query
``f ∈ [0,1]^N`` asked at size t is answered against ``x_t = counts/t``; on ``x_t`` it has L1
sensitivity ``1/t`` (substitution of one element). Neighbouring streams differ in one entry from
some time ``t* ≥ n`` on (an element that arrived before n counts as ``t* = n``).

Mechanism (the dynamic subroutine, the noise function and the constants are the
our reconstruction, "ours"):

* public histogram ``y``: uniform at t = n; *uniform mixing* ``y ← ((t−1)/t)·y + 1/(tN)`` on every
  arrival (uses only the public arrival count); a multiplicative-weights step with learning rate
  ``η = α/6`` on each hard query;
* :class:`DynamicNumericSparse`: a query is tested against the noisy threshold ``T + ξ_t·Z``
  (``T = 2α/3``, ``Z ~ Lap(1)`` drawn once per segment, ``ξ_t = ξ_n (n/t)^a``) with test noise
  ``Lap(2ξ_t)`` per sign; a hard query is answered ``⟨f, x_t⟩ + σ·Lap(4ξ_t)`` and closes the segment;
* the accountant charges each segment ``2.25·s_{t0}`` (``s_t = 1/(t ξ_t)``) up front when it opens
  and *pauses* when the budget cannot cover it: paused queries get ``⟨f, y⟩`` flagged ``unchecked``
  without touching the data.

Guarantee: ε-DP (δ = 0, the costs add) or (ε, δ)-DP (δ > 0, squared costs composed by the CDP
formula ``½S + √(2S ln(1/δ))``) for neighbouring database streams, adaptively chosen queries,
unbounded horizon, for *any* ξ_n: privacy never rests on the accuracy event. ``epsilon_spent`` on
every release is the accountant total, which equals the worst element's spend (attained at t* = n).
Every release declares it as a ``"pmwg"`` account (:func:`pmwg_spend`: n, ξ_n, a, δ, the number of
segments and their :func:`segment_load`), the function the mechanism reports its spend with and
filters segments by (:mod:`beam_dp.core.accounting.growing_db`), so that ``python -m beam_dp.verify``
recomputes it.

Noise keys (each drawn once): ``(<purpose>-threshold, (segment,))``,
``(<purpose>-test, (query_seq, sign_slot))``, ``(<purpose>-answer, (query_seq,))`` where
``query_seq`` counts the queries of the stream in answering order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from beam_dp.core.accounting.growing_db import (
    DEFAULT_SEGMENTS,
    SEGMENT_COST,
    cdp_epsilon,
    charged,
    check_int,
    check_positive,
    planned_xi_n,
    pmwg_spend,
    segment_cost,
    segment_load,
    spent,
)
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.growing_db.base import NEIGHBOURING, GrowingQueryMechanism, Query, dot
from beam_dp.mechanisms.growing_db.universe import clamp_answer

__all__ = ["DynamicNumericSparse", "PMWG", "PMWGState", "relative_entropy"]


def relative_entropy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """RE(x‖y) = Σ x ln(x/y) along the last axis (0 ln 0 = 0)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0) / y), 0.0)
    return terms.sum(axis=-1)


# -- the dynamic NumericSparse subroutine ------------------------------------
class DynamicNumericSparse:
    """Dynamic NumericSparse over 1/t-sensitive queries with a time-rescaled threshold (ours).

    Noise function ``ξ_t = ξ_n (n/t)^a``; normalised sensitivity ``s_t = 1/(t ξ_t)``. A segment opened
    at t0 costs at most ``2.25·s_{t0}`` (AboveThreshold ``2 s`` plus the numeric answer ``s/4``); the
    accountant charges it up front (pure: costs add; δ > 0: squared costs under the CDP formula).
    """

    THRESHOLD_SCALE: ClassVar[float] = 1.0  # Z ~ Lap(1), used as ξ_t·Z
    TEST_SCALE: ClassVar[float] = 2.0  # ν ~ Lap(2 ξ_t)
    ANSWER_SCALE: ClassVar[float] = 4.0  # ω ~ Lap(4 ξ_t)
    SEGMENT_COST: ClassVar[float] = SEGMENT_COST  # × s_{t0}

    def __init__(self, *, n: int, epsilon: float, delta: float, xi_n: float, a: float, purpose: str = "pmwg"):
        self.n, self.epsilon, self.delta, self.xi_n, self.a = n, epsilon, delta, xi_n, a
        self.purpose = purpose

    def xi(self, t: int) -> float:
        return self.xi_n * (self.n / t) ** self.a

    def sensitivity(self, t: int) -> float:
        """Normalised sensitivity s_t = 1/(t ξ_t) of a 1/t-sensitive query divided by ξ_t."""
        return 1.0 / (t * self.xi(t))

    def segment_cost(self, t: int) -> float:
        return segment_cost(t, n=self.n, xi_n=self.xi_n, a=self.a)

    def spent(self, total: float) -> float:
        """ε of an accountant total (pure: the sum of costs; δ > 0: CDP conversion of S = Σ cost²)."""
        return spent(total, self.delta)

    def charged(self, total: float, cost: float) -> float:
        return charged(total, cost, self.delta)

    # keyed draws, each key used once
    def threshold_draw(self, noise: NoiseSource, stream: str, segment: int) -> float:
        return float(noise.laplace(stream, f"{self.purpose}-threshold", (segment,), self.THRESHOLD_SCALE, 1)[0])

    def test_noise(self, noise: NoiseSource, stream: str, seq: int, slot: int, t: int) -> float:
        return float(noise.laplace(stream, f"{self.purpose}-test", (seq, slot), self.TEST_SCALE * self.xi(t), 1)[0])

    def answer_noise(self, noise: NoiseSource, stream: str, seq: int, t: int) -> float:
        return float(noise.laplace(stream, f"{self.purpose}-answer", (seq,), self.ANSWER_SCALE * self.xi(t), 1)[0])



# -- PMWG ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PMWGState:
    """PMWG state. ``counts`` and ``z`` are private; ``y`` and everything else is public.

    ``segments``: (k, 2) int64 rows ``(t0, closing size or -1 while open)``; ``total``: the
    accountant (pure: Σ costs; δ > 0: S = Σ costs²); ``seq``: queries answered so far."""

    STATE_VERSION: ClassVar[int] = 1

    stream: str
    t: int
    counts: np.ndarray
    y: np.ndarray
    open: bool
    t0: int
    z: float
    segment_index: int
    total: float
    hard_count: int
    beta_bound: float
    seq: int
    segments: np.ndarray


class PMWG(GrowingQueryMechanism):
    """Private multiplicative weights for growing databases (see the module docstring).

    Parameters: ``universe_size`` N ≥ 2, starting size ``n`` ≥ 1, ``epsilon`` > 0, ``delta`` ∈ [0, 1),
    accuracy ``alpha`` ∈ (0, 1], noise-decay exponent ``a`` ∈ [0, 1), ``xi_n`` (default
    :func:`planned_xi_n` for ``segments`` planned segments; :func:`worst_case_xi_n` gives the
    §1.5 worst-case noise). Answers are clamped to the query's range ``[min f, max f]`` (post-processing).
    Per-element spend: at most the accountant total, reported as ``epsilon_spent`` (≤ ε always).
    """

    name = "pmwg"
    account_kind = "pmwg"
    spend_function = staticmethod(pmwg_spend)
    state_type = PMWGState

    def __init__(
        self,
        *,
        universe_size: int,
        n: int,
        epsilon: float,
        alpha: float,
        delta: float = 0.0,
        a: float = 0.5,
        xi_n: float | None = None,
        segments: int = DEFAULT_SEGMENTS,
        purpose: str = "pmwg",
        subroutine: type[DynamicNumericSparse] = DynamicNumericSparse,
    ):
        self.universe_size = check_int("universe_size", universe_size, 2)
        self.n = check_int("n", n, 1)
        self.epsilon = check_positive("epsilon", epsilon)
        self.alpha = check_positive("alpha", alpha, upper=1.0)
        if not (isinstance(delta, (int, float, np.floating)) and 0.0 <= delta < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
        if not (isinstance(a, (int, float, np.floating)) and 0.0 <= a < 1.0):
            raise ValueError(f"a must lie in [0, 1), got {a!r}")
        self.delta, self.a = float(delta), float(a)
        #: the K of ξ_n's plan (``None``: ξ_n given), in every release's meta for the verifier's recompute
        self.xi_n_plan = check_int("segments", segments, 1) if xi_n is None else None
        if xi_n is None:
            xi_n = planned_xi_n(self.n, self.epsilon, self.delta, segments)
        self.xi_n = check_positive("xi_n", xi_n)
        self.eta = self.alpha / 6.0
        self.threshold = 2.0 * self.alpha / 3.0
        self.guarantee = Guarantee(self.epsilon, self.delta, neighbouring=NEIGHBOURING)
        self.sub = subroutine(n=self.n, epsilon=self.epsilon, delta=self.delta, xi_n=self.xi_n, a=self.a,
                              purpose=purpose)

    def describe(self) -> dict:
        return {"N": self.universe_size, "n": self.n, "alpha": self.alpha, "a": self.a, "xi_n": self.xi_n,
                "eta": self.eta, "threshold": self.threshold}

    def init_state(self, stream: str) -> PMWGState:
        N = self.universe_size
        return PMWGState(stream=stream, t=0, counts=np.zeros(N, np.int64), y=np.full(N, 1.0 / N), open=False,
                         t0=0, z=0.0, segment_index=0, total=0.0, hard_count=0, beta_bound=0.0, seq=0,
                         segments=np.zeros((0, 2), np.int64))

    # -- arrivals: public mixing, one numpy operation per chunk --------------------
    def _absorb(self, state: PMWGState, elements: np.ndarray, noise: NoiseSource) -> tuple[PMWGState, list[Release]]:
        k = len(elements)
        if k == 0:
            return state, []
        counts = state.counts + np.bincount(elements, minlength=self.universe_size)
        t_new = state.t + k
        y = state.y
        if t_new >= self.n:
            N = self.universe_size
            if state.t < self.n:  # reaches n in this chunk: uniform at n, then mix the rest
                y = np.full(N, 1.0 / N)
                start = self.n
            else:
                y, start = y, state.t
            if t_new > start:
                # t·y_t = (t−1)·y_{t−1} + 1/N per arrival, so t_new·y = start·y + (t_new − start)/N
                y = (start * y + (t_new - start) / N) / t_new
        return replace(state, t=t_new, counts=counts, y=y), []

    # -- queries -------------------------------------------------------------------
    def _account_params(self, state: PMWGState, open_at: int | None = None) -> dict[str, float]:
        """The public parameters of the spend after the segments opened so far (and one opening at
        ``open_at``, the filter's question)."""
        opens = state.segments[:, 0] if open_at is None else np.append(state.segments[:, 0], open_at)
        return {"n": self.n, "xi_n": self.xi_n, "a": self.a, "delta": self.delta, "segments": len(opens),
                "load": segment_load(opens, n=self.n, a=self.a, delta=self.delta)}

    def allows(self, state: PMWGState, t: int) -> bool:
        """May a segment open at size t? Its spend, computed as every release reports it, within ε (the
        filter; public inputs only)."""
        return pmwg_spend(**self._account_params(state, open_at=t))[0] <= self.epsilon

    def _release(self, state: PMWGState, query: Query, f: np.ndarray, answer: float, **meta) -> Release:
        """The answer clamped to the range of ``⟨f, x⟩`` over histograms (post-processing)."""
        eps, delta, declared = self.spend(state)
        info = {"query_id": query.query_id, "t": state.t, "hard": False, "sign": 0, "unchecked": False,
                "segment_index": None, "beta_bound": state.beta_bound, "hard_count": state.hard_count,
                "xi_n_plan": self.xi_n_plan}
        info.update(meta)
        return Release(stream=state.stream, step=state.t, mechanism=self.name, value=np.array([clamp_answer(answer, f)]),
                       epsilon_spent=eps, delta_spent=delta, meta=info, purpose=f"query:{state.seq - 1}",
                       noise=declared)

    def _answer(self, state: PMWGState, query: Query, f: np.ndarray, noise: NoiseSource) -> tuple[PMWGState, list[Release]]:
        t, sub, stream = state.t, self.sub, state.stream
        est = dot(f, state.y)
        seq = state.seq
        if not state.open:
            if not self.allows(state, t):  # paused: post-processing only, no data access
                state = replace(state, seq=seq + 1)
                return state, [self._release(state, query, f, est, unchecked=True)]
            z = sub.threshold_draw(noise, stream, state.segment_index)
            state = replace(
                state, open=True, t0=t, z=z, segment_index=state.segment_index + 1,
                total=sub.charged(state.total, sub.segment_cost(t)),
                beta_bound=state.beta_bound + math.exp(-self.alpha / (6.0 * sub.xi(t))),
                segments=np.vstack([state.segments, np.array([[t, -1]], np.int64)]),
            )
        xi = sub.xi(t)
        truth = dot(f, state.counts) / t  # private
        d = truth - est
        noisy_threshold = self.threshold + xi * state.z
        tail = math.exp(-self.alpha / (12.0 * xi))
        beta = state.beta_bound
        sign = 0
        for slot, sigma in enumerate((1, -1)):
            nu = sub.test_noise(noise, stream, seq, slot, t)
            beta += tail
            if sigma * d + nu >= noisy_threshold:
                sign = sigma
                break
        segment = state.segment_index - 1
        if sign == 0:
            state = replace(state, beta_bound=beta, seq=seq + 1)
            return state, [self._release(state, query, f, est, segment_index=segment)]
        omega = sub.answer_noise(noise, stream, seq, t)
        answer = truth + sign * omega
        r = (1.0 - f) if sign > 0 else f  # y under-estimates (σ = +1) or over-estimates (σ = −1)
        y = state.y * np.exp(-self.eta * r)
        y /= y.sum()
        segments = state.segments.copy()
        segments[-1, 1] = t
        state = replace(state, y=y, open=False, z=0.0, hard_count=state.hard_count + 1, beta_bound=beta + tail,
                        seq=seq + 1, segments=segments)
        return state, [self._release(state, query, f, answer, hard=True, sign=sign, segment_index=segment)]

    # -- public views ----------------------------------------------------------------------------
    def snapshot(self, state: PMWGState) -> Release | None:
        """The public histogram y (a probability vector over 𝒳) as a synthetic-data release."""
        if state.t < self.n:
            return None
        eps, delta, declared = self.spend(state)
        return Release(stream=state.stream, step=state.t, mechanism=f"{self.name}_synthetic", value=state.y,
                       epsilon_spent=eps, delta_spent=delta,
                       meta={"t": state.t, "kind": "synthetic_histogram", "hard_count": state.hard_count,
                             "xi_n_plan": self.xi_n_plan},
                       purpose="synthetic", noise=declared)

    def element_spend(self, state: PMWGState, t_star: np.ndarray) -> np.ndarray:
        """Per-element ε spend recomputed from the segment log (ledger), vectorised over t*."""
        ts = np.maximum(np.asarray(t_star, dtype=np.int64), self.n)
        if len(state.segments) == 0:
            return np.zeros(ts.shape)
        t0 = state.segments[:, 0][None, :]
        close = state.segments[:, 1][None, :]
        covers = (close < 0) | (close >= ts[:, None])
        start = np.maximum(t0, ts[:, None]).astype(np.float64)
        cost = self.sub.SEGMENT_COST * start ** (self.a - 1.0) * self.n ** (-self.a) / self.xi_n
        cost = np.where(covers, cost, 0.0)
        if self.delta == 0.0:
            return cost.sum(axis=1)
        return np.array([cdp_epsilon(s, self.delta) for s in (cost**2).sum(axis=1)])


