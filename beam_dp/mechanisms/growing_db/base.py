"""The growing-database family's base: queries, engine blocks and the driver every mechanism of the
family runs on (PMWG in :mod:`.pmwg`, BBScheduler and BBImprover in :mod:`.schedulers`).

Setting. Universe 𝒳 = {0, …, N−1}; one element arrives per time step, so t is both the time and the
database size; the analysis starts at the public size ``n``. A linear query ``f ∈ [0,1]^N`` asked at
size t is answered against ``x_t = counts/t``. Neighbouring streams (:data:`NEIGHBOURING`) differ in
one entry from some time ``t* ≥ n`` on. A mechanism's spend is a function of public parameters in
:mod:`beam_dp.core.accounting.growing_db`, declared on every release as an account of its kind.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import account, declaration_json
from beam_dp.core.release import Release
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.growing_db.universe import check_elements, check_query

__all__ = ["NEIGHBOURING", "GrowingBlock", "GrowingQueryMechanism", "Query", "dot", "replay_growing"]

NEIGHBOURING = "growing database: substitute one element from its arrival on (t* >= n)"


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """⟨a, b⟩ over N without BLAS: a 1-d BLAS dot can be 500× slower when its threads fight for cores."""
    return float(np.einsum("i,i->", a, b))


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


def replay_growing(mechanism: GrowingQueryMechanism, stream: str, elements: Sequence[np.ndarray],
                   queries: Sequence[Sequence[Query]], noise: NoiseSource) -> tuple[Any, list[Release]]:
    """Drive ``mechanism`` over engine steps (``elements[i]``, ``queries[i]``): the pure reference."""
    state = mechanism.init_state(stream)
    out: list[Release] = []
    for els, qs in zip(elements, queries):
        state, rel = mechanism.step(state, GrowingBlock(np.asarray(els, np.int64), tuple(qs)), noise)
        out.extend(rel)
    return state, out
