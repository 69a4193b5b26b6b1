"""The mechanism interface and the shared machinery of continual vector sums.

Every mechanism is a pure state machine (ARCHITECTURE §3)::

    state = mech.init_state(stream)
    state, releases = mech.step(state, block, noise)   # one public step t = 1, 2, ...

``state`` is a frozen dataclass of numpy arrays and ints with a versioned byte encoding
(``encode_state``/``decode_state``); ``step`` is pure given ``(state, block, noise key)``.

``ContinualSumMechanism`` is the base of the prefix-sum family (binary tree, hybrid, doubling,
window tree). Its ``block`` for one step is either a ``ClippedSum`` (made by ``clip_and_sum``; the
Beam adapter pre-aggregates with it) or a raw array of contributions ``(d,)``/``(n, d)`` that the
mechanism clips to ``clip_bound`` and sums itself. Neighbouring streams differ in one
contribution (replace-one: its value and its step may change); since every contribution is
clipped to L2 norm ``R``, node values move by at most ``Δ₂ = 2R`` in total.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Generic, Literal, Mapping, Protocol, TypeVar

import numpy as np

from beam_dp.core.calibration import analytic_gaussian_sigma, certify_gaussian
from beam_dp.core.clipping import clip_l2
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, spends
from beam_dp.core.limits import (
    EPSILON_RANGE,
    MAX_DIM,
    MAX_SCALE,
    MIN_SCALE,
    check_choice,
    check_count,
    check_delta,
    check_number,
)
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.core.state import decode_state, encode_state

__all__ = ["CALIBRATIONS", "NOISE_LAWS", "ClippedSum", "ContinualSumMechanism", "FreshGroups", "GroupState", "GroupSteppedSum",
           "Mechanism", "NodeNoise", "SumSpec"]

StateT = TypeVar("StateT")
NoiseLaw = Literal["gamma", "gaussian", "discrete_laplace"]
Calibration = Literal["paper", "analytic"]
NOISE_LAWS: tuple[NoiseLaw, ...] = ("gamma", "gaussian", "discrete_laplace")
CALIBRATIONS: tuple[Calibration, ...] = ("paper", "analytic")


class Mechanism(Protocol[StateT]):
    """What the engine adapters drive. See the module docstring."""

    name: str
    guarantee: Guarantee

    def init_state(self, stream: str) -> StateT: ...

    def step(self, state: StateT, block: Any, noise: NoiseSource) -> tuple[StateT, list[Release]]: ...

    def encode_state(self, state: StateT) -> bytes: ...

    def decode_state(self, data: bytes) -> StateT: ...

    def merge_blocks(self, items: list) -> Any:
        """The block of one step from the items an adapter buffered for it, in arrival order."""
        ...

    def block_count(self, item: Any) -> int:
        """Number of contributions in one buffered item (count steps)."""
        ...


@dataclass(frozen=True)
class ClippedSum:
    """Sum of already-clipped contributions of one step, with public-to-the-operator counts.

    Only ``ContinualSumMechanism.clip_and_sum`` and ``merge`` make these, so a ``ClippedSum`` is
    always a sum of vectors of norm <= R. ``count``/``clipped`` feed metrics, never releases.
    """

    vector: np.ndarray
    count: int
    clipped: int

    def merge(self, other: "ClippedSum") -> "ClippedSum":
        return ClippedSum(self.vector + other.vector, self.count + other.count, self.clipped + other.clipped)


_CELL_LAW = {"gamma": "k_norm", "gaussian": "gaussian", "discrete_laplace": "discrete_laplace"}


@dataclass(frozen=True)
class NodeNoise:
    """The noise law of one node: ``law`` in {"gamma", "gaussian", "discrete_laplace"} and its ``scale``
    (Gamma/discrete-Laplace ``c`` or Gaussian ``sigma``).

    ``"discrete_laplace"`` draws integers with ``P(x) ∝ exp(−|x|/c)`` per coordinate and is charged the
    pure ``Δ₂/c``: valid only when node values are integers and a neighbour moves a node by an integer
    of absolute value ``<= Δ₂`` (dim 1, integer contributions, integer ``R``; see
    ``ContinualSumMechanism``).
    """

    law: NoiseLaw
    scale: float
    calibration: str = "exact"

    def charge(self, first: int, last: int, sensitivity: float, label: str = "") -> Charge:
        """The ledger charge of one node covering steps ``first..last``."""
        if self.law in ("gamma", "discrete_laplace"):
            return Charge.pure(first, last, sensitivity / self.scale, label)
        return Charge.gaussian(first, last, sensitivity, self.scale, label)

    def draw(self, noise: NoiseSource, stream: str, purpose: str, index: tuple[int, ...], dim: int) -> np.ndarray:
        return self.draw_group(noise, (stream,), purpose, index, dim)[0]

    def draw_group(self, noise: NoiseSource, streams: Sequence[str], purpose: str, index: tuple[int, ...], dim: int) -> np.ndarray:
        """The node ``(purpose, index)`` of every stream in ``streams``: ``(len(streams), dim)`` floats."""
        law = _CELL_LAW[self.law]
        return np.asarray(noise.draw_cells(law, streams, purpose, index, self.scale, dim), dtype=np.float64)

    def draw_nodes(
        self, noise: NoiseSource, streams: Sequence[str], purpose: str, indices: Sequence[tuple[int, ...]], dim: int
    ) -> np.ndarray:
        """The nodes ``(purpose, indices[j])`` of every stream in one batch of cells: ``(len(streams),
        len(indices), dim)`` floats, entry ``[i, j]`` equal to ``draw_group(..., indices[j], ...)[i]``."""
        rows = np.tile(np.asarray(indices, dtype=np.int64), (len(streams), 1))
        cells = noise.draw_cells(_CELL_LAW[self.law], [s for s in streams for _ in indices], purpose, rows, self.scale, dim)
        return np.asarray(cells, dtype=np.float64).reshape(len(streams), len(indices), dim)

    def draw_step(
        self, noise: NoiseSource, streams: Sequence[str], purpose: str, t: int,
        cells_of: Callable[[int], Sequence[tuple[int, ...]]], dim: int,
    ) -> np.ndarray:
        """``draw_nodes`` of the nodes ``cells_of(t)`` of step ``t``; a view that draws steps ahead
        (:class:`~beam_dp.core.noise_ahead.StepsAhead`) draws those of its next steps with them."""
        ahead = getattr(noise, "draw_steps", None)
        if ahead is None:
            return self.draw_nodes(noise, streams, purpose, cells_of(t), dim)
        return np.asarray(ahead(_CELL_LAW[self.law], streams, purpose, t, cells_of, self.scale, dim), dtype=np.float64)


@dataclass(frozen=True)
class SumSpec:
    """The public parameters every continual-sum mechanism shares, checked once (``beam_dp.core.limits``).

    Neighbouring streams differ in one contribution (replace-one), every contribution is clipped to L2
    norm ``clip_bound``, so a step vector moves by at most ``Δ₂ = 2R`` (:attr:`sensitivity`).

    ``noise="discrete_laplace"`` (integer-valued releases, pure ``ε``; what ``ContinualCount`` may use)
    is accepted only for ``dim == 1``, ``delta == 0`` and an integer ``clip_bound``: then an integer
    contribution stays an integer after clipping to ``[−R, R]``, every node value is an integer, and a
    neighbour moves a node by an integer ``<= Δ₂ = 2R``, so discrete Laplace noise of scale ``c`` costs
    ``Δ₂/c`` exactly as Laplace does.

    Args:
        dim: vector dimension ``d``, in ``[1, MAX_DIM]``.
        epsilon: the guarantee's ε (nats), in ``EPSILON_RANGE``.
        clip_bound: ``R``, in ``[MIN_SCALE, MAX_SCALE]`` (units of the summed vectors).
        delta: the guarantee's δ: 0 for the pure laws, in ``(0, 1)`` for Gaussian noise.
        noise: ``"gamma"`` (K-norm, pure ε), ``"gaussian"`` ((ε, δ)) or ``"discrete_laplace"``.
        calibration: Gaussian σ: ``"paper"`` (the paper's closed form, certified) or ``"analytic"``
            (the smallest exact σ); a mechanism that always calibrates exactly ignores it.
    """

    dim: int
    epsilon: float
    clip_bound: float
    delta: float = 0.0
    noise: NoiseLaw = "gamma"
    calibration: Calibration = "paper"

    def __post_init__(self) -> None:
        set_field = functools.partial(object.__setattr__, self)
        set_field("dim", check_count("dim", self.dim, 1, MAX_DIM))
        set_field("epsilon", check_number("epsilon", self.epsilon, *EPSILON_RANGE))
        set_field("clip_bound", check_number("clip_bound", self.clip_bound, MIN_SCALE, MAX_SCALE))
        set_field("delta", check_delta(self.delta))
        check_choice("noise", self.noise, NOISE_LAWS)
        check_choice("calibration", self.calibration, CALIBRATIONS)
        if self.noise == "gaussian" and not 0 < self.delta < 1:
            raise ValueError(f"Gaussian noise needs 0 < delta < 1, got {self.delta!r}")
        if self.noise == "gamma" and self.delta != 0:
            raise ValueError("Gamma (K-norm) noise gives pure epsilon-DP: leave delta at 0")
        if self.noise == "discrete_laplace" and (
                self.dim != 1 or self.delta != 0 or self.clip_bound != math.floor(self.clip_bound)):
            raise ValueError(
                "discrete_laplace noise needs dim=1, delta=0 and an integer clip_bound (integer node values "
                f"moved by an integer <= 2R), got dim={self.dim!r}, delta={self.delta!r}, clip_bound={self.clip_bound!r}"
            )

    @classmethod
    def of(cls, *, clip_bound: Any = None, sensitivity: Any = None, **given: Any) -> "SumSpec":
        """The spec from exactly one of ``clip_bound`` (``R``) or ``sensitivity`` (``Δ₂ = 2R``, in
        ``[2·MIN_SCALE, 2·MAX_SCALE]``), and the other fields by name."""
        if (clip_bound is None) == (sensitivity is None):
            raise ValueError("give exactly one of clip_bound (R) or sensitivity (Δ₂ = 2R)")
        if sensitivity is not None:
            clip_bound = check_number("sensitivity", sensitivity, 2 * MIN_SCALE, 2 * MAX_SCALE) / 2.0
        return cls(clip_bound=clip_bound, **given)

    @property
    def sensitivity(self) -> float:
        """``Δ₂ = 2R``: how far one replaced contribution moves a step vector (L2)."""
        return 2.0 * self.clip_bound

    def keywords(self) -> dict[str, Any]:
        """The fields by name: the keyword form of a mechanism constructor (``make_counter``'s)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ContinualSumMechanism(abc.ABC, Generic[StateT]):
    """Base of the private prefix-sum mechanisms over vectors in R^dim.

    Subclasses implement ``init_state``, ``_advance`` (one step on an already clipped step vector),
    ``noise_var`` and ``charges_at``; this class takes the parameters (a :class:`SumSpec`), clips,
    checks blocks and builds releases.

    Under ``noise="discrete_laplace"`` a non-integer node value would make the supports of neighbouring
    outputs disjoint (its fractional part would be released exactly), so a non-integer step vector is
    refused with ``ValueError`` (the Beam transforms only use this law for counts of 1 per event).
    """

    name: str = "continual_sum"
    state_type: type
    #: The noise laws a subclass implements, its keyword form's default first. Only those whose every
    #: noise branch handles "discrete_laplace" list it (the trees), so the integer law can never fall
    #: into a Gaussian branch it was not written for.
    noise_laws: ClassVar[tuple[NoiseLaw, ...]] = ("gamma", "gaussian")
    #: The keyword form's calibration when none is given.
    default_calibration: ClassVar[Calibration] = "paper"
    #: The calibration of a subclass that always calibrates exactly (the spec's is replaced by it).
    fixed_calibration: ClassVar[Calibration | None] = None

    def __init__(self, spec: SumSpec | None = None, /, **given: Any) -> None:
        """Args:
            spec: the shared parameters; or give them as keywords (:meth:`SumSpec.of`: ``dim``,
                ``epsilon``, ``delta``, ``clip_bound`` or ``sensitivity``, ``noise``, ``calibration``),
                ``noise`` and ``calibration`` then defaulting to the mechanism's own.
        """
        if spec is None:
            spec = SumSpec.of(**{"noise": self.noise_laws[0], "calibration": self.default_calibration, **given})
        elif not isinstance(spec, SumSpec):
            raise TypeError(f"spec must be a SumSpec, got {type(spec).__name__}")
        elif given:
            raise TypeError(f"give a SumSpec or its fields as keywords, not both (got {', '.join(given)})")
        if spec.noise not in self.noise_laws:
            raise ValueError(f"{type(self).__name__} does not support noise={spec.noise!r}: it implements "
                             f"{', '.join(map(repr, self.noise_laws))}")
        if self.fixed_calibration is not None:
            spec = dataclasses.replace(spec, calibration=self.fixed_calibration)
        self.spec = spec

    @property
    def dim(self) -> int:
        return self.spec.dim

    @property
    def epsilon(self) -> float:
        return self.spec.epsilon

    @property
    def delta(self) -> float:
        return self.spec.delta

    @property
    def clip_bound(self) -> float:
        return self.spec.clip_bound

    @property
    def sensitivity(self) -> float:
        return self.spec.sensitivity

    @property
    def noise_law(self) -> NoiseLaw:
        return self.spec.noise

    @property
    def calibration(self) -> Calibration:
        return self.spec.calibration

    @property
    def composition(self) -> str:
        """How releases compose with other transforms' (``beam_dp.core.budget``): a release is a linear
        function of the data plus noise, so Gaussian noise makes it a Gaussian mechanism."""
        return "gaussian" if self.noise_law == "gaussian" else "pure"

    # -- privacy arithmetic shared by the family ---------------------------------------------
    def gaussian_sigma(self, paper_sigma: float, epsilon: float, delta: float, levels: int) -> tuple[float, str]:
        """Certify the paper's sigma for a step in ``levels`` nodes, or compute the exact one.

        ``calibration="paper"``: raise ``ValueError`` if ``paper_sigma`` fails the analytic check.
        ``calibration="analytic"``: the smallest sigma passing it (joint sensitivity Δ₂·sqrt(levels)).
        """
        if self.calibration == "analytic":
            return analytic_gaussian_sigma(epsilon, delta, self.sensitivity * math.sqrt(levels)), "analytic"
        certify_gaussian(paper_sigma, self.sensitivity, levels, epsilon, delta)
        return paper_sigma, "paper"

    def node_variance(self, node: NodeNoise) -> float:
        """Per-coordinate variance of one node noise vector: ``(d+1)c²`` (Gamma), ``σ²`` (Gaussian) or
        ``2e^{−1/c}/(1−e^{−1/c})²`` (discrete Laplace)."""
        if node.law == "gamma":
            return (self.dim + 1) * node.scale**2
        if node.law == "discrete_laplace":
            q = math.exp(-1.0 / node.scale)
            return 2.0 * q / (-math.expm1(-1.0 / node.scale)) ** 2
        return node.scale**2

    def spend(self, loss: ElementLoss) -> tuple[float, float]:
        """``(epsilon_spent, delta_spent)`` of a worst-case loss. The Gaussian case is a bisection and a
        mechanism's worst loss takes few distinct values, so results are memoised per instance."""
        cache = self.__dict__.setdefault("_spend_cache", {})
        key = (loss.pure_epsilon, loss.gaussian_mu_sq)
        hit = cache.get(key)
        if hit is None:
            if len(cache) > 1024:
                cache.clear()
            hit = cache[key] = loss.spend(self.delta)
        return hit

    def prime_spends(self, losses: Sequence[ElementLoss]) -> None:
        """Memoise ``spend`` for many losses at once (one vectorised bisection, ``guarantee.spends``):
        a lone stream then pays no bisection per new step."""
        cache = self.__dict__.setdefault("_spend_cache", {})
        todo = [loss for key, loss in {(loss.pure_epsilon, loss.gaussian_mu_sq): loss for loss in losses}.items()
                if key not in cache]
        self.remember_spends(todo, spends(todo, self.delta))

    def remember_spends(self, losses: Sequence[ElementLoss], spent: Sequence[tuple[float, float]]) -> None:
        """Memoise ``spend`` of ``losses`` as ``spent`` (computed by ``guarantee.spends`` or its paced form)."""
        cache = self.__dict__.setdefault("_spend_cache", {})
        for key in list(itertools.islice(cache, max(len(cache) + len(losses) - 1024, 0))):
            del cache[key]  # the oldest first
        cache.update(zip(((loss.pure_epsilon, loss.gaussian_mu_sq) for loss in losses), spent))

    # -- blocks -------------------------------------------------------------------------------
    def clip_and_sum(self, contributions: np.ndarray) -> ClippedSum:
        """Clip each contribution (row) to L2 norm ``R`` and sum them. Raises on bad shape/non-finite."""
        arr = np.asarray(contributions, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"expected contributions of dimension {self.dim}, got shape {np.shape(contributions)}")
        if arr.shape[0] == 0:
            return ClippedSum(np.zeros(self.dim), 0, 0)
        clipped, was_clipped = clip_l2(arr, self.clip_bound)
        return ClippedSum(clipped.sum(axis=0), int(arr.shape[0]), int(was_clipped.sum()))

    def clip_rows(self, contributions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(clipped (n, d), was_clipped (n,) bool)``: each contribution (row) scaled to L2 norm at most
        ``R``, the bound the guarantee assumes (``clip_and_sum_groups`` sums these)."""
        arr = np.asarray(contributions, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"expected contributions of dimension {self.dim}, got shape {arr.shape}")
        return clip_l2(arr, self.clip_bound) if len(arr) else (arr, np.zeros(0, bool))

    def clip_and_sum_groups(
        self, contributions: np.ndarray, groups: np.ndarray, n_groups: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised ``clip_and_sum`` for many steps at once.

        ``contributions`` (n, d) finite rows, ``groups`` (n,) ints in [0, n_groups). Returns
        ``(sums (n_groups, d), counts (n_groups,), clipped_counts (n_groups,))``.
        """
        clipped, was_clipped = self.clip_rows(contributions)
        # one bincount over (group, coordinate) cells: each cell adds its rows in input order, for any
        # number of groups and coordinates (d² of them for PRIVINCREG's Q tree) in one O(n·d) call
        cells = (np.asarray(groups, dtype=np.int64)[:, None] * self.dim + np.arange(self.dim)).ravel()
        sums = np.bincount(cells, weights=clipped.ravel(), minlength=n_groups * self.dim).reshape(n_groups, self.dim)
        counts = np.bincount(groups, minlength=n_groups)
        clipped_counts = np.bincount(groups, weights=was_clipped, minlength=n_groups).astype(np.int64)
        return sums, counts, clipped_counts

    def merge_blocks(self, items: list[ClippedSum]) -> ClippedSum:
        """One step's block from the items buffered for it (engine adapters call this)."""
        merged = self.empty_block()
        for item in items:
            merged = merged.merge(item)
        return merged

    @staticmethod
    def block_count(item: ClippedSum) -> int:
        """Contributions in one buffered item (for count steps)."""
        return item.count

    def empty_block(self) -> ClippedSum:
        return ClippedSum(np.zeros(self.dim), 0, 0)

    def _step_vector(self, block: Any) -> np.ndarray:
        vec = self._clipped_step_vector(block)
        if self.noise_law == "discrete_laplace" and not np.all(vec == np.round(vec)):
            raise ValueError("discrete_laplace noise needs integer step values (counts); got a non-integer sum")
        return vec

    def _clipped_step_vector(self, block: Any) -> np.ndarray:
        if block is None:
            return np.zeros(self.dim)
        if isinstance(block, ClippedSum):
            vec = np.asarray(block.vector, dtype=np.float64)
            if vec.shape != (self.dim,) or not np.all(np.isfinite(vec)):
                raise ValueError(f"a ClippedSum must be a finite vector of shape ({self.dim},)")
            if np.linalg.norm(vec) > block.count * self.clip_bound * (1 + 1e-9):  # defence in depth
                raise ValueError("a ClippedSum exceeds count × clip_bound: it was not made by clip_and_sum")
            return vec
        return self.clip_and_sum(block).vector

    # -- the interface ------------------------------------------------------------------------
    def step(self, state: StateT, block: Any, noise: NoiseSource) -> tuple[StateT, list[Release]]:
        """Feed the next step (``block``: ClippedSum, raw contributions, or None for an empty step)."""
        vector = self._step_vector(block)
        new_state, value, meta, loss = self._advance(state, vector, noise)
        eps, delta = self.spend(loss)
        release = Release(
            stream=self._stream_of(new_state),
            step=self._step_of(new_state),
            mechanism=self.name,
            value=value,
            epsilon_spent=eps,
            delta_spent=delta,
            meta=meta,
            noise=loss.declaration(),
        )
        return new_state, [release]

    def encode_state(self, state: StateT) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> StateT:
        return decode_state(self.state_type, data)

    @staticmethod
    def _stream_of(state: Any) -> str:
        return state.stream

    @staticmethod
    def _step_of(state: Any) -> int:
        return state.t

    @abc.abstractmethod
    def init_state(self, stream: str) -> StateT:
        """Fresh state of ``stream`` (``state.stream`` and step counter ``state.t = 0``)."""

    @abc.abstractmethod
    def _advance(self, state: StateT, vector: np.ndarray, noise: NoiseSource) -> tuple[StateT, np.ndarray, dict, ElementLoss]:
        """One step on the clipped step vector: new state, released estimate, public meta, and the
        worst per-element loss of any element so far (for ``epsilon_spent``)."""

    @abc.abstractmethod
    def noise_var(self, t: int) -> float:
        """Per-coordinate noise variance of the release at step ``t`` (sum over the nodes used)."""

    @abc.abstractmethod
    def charges_at(self, t: int) -> list[Charge]:
        """Ledger charges of the nodes that get noise at step ``t`` (instrumentation for audits)."""


@dataclass(frozen=True, eq=False)
class GroupState:
    """The states of a group of streams that step together, all after ``t`` steps: every array field
    of the mechanism's per-stream state, stacked on a leading stream axis (``arrays[name][i]`` is
    stream ``i``'s). Like per-stream states, it holds no un-noised data beyond what those hold."""

    streams: tuple[str, ...]
    t: int
    arrays: Mapping[str, np.ndarray]


class FreshGroups:
    """``init_group`` for a mechanism that steps groups of streams: its ``stack`` of fresh per-stream states."""

    def init_group(self, streams: Sequence[str]):
        """Fresh state of every stream of ``streams`` (distinct names)."""
        if len(set(streams)) != len(streams):
            raise ValueError("the streams of a group must be distinct")
        return self.stack([self.init_state(s) for s in streams])  # type: ignore[attr-defined]


class GroupSteppedSum(FreshGroups, ContinualSumMechanism[StateT]):
    """A continual sum whose step is written once, for a group of streams (ARCHITECTURE §3).

    Subclasses implement ``_advance_group`` (one numpy operation per step for the whole group); the
    per-stream ``step`` is the group-of-one case of the same code. Per-stream states must be
    ``(stream, t, array fields...)`` dataclasses. Noise cells are keyed per stream, so a stream's
    releases are the same (within float rounding of the group's array operations) whatever group it
    is stepped in.
    """

    def _array_fields(self) -> tuple[str, ...]:
        names = self.__dict__.get("_field_names")
        if names is None:
            names = self.__dict__["_field_names"] = tuple(f.name for f in fields(self.state_type) if f.name not in ("stream", "t"))
        return names

    def stack(self, states: Sequence[StateT]) -> GroupState:
        """One group from per-stream states that are all at the same step."""
        if not states:
            raise ValueError("a group needs at least one stream")
        for state in states:
            if not isinstance(state, self.state_type):
                raise TypeError(f"{self.name} expects a {self.state_type.__name__}, got {type(state).__name__}")
        steps = {state.t for state in states}
        if len(steps) != 1:
            raise ValueError(f"the streams of a group must be at the same step, got steps {sorted(steps)}")
        if len(states) == 1:  # the per-stream path: views, no copies
            arrays = {name: np.asarray(getattr(states[0], name))[None] for name in self._array_fields()}
        else:
            arrays = {name: np.stack([getattr(state, name) for state in states]) for name in self._array_fields()}
        return GroupState(tuple(state.stream for state in states), steps.pop(), arrays)

    def unstack(self, group: GroupState) -> list[StateT]:
        """The per-stream states of a group (for engines that keep one state per stream)."""
        names = self._array_fields()
        return [
            self.state_type(stream, group.t, **{name: self._stream_array(group.arrays[name], i) for name in names})
            for i, stream in enumerate(group.streams)
        ]

    @staticmethod
    def _stream_array(arr: np.ndarray, i: int) -> np.ndarray:
        """Stream ``i``'s read-only array from a group array: a copy (a subclass whose steps never
        write rows a state holds may hand out a view)."""
        return _frozen_copy(arr[i])

    def step_group(self, group: GroupState, sums: np.ndarray, counts: np.ndarray, noise: NoiseSource) -> tuple[GroupState, ReleaseBatch]:
        """Feed the next step of every stream: ``sums (S, d)`` of contributions clipped by
        ``clip_and_sum_groups`` (``counts (S,)`` of them; both zero for a stream without data)."""
        sums = np.asarray(sums, dtype=np.float64)
        counts = np.asarray(counts)
        if sums.shape != (len(group.streams), self.dim) or counts.shape != (len(group.streams),):
            raise ValueError(f"expected sums ({len(group.streams)}, {self.dim}) and counts ({len(group.streams)},), "
                             f"got {sums.shape} and {counts.shape}")
        if not np.all(np.isfinite(sums)):
            raise ValueError("step sums must be finite")
        if np.any(np.sqrt(np.einsum("ij,ij->i", sums, sums)) > counts * self.clip_bound * (1 + 1e-9)):  # defence in depth
            raise ValueError("a step sum exceeds count × clip_bound: it was not made by clip_and_sum_groups")
        if self.noise_law == "discrete_laplace" and not np.all(sums == np.round(sums)):
            raise ValueError("discrete_laplace noise needs integer step values (counts); got a non-integer sum")
        new, values, meta, loss = self._advance_group(group, sums, noise)
        eps, delta = self.spend(loss)
        return new, ReleaseBatch(new.streams, new.t, self.name, values, eps, delta, meta, noise=loss.declaration())

    def _advance(self, state: StateT, vector: np.ndarray, noise: NoiseSource):
        new, values, meta, loss = self._advance_group(self.stack([state]), vector[None, :], noise)
        return self.unstack(new)[0], values[0], meta, loss

    @abc.abstractmethod
    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource) -> tuple[GroupState, np.ndarray, dict, ElementLoss]:
        """One step of every stream on its clipped step vector ``vectors[i]``: new group state,
        released estimates ``(S, d)``, the public meta and worst per-element loss (shared by all)."""


def _frozen_copy(arr: np.ndarray) -> np.ndarray:
    out = np.array(arr)
    out.setflags(write=False)
    return out
