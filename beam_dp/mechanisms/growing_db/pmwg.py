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
filters segments by, so that ``python -m beam_dp.verify`` recomputes it.

Noise keys (each drawn once): ``(<purpose>-threshold, (segment,))``,
``(<purpose>-test, (query_seq, sign_slot))``, ``(<purpose>-answer, (query_seq,))`` where
``query_seq`` counts the queries of the stream in answering order.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import account, declaration_json
from beam_dp.core.release import Release
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.growing_db.universe import check_elements, check_query, clamp_answer

__all__ = [
    "DynamicNumericSparse",
    "GrowingBlock",
    "GrowingQueryMechanism",
    "PMWG",
    "PMWGState",
    "Query",
    "DEFAULT_SEGMENTS",
    "cdp_epsilon",
    "cdp_budget_sq",
    "greedy_worst_case_spend",
    "hard_query_bound",
    "planned_xi_n",
    "pmwg_spend",
    "relative_entropy",
    "replay_growing",
    "segment_cost",
    "segment_load",
    "worst_case_xi_n",
]

NEIGHBOURING = "growing database: substitute one element from its arrival on (t* >= n)"


# -- composition helpers -----------------------------------------------------------------------
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


def _check_positive(name: str, value: Any, upper: float | None = None) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0 or (upper is not None and value > upper):
        bound = "" if upper is None else f" and <= {upper}"
        raise ValueError(f"{name} must be a finite number > 0{bound}, got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, low: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


# -- accuracy bookkeeping ----------------------------------------------------------
def hard_query_bound(t: int | np.ndarray, N: int, n: int, alpha: float) -> np.ndarray:
    """H(t) of paper Lemma 6 / Corollary 7: the most hard queries up to size t on the good event."""
    t_arr = np.atleast_1d(np.asarray(t, dtype=np.int64))
    top = int(t_arr.max())
    tau = np.arange(n + 1, max(top, n) + 1, dtype=np.float64)
    growth = math.log(N) / tau + np.log(tau - 1) / tau + np.log(tau / (tau - 1))
    cum = np.concatenate([[0.0], np.cumsum(growth)])
    return (36.0 / alpha**2) * (math.log(N) + cum[np.clip(t_arr - n, 0, None)])


DEFAULT_SEGMENTS = 16


def planned_xi_n(n: int, epsilon: float, delta: float = 0.0, segments: int = DEFAULT_SEGMENTS) -> float:
    """The default ξ_n: the smallest noise under which ``segments`` segments, all opened at the start
    size n (their most expensive time: a segment opened at t costs ``2.25/(t ξ_t)``, decreasing in t
    for a < 1), fit the budget: pure ``2.25·K/(n ε)``; δ > 0 ``2.25·√K/(n·√S)``, S = cdp_budget_sq(ε, δ).
    Public inputs only (n, ε, δ and the constant K), so privacy does not depend on it; segments opened
    later are cheaper, so more than K fit. When the budget is spent the accountant pauses (answers
    from the public histogram, flagged ``unchecked``). K = 16 was chosen on the synthetic stream of
    ``benchmarks/bench_growing_db.py`` (docs/growing_db.md), never on user data."""
    _check_int("segments", segments, 1)
    if delta == 0.0:
        return 2.25 * segments / (n * epsilon)
    return 2.25 * math.sqrt(segments) / (n * math.sqrt(cdp_budget_sq(epsilon, delta)))


def worst_case_xi_n(N: int, n: int, epsilon: float, alpha: float, delta: float = 0.0, a: float = 0.5) -> float:
    """ξ_n (ours, worst case): the accountant never refuses while the subroutine is α/3-accurate (the
    worst case of Lemma 6: noise sized for H(t) hard queries; answers within α only from n ≈ 10^6)."""
    c = 36.0 / alpha**2
    if delta == 0.0:
        K = 1.0 + c * (math.log(N) + (math.log(N * n) + 2.0) / (1.0 - a) + 1.0 / (1.0 - a) ** 2)
        return 2.25 * K / (epsilon * n)
    K = 1.0 + c * (math.log(N) + (math.log(N * n) + 2.0) / (2.0 - 2.0 * a) + 1.0 / (2.0 - 2.0 * a) ** 2)
    return 2.25 * math.sqrt(K) / (n * math.sqrt(cdp_budget_sq(epsilon, delta)))


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """⟨a, b⟩ over N without BLAS: a 1-d BLAS dot can be 500× slower when its threads fight for cores."""
    return float(np.einsum("i,i->", a, b))


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
    SEGMENT_COST: ClassVar[float] = 2.25  # × s_{t0}

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


def segment_cost(t0: float, *, n: float, xi_n: float, a: float) -> float:
    """ε charged for a sparse-vector segment opened at size ``t0``: ``2.25·s_{t0}``, ``s_t = 1/(t ξ_t)``,
    ``ξ_t = ξ_n (n/t)^a`` (:class:`DynamicNumericSparse`)."""
    return DynamicNumericSparse.SEGMENT_COST * (1.0 / (t0 * (xi_n * (n / t0) ** a)))


def _whole(name: str, value: float, low: float) -> int:
    if not (math.isfinite(value) and float(value).is_integer() and value >= low):
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


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
    n, count = _whole("n", n, 1), _whole("segments", segments, 0)
    xi_n = _check_positive("xi_n", xi_n)
    if not (0.0 <= a < 1.0 and 0.0 <= delta < 1.0):
        raise ValueError(f"a and delta must lie in [0, 1), got a = {a!r}, delta = {delta!r}")
    if not (0.0 <= load <= count * (1.0 + 1e-12) and (load > 0.0) == (count > 0)):
        raise ValueError(f"the load of {count} segments lies in (0, {count}], got {load!r}")
    unit = segment_cost(n, n=n, xi_n=xi_n, a=a)  # a segment opened at n: 2.25/(n ξ_n)
    total = load * (unit if delta == 0.0 else unit * unit)
    return spent(total, delta), (delta if delta > 0.0 and total > 0.0 else 0.0)


# -- the shared driver of growing-database mechanisms ------------------------------------------
@dataclass(frozen=True)
class Query:
    """A linear query to answer at database size ``t``: weights ``f ∈ [0,1]^N``, a public id."""

    t: int
    query_id: str
    weights: np.ndarray


@dataclass(frozen=True)
class GrowingBlock:
    """One engine step: ``elements`` (universe indices, in absorption order) and the queries to
    answer during it, each at its size ``t`` (``state.t ≤ t ≤ state.t + len(elements)``)."""

    elements: np.ndarray
    queries: tuple[Query, ...] = ()


class GrowingQueryMechanism(abc.ABC):
    """Drives a growing-database mechanism: absorb elements one size at a time, answer each query
    exactly when the database has its size ``t``. Subclasses implement ``init_state``,
    ``_absorb`` (a chunk of elements, returning releases of runs it triggers) and ``_answer``."""

    name: str
    guarantee: Guarantee
    universe_size: int
    n: int
    state_type: type
    account_kind: ClassVar[str]  # its key of ``ACCOUNT_KINDS``: ``spend_function`` is registered under it
    spend_function: ClassVar[Callable[..., tuple[float, float]]]

    # the interface ----------------------------------------------------------------------------
    def step(self, state: Any, block: GrowingBlock | None, noise: NoiseSource) -> tuple[Any, list[Release]]:
        """Absorb the block's elements in order, answering each query right after its t-th element."""
        if block is None:
            return state, []
        elements = check_elements(block.elements, self.universe_size)
        releases: list[Release] = []
        done = 0
        for query in sorted(block.queries, key=lambda q: q.t):  # stable: same-t queries keep their order
            upto = query.t - state.t
            if upto < 0 or upto > len(elements) - done:
                raise ValueError(f"query at size {query.t} is outside this block")
            if upto > 0:
                state, rel = self._absorb(state, elements[done : done + upto], noise)
                releases.extend(rel)
                done += upto
            state, rel = self.answer(state, query, noise)
            releases.extend(rel)
        if done < len(elements):
            state, rel = self._absorb(state, elements[done:], noise)
            releases.extend(rel)
        return state, releases

    def absorb(self, state: Any, elements: np.ndarray, noise: NoiseSource) -> tuple[Any, list[Release]]:
        """Add elements (universe indices) in order; returns releases of any runs this triggers."""
        return self._absorb(state, check_elements(elements, self.universe_size), noise)

    def answer(self, state: Any, query: Query, noise: NoiseSource) -> tuple[Any, list[Release]]:
        """Answer one query at the current size (``query.t`` must equal ``state.t``)."""
        if query.t != state.t:
            raise ValueError(f"a query for size {query.t} cannot be answered at size {state.t}")
        if state.t < self.n:
            raise ValueError(f"before_start: queries need the database size to be at least n = {self.n}")
        weights = check_query(query.weights, self.universe_size)
        return self._answer(state, query, weights, noise)

    def snapshot(self, state: Any) -> Release | None:
        """The public synthetic histogram as a release (``None`` if there is none yet)."""
        return None

    def spend(self, state: Any) -> tuple[float, float, str]:
        """``(epsilon_spent, delta_spent, noise)`` of a release at ``state``: ``spend_function`` of the
        public parameters ``_account_params(state)``, declared as an account of ``account_kind`` so that
        a verifier recomputes the spend with the very function the mechanism used."""
        params = self._account_params(state)
        epsilon, delta = self.spend_function(**params)
        return epsilon, delta, declaration_json((), (account(self.account_kind, **params),))

    def encode_state(self, state: Any) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> Any:
        return decode_state(self.state_type, data)

    @abc.abstractmethod
    def init_state(self, stream: str) -> Any: ...

    @abc.abstractmethod
    def _account_params(self, state: Any) -> dict[str, float]: ...

    @abc.abstractmethod
    def _absorb(self, state: Any, elements: np.ndarray, noise: NoiseSource) -> tuple[Any, list[Release]]: ...

    @abc.abstractmethod
    def _answer(self, state: Any, query: Query, weights: np.ndarray, noise: NoiseSource) -> tuple[Any, list[Release]]: ...


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
        self.universe_size = _check_int("universe_size", universe_size, 2)
        self.n = _check_int("n", n, 1)
        self.epsilon = _check_positive("epsilon", epsilon)
        self.alpha = _check_positive("alpha", alpha, upper=1.0)
        if not (isinstance(delta, (int, float, np.floating)) and 0.0 <= delta < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
        if not (isinstance(a, (int, float, np.floating)) and 0.0 <= a < 1.0):
            raise ValueError(f"a must lie in [0, 1), got {a!r}")
        self.delta, self.a = float(delta), float(a)
        if xi_n is None:
            xi_n = planned_xi_n(self.n, self.epsilon, self.delta, segments)
        self.xi_n = _check_positive("xi_n", xi_n)
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
                "segment_index": None, "beta_bound": state.beta_bound, "hard_count": state.hard_count}
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
                       meta={"t": state.t, "kind": "synthetic_histogram", "hard_count": state.hard_count},
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
    cost = 2.25 * opens ** (a - 1.0) * n ** (-a) / xi_n
    return float(cost.sum()) if delta == 0.0 else cdp_epsilon(float((cost**2).sum()), delta)


def replay_growing(mechanism: GrowingQueryMechanism, stream: str, elements: Sequence[np.ndarray],
                   queries: Sequence[Sequence[Query]], noise: NoiseSource) -> tuple[Any, list[Release]]:
    """Drive ``mechanism`` over engine steps (``elements[i]``, ``queries[i]``): the pure reference."""
    state = mechanism.init_state(stream)
    out: list[Release] = []
    for els, qs in zip(elements, queries):
        state, rel = mechanism.step(state, GrowingBlock(np.asarray(els, np.int64), tuple(qs)), noise)
        out.extend(rel)
    return state, out
