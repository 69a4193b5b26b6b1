"""Binary tree mechanisms for private continual prefix sums of vectors (Chan, Shi & Song, "Private and Continual Release of Statistics").

Three mechanisms, all pure state machines over numpy (ARCHITECTURE §3) whose step is written once for a
group of streams (``GroupSteppedSum``: state arrays with a leading stream axis, one array operation per
node for the whole group; the per-stream ``step`` is the group of one):

* :class:`BinaryTreeSum` (``"binary_tree"``) -- the binary tree / TREEMECH for a known
  horizon ``T``; steps beyond ``T`` are refused.
* :class:`HybridTreeSum` (``"hybrid_tree"``) -- Chan–Shi–Song's hybrid mechanism for an
  unbounded horizon (the default): a logarithmic mechanism at ``ε/2`` plus one binary tree
  ``B_k`` with ``k`` levels per segment ``(2^k, 2^{k+1})`` at ``ε/2``.
* :class:`DoublingTreeSum` (``"doubling_tree"``) -- doubling restarts: block ``k`` covers
  steps ``[2^k, 2^{k+1} - 1]`` with its own ``k+1``-level tree at the full ``ε``; noisy roots of
  finished blocks are carried forward.

:func:`make_tree_sum` picks one of them from ``horizon``/``unbounded``.

Common conventions. Steps ``t = 1, 2, ...`` are public. A step's vector is the sum of
that step's contributions, each clipped to L2 norm ``R`` (``clip_bound``), so replacing one
contribution moves one step vector by at most ``Δ₂ = 2R`` (``sensitivity``) in L2 norm (Frobenius
for flattened matrices). Units: ``epsilon`` in nats, ``delta`` a probability, ``Δ₂``, ``R``, Gamma
scale ``c`` and Gaussian ``sigma`` in the units of the summed vectors.

A *node* is a dyadic interval of steps with one noise vector. Node noise is drawn from the
``NoiseSource`` under a key ``(stream, purpose, (block, level, index))``; it is a
pure function of that key and every node is drawn at exactly one step (the step it completes), so
replays and retries reproduce it and a second, averageable draw cannot happen. Purposes:

==================  ==============================  =========================================
mechanism           purpose                         index tuple
==================  ==============================  =========================================
binary tree         ``"tree"``                      ``(0, ℓ, k)`` for node ``N(ℓ, k)``
hybrid, log part    ``"hybrid-L"``                  ``(0, 0, j)`` for the noise ``η_j`` at ``2^j``
hybrid, tree B_k    ``"hybrid-B<k>"``               ``(k, ℓ, i)`` for node ``N(ℓ, i)`` of ``B_k``
doubling, block k   ``"doubling-<k>"``              ``(k, ℓ, i)`` for node ``N(ℓ, i)`` of block k
==================  ==============================  =========================================

The purpose prefix can be changed with ``purpose=`` (e.g. ``"tree-q"``/``"tree-Q"`` for the two
trees of PRIVINCREG), so that two mechanisms on the same stream and key never share noise.

Node identifiers returned by the introspection helpers (``nodes_used``, ``nodes_noised_at``, ...):
binary tree ``(ℓ, k)`` = TREEMECH node ``N(ℓ, k)``; hybrid ``("L", j)`` for ``η_j`` and ``("B", k, ℓ, i)``;
doubling ``(k, ℓ, i)`` = node ``N(ℓ, i)`` of block ``k`` (in block-local steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from beam_dp.core.calibration import sigma_tree_004
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee, require_within_budget
from beam_dp.core.limits import MAX_COUNT, check_count
from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import ContinualSumMechanism, GroupState, GroupSteppedSum, NodeNoise, SumSpec

__all__ = [
    "BinaryTreeState",
    "BinaryTreeSum",
    "DoublingTreeState",
    "DoublingTreeSum",
    "HybridTreeState",
    "HybridTreeSum",
    "make_tree_sum",
]

# Step numbers and node indices go into the noise key as signed 64-bit integers.
MAX_STEP = MAX_COUNT


# ---------------------------------------------------------------------------------------------
# bit helpers and the shared streaming tree step
# ---------------------------------------------------------------------------------------------
def _tz(n: int) -> int:
    """Number of trailing zero bits of ``n >= 1``."""
    return (n & -n).bit_length() - 1


def _popcount(n: int) -> int:
    return int(n).bit_count()


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _floor_log2(n: int) -> int:
    return n.bit_length() - 1


def _prefix_nodes(u: int) -> list[tuple[int, int]]:
    """Nodes ``(ℓ, k)`` whose disjoint union is ``[1..u]``, highest level first."""
    return [(level, u >> level) for level in range(u.bit_length() - 1, -1, -1) if (u >> level) & 1]


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


def _sum_rows(arr: np.ndarray, rows: Any) -> np.ndarray:
    """``Σ_{r in rows} arr[:, r]`` of a ``(streams, levels, d)`` array, added row by row in order (the
    same rounding for any group size); zeros ``(streams, d)`` for no rows."""
    out = np.zeros((arr.shape[0], arr.shape[2]))
    for r in rows:
        out += arr[:, r]
    return out


def _tree_step(
    clean: np.ndarray, noisy: np.ndarray, u: int, vectors: np.ndarray, draw: Callable[[int, int], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TREEMECH step at local step ``u`` of a tree with ``clean.shape[1]`` levels, for a group of streams.

    ``clean[:, j]``/``noisy[:, j]`` (shape ``(streams, levels, d)``) hold each stream's clean and noisy
    value of the last completed node of level ``j`` that later prefixes may still use; ``vectors`` are
    the step vectors ``(streams, d)``. Exactly one node, ``N(tz(u), u >> tz(u))``, completes with noise
    now (``draw(level, index)``: ``(streams, d)``); returns new arrays (inputs untouched) and the noisy
    prefixes ``Σ_{set bits j of u} noisy[:, j]``. O(levels · streams · d) numpy work.
    """
    i = _tz(u)
    clean = clean.copy()
    noisy = noisy.copy()
    node = vectors + _sum_rows(clean, range(i))  # the finished lower nodes merge into N(i, u >> i)
    clean[:, :i] = 0.0
    noisy[:, :i] = 0.0
    clean[:, i] = node
    noisy[:, i] = node + draw(i, u >> i)
    estimate = _sum_rows(noisy, [j for j in range(clean.shape[1]) if (u >> j) & 1])
    return _frozen(clean), _frozen(noisy), estimate


def _check_purpose(purpose: Any) -> str:
    if not isinstance(purpose, str) or not purpose:
        raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
    return purpose


def _check_step_number(t: Any) -> int:
    return check_count("step", t, 1, MAX_STEP)


class _TreeFamily(GroupSteppedSum):
    """Shared helpers of the three tree mechanisms (not part of the public API)."""

    noise_laws = ("gamma", "gaussian", "discrete_laplace")

    def _pure_node(self, scale: float) -> NodeNoise:
        """Pure-ε node law of scale ``c``: Gamma (K-norm), or discrete Laplace for integer counts."""
        return NodeNoise("discrete_laplace" if self.noise_law == "discrete_laplace" else "gamma", scale, "exact")

    @property
    def pure(self) -> bool:
        return self.noise_law in ("gamma", "discrete_laplace")

    def _setup(self, purpose: str) -> None:
        self.guarantee = Guarantee(self.epsilon, self.delta)
        self.purpose = _check_purpose(purpose)
        self._worst_cache: dict[tuple[int, int], ElementLoss] = {}

    def _nodes_loss(self, node: NodeNoise, count: int, budget: float, levels: int) -> ElementLoss:
        """Loss of an element lying in ``count`` noised nodes of one tree with ``levels`` levels whose
        nodes each cost ``budget / levels`` (Gamma; computed as ``budget·(count/levels)`` so a full
        path costs exactly ``budget``) or ``mu² = (Δ₂/σ)²`` (Gaussian)."""
        if count == 0:
            return ElementLoss()
        if node.law in ("gamma", "discrete_laplace"):
            return ElementLoss.of_noise(node.law, self.sensitivity, node.scale, count,
                                        pure_epsilon=budget * (count / levels))
        return ElementLoss.of_noise("gaussian", self.sensitivity, node.scale, count)

    def _check_group(self, group: GroupState, rows: int) -> None:
        for name in ("clean", "noisy"):
            shape = group.arrays[name].shape
            if shape != (len(group.streams), rows, self.dim):
                raise ValueError(
                    f"{self.name}: state arrays have shape {shape[1:]}, expected {(rows, self.dim)} at step "
                    f"{group.t}; the state belongs to a mechanism with a different configuration"
                )

    def _meta(self, t: int, k_t: int, levels: int, node: NodeNoise, **extra: Any) -> dict[str, Any]:
        meta = {
            "noisy_nodes": int(k_t),
            "levels": int(levels),
            "window": None,
            "noise": self.noise_law,
            "scale": float(node.scale),
            "noise_std": float(math.sqrt(self.noise_var(t))),
            "calibration": node.calibration,
        }
        meta.update(extra)
        return meta

    def _charge(self, node_id: Any) -> Charge:
        purpose, index = self.node_key(node_id)
        first, last = self.node_steps(node_id)
        return self.node_law(node_id).charge(first, last, self.sensitivity, f"{purpose}{index}")

    def _draw(self, node_id: Any, noise: NoiseSource, streams: tuple[str, ...]) -> np.ndarray:
        """The noise of node ``node_id`` of every stream of a group: ``(streams, d)``."""
        purpose, index = self.node_key(node_id)
        return self.node_law(node_id).draw_group(noise, streams, purpose, index, self.dim)

    def charges_at(self, t: int) -> list[Charge]:
        """Ledger charges of the nodes that get noise at step ``t`` (exactly one node per step)."""
        return [self._charge(node_id) for node_id in self.nodes_noised_at(t)]

    # subclasses: node_key, node_law, node_steps, nodes_noised_at, nodes_used


# ---------------------------------------------------------------------------------------------
# §2 binary tree, known horizon
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BinaryTreeState:
    """State of :class:`BinaryTreeSum` after ``t`` steps: ``clean[j]``/``noisy[j]``,
    ``j = 0..h``, are the arrays ``a``/``b`` of TREEMECH, shape ``(h+1, d)`` (``2(h+1)`` vectors)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    clean: np.ndarray
    noisy: np.ndarray


class BinaryTreeSum(_TreeFamily):
    """Binary tree mechanism (TREEMECH) for prefix sums over a known horizon ``T``.

    Guarantee: ``epsilon``-DP with Gamma (K-norm) noise, ``(epsilon, delta)``-DP with Gaussian noise;
    event level (neighbouring streams differ in one contribution, replace-one, ``Δ₂ = 2R``); for the
    whole release sequence ``t = 1..T`` forever (no expiration), inputs may be chosen adaptively.

    Layout: ``h = ⌊log₂ T⌋``, ``L_T = h + 1`` levels; a step lies in at most ``L_T`` noised nodes.
    Per-node spend: Gamma scale ``c_T = Δ₂·L_T/ε``, i.e. ``ε/L_T`` per node. Gaussian:
    ``sigma_tree_004`` with ``L = L_T`` certified by the analytic Gaussian test on the joint
    sensitivity ``Δ₂√L_T`` (``calibration="paper"``, raises ``ValueError`` when it fails) or the
    smallest passing sigma (``calibration="analytic"``); each node then has ``mu = Δ₂/σ``.

    The release at ``t`` sums the ``popcount(t)`` nodes of the binary decomposition of ``t``;
    ``noise_var(t) = popcount(t)·v`` with ``v = (d+1)c²`` or ``σ²``. ``epsilon_spent`` is the spend of
    step 1 (the worst step): ``ε·m_t/L_T`` with ``m_t = ⌊log₂ t⌋ + 1`` (Gamma), the analytic ε′ at
    ``delta`` for ``m_t`` nodes (Gaussian). Steps beyond ``horizon`` raise ``ValueError``.
    """

    name = "binary_tree"
    state_type = BinaryTreeState

    def __init__(self, spec: SumSpec | None = None, /, *, horizon: int, purpose: str = "tree", **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as keywords).
            horizon: ``T``, in ``[1, 2**62]``; later steps are refused.
            purpose: the noise purpose (prefix).
        """
        super().__init__(spec, **given)
        self._setup(purpose)
        self.horizon = check_count("horizon", horizon, 1, MAX_STEP)
        self.height = _floor_log2(self.horizon)
        self.levels = self.height + 1
        if self.pure:
            self.node_noise = self._pure_node(self.sensitivity * self.levels / self.epsilon)
        else:
            paper = sigma_tree_004(self.epsilon, self.delta, self.sensitivity, self.levels)
            sigma, how = self.gaussian_sigma(paper, self.epsilon, self.delta, self.levels)
            self.node_noise = NodeNoise("gaussian", sigma, how)
        require_within_budget(self.guarantee, self._worst_loss(self.horizon), "binary tree")

    # -- node bookkeeping (pure, public introspection) ---------------------------------------
    def node_key(self, node: tuple[int, int]) -> tuple[str, tuple[int, int, int]]:
        level, k = node
        return self.purpose, (0, level, k)

    def node_law(self, node: tuple[int, int]) -> NodeNoise:
        return self.node_noise

    def node_steps(self, node: tuple[int, int]) -> tuple[int, int]:
        """Steps ``(first, last)`` covered by ``N(ℓ, k)``: ``(k−1)2^ℓ + 1 .. k·2^ℓ``."""
        level, k = node
        return (k - 1) * 2**level + 1, k * 2**level

    def _check_t(self, t: int) -> int:
        t = _check_step_number(t)
        if t > self.horizon:
            raise ValueError(f"step {t} is beyond the horizon T={self.horizon} of this binary tree")
        return t

    def nodes_containing(self, t: int) -> list[tuple[int, int]]:
        """Spec §2.1: the nodes ``N(ℓ, ⌈t/2^ℓ⌉)``, ``ℓ = 0..h``, that complete by ``T``.

        This is the full dyadic layout; the streaming algorithm only ever noises (and releases) the
        odd-index nodes among them (see :meth:`nodes_noised_at`)."""
        t = self._check_t(t)
        out = []
        for level in range(self.levels):
            k = -(-t // 2**level)
            if k * 2**level <= self.horizon:
                out.append((level, k))
        return out

    def nodes_used(self, t: int) -> list[tuple[int, int]]:
        """Spec §2.2: the ``popcount(t)`` nodes ``N(ℓ, ⌊t/2^ℓ⌋)`` for the set bits ``ℓ`` of ``t``."""
        return _prefix_nodes(self._check_t(t))

    def nodes_noised_at(self, t: int) -> list[tuple[int, int]]:
        """The node that completes with noise at step ``t``: ``N(tz(t), t >> tz(t))``."""
        t = self._check_t(t)
        i = _tz(t)
        return [(i, t >> i)]

    def noise_var(self, t: int) -> float:
        return _popcount(self._check_t(t)) * self.node_variance(self.node_noise)

    def _worst_loss(self, t: int) -> ElementLoss:
        # Step 1 lies in the noised nodes N(ℓ, 1) with 2^ℓ <= t; no step lies in more.
        return self._nodes_loss(self.node_noise, t.bit_length(), self.epsilon, self.levels)

    # -- the state machine ---------------------------------------------------------------------
    def init_state(self, stream: str) -> BinaryTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        zeros = np.zeros((self.levels, self.dim))
        return BinaryTreeState(stream, 0, _frozen(zeros.copy()), _frozen(zeros))

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        self._check_group(group, self.levels)
        t = group.t + 1
        if t > self.horizon:
            raise ValueError(
                f"step {t} is beyond the horizon T={self.horizon}; use horizon=None (hybrid/doubling) "
                "for an unbounded stream"
            )
        clean, noisy, estimate = _tree_step(
            group.arrays["clean"], group.arrays["noisy"], t, vectors,
            lambda level, k: self._draw((level, k), noise, group.streams),
        )
        meta = self._meta(t, _popcount(t), self.levels, self.node_noise, horizon=self.horizon)
        return GroupState(group.streams, t, {"clean": clean, "noisy": noisy}), estimate, meta, self._worst_loss(t)


# ---------------------------------------------------------------------------------------------
# §3.1 hybrid mechanism (unbounded horizon, default)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class HybridTreeState:
    """State of :class:`HybridTreeSum` after ``t`` steps.

    ``beta``: running sum of all step vectors plus the log noises ``η_0..η_j`` drawn so far;
    ``lout``: the last milestone output ``Lout(2^j)``; ``clean``/``noisy``: the TREEMECH arrays of the
    active tree ``B_k`` (``k = ⌊log₂ t⌋`` rows; allocated at step ``2^k``, when ``B_{k−1}`` is dropped).
    ``2k + 2`` vectors in all.
    """

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    beta: np.ndarray
    lout: np.ndarray
    clean: np.ndarray
    noisy: np.ndarray


class HybridTreeSum(_TreeFamily):
    """Chan–Shi–Song hybrid mechanism for prefix sums over an unbounded horizon.

    Guarantee: ``epsilon``-DP (Gamma) or ``(epsilon, delta)``-DP (Gaussian), event level
    (replace-one contribution, ``Δ₂ = 2R``), forever, for every stream length, adaptive inputs allowed.

    Budget split ``ε_L = ε_B = ε/2`` (Gaussian ``δ_L = δ_B = δ/2``):

    * logarithmic mechanism: at ``t = 2^j`` the running sum gets a fresh noise ``η_j`` that stays in it;
      each step lies in exactly one increment ``(2^{j−1}, 2^j]`` and pays ``ε/2`` once
      (Gamma scale ``Δ₂/ε_L``; Gaussian ``sigma_tree_004(ε/2, δ/2, Δ₂, L=1)``);
    * binary tree ``B_k`` (steps ``2^k < t < 2^{k+1}``, local step ``u = t − 2^k``): horizon ``2^k − 1``,
      ``k`` levels, per node Gamma scale ``k·Δ₂/ε_B`` (``ε/(2k)`` per node) or Gaussian
      ``sigma_tree_004(ε/2, δ/2, Δ₂, L=k)``.

    A step pays at most ``ε/2 + k·ε/(2k) = ε``. Gaussian: each part is certified at ``(ε/2, δ/2)`` with
    the analytic test (so basic composition gives ``(ε, δ)``); the ledger and ``epsilon_spent`` use the
    exact joint Gaussian loss ``mu² = mu_L² + Σ mu_node²``, which is never worse. Certification of
    ``B_k`` happens when it is first needed; it cannot fail for ``k > 1`` once ``k = 1`` (checked at
    construction) passes: with the paper sigma ``mu_k = Δ₂√k/σ_k = mu_1/√k`` decreases in ``k`` and the
    analytic ``δ_A(ε; mu)`` increases in ``mu``; with ``calibration="analytic"`` each ``σ_k`` is computed
    to pass.

    Release: ``s_t = Lout(2^k) (+ B_k.prefix(t − 2^k))``; error = ``k+1`` log noises (``+ popcount(u)``
    nodes of ``B_k``), ``noise_var(t) = (k+1)·v_L + popcount(u)·v_k``.
    """

    name = "hybrid_tree"
    state_type = HybridTreeState

    def __init__(self, spec: SumSpec | None = None, /, *, purpose: str = "hybrid", **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as keywords).
            purpose: the noise purpose (prefix).
        """
        super().__init__(spec, **given)
        self._setup(purpose)
        self.epsilon_log = self.epsilon / 2.0
        self.epsilon_trees = self.epsilon / 2.0
        self.delta_log = self.delta / 2.0
        self.delta_trees = self.delta / 2.0
        self._block_noise: dict[int, NodeNoise] = {}
        if self.pure:
            self.log_noise = self._pure_node(self.sensitivity / self.epsilon_log)
        else:
            paper = sigma_tree_004(self.epsilon_log, self.delta_log, self.sensitivity, 1)
            sigma, how = self.gaussian_sigma(paper, self.epsilon_log, self.delta_log, 1)
            self.log_noise = NodeNoise("gaussian", sigma, how)
        # B_1 is the binding case (see the class docstring); a complete B_1 step plus its log increment
        # is the worst per-element loss, which must be within (ε, δ).
        worst = self._log_loss() + self._nodes_loss(self.block_noise(1), 1, self.epsilon_trees, 1)
        require_within_budget(self.guarantee, worst, "hybrid tree")

    def block_noise(self, k: int) -> NodeNoise:
        """Node noise law of ``B_k`` (``k >= 1``), certified on first use and cached."""
        k = _check_step_number(k)
        node = self._block_noise.get(k)
        if node is None:
            if self.pure:
                node = self._pure_node(k * self.sensitivity / self.epsilon_trees)
            else:
                paper = sigma_tree_004(self.epsilon_trees, self.delta_trees, self.sensitivity, k)
                sigma, how = self.gaussian_sigma(paper, self.epsilon_trees, self.delta_trees, k)
                node = NodeNoise("gaussian", sigma, how)
            self._block_noise[k] = node
        return node

    # -- node bookkeeping -------------------------------------------------------------------------
    def node_key(self, node: tuple) -> tuple[str, tuple[int, int, int]]:
        if node[0] == "L":
            return f"{self.purpose}-L", (0, 0, node[1])
        _, k, level, i = node
        return f"{self.purpose}-B{k}", (k, level, i)

    def node_law(self, node: tuple) -> NodeNoise:
        return self.log_noise if node[0] == "L" else self.block_noise(node[1])

    def node_steps(self, node: tuple) -> tuple[int, int]:
        """Global steps covered: ``η_j`` covers ``(2^{j−1}, 2^j]`` (``η_0``: step 1); node ``N(ℓ, i)``
        of ``B_k`` covers ``2^k + (i−1)2^ℓ + 1 .. 2^k + i·2^ℓ``."""
        if node[0] == "L":
            j = node[1]
            return (1, 1) if j == 0 else (2 ** (j - 1) + 1, 2**j)
        _, k, level, i = node
        return 2**k + (i - 1) * 2**level + 1, 2**k + i * 2**level

    def nodes_used(self, t: int) -> list[tuple]:
        """Noises in the release at ``t``: ``("L", 0..k)``, then the ``B_k`` prefix nodes of ``t − 2^k``."""
        t = _check_step_number(t)
        k = _floor_log2(t)
        used: list[tuple] = [("L", j) for j in range(k + 1)]
        if not _is_power_of_two(t):
            used += [("B", k, level, i) for level, i in _prefix_nodes(t - 2**k)]
        return used

    def nodes_noised_at(self, t: int) -> list[tuple]:
        t = _check_step_number(t)
        k = _floor_log2(t)
        if _is_power_of_two(t):
            return [("L", k)]
        u = t - 2**k
        i = _tz(u)
        return [("B", k, i, u >> i)]

    def noise_var(self, t: int) -> float:
        t = _check_step_number(t)
        k = _floor_log2(t)
        var = (k + 1) * self.node_variance(self.log_noise)
        if not _is_power_of_two(t):
            var += _popcount(t - 2**k) * self.node_variance(self.block_noise(k))
        return var

    def _log_loss(self) -> ElementLoss:
        return self._nodes_loss(self.log_noise, 1, self.epsilon_log, 1)

    def element_loss(self, s: int, t: int) -> ElementLoss:
        """Privacy loss of an element of step ``s`` after the releases ``1..t`` (``s <= t``)."""
        s, t = _check_step_number(s), _check_step_number(t)
        if s > t:
            return ElementLoss()
        loss = self._log_loss() if t >= 2 ** (s - 1).bit_length() else ElementLoss()  # η_j, 2^j >= s
        if not _is_power_of_two(s):
            k = _floor_log2(s)
            u, now = s - 2**k, min(t - 2**k, 2**k - 1)
            count = sum(1 for level in range(k) if (-(-u // 2**level)) % 2 == 1 and -(-u // 2**level) * 2**level <= now)
            loss = loss + self._nodes_loss(self.block_noise(k), count, self.epsilon_trees, k)
        return loss

    def _worst_loss(self, t: int) -> ElementLoss:
        # Candidates: step 1 (log increment only, like every milestone) and the first step of every
        # started B_k, which lies in the most completed nodes of its tree (N(ℓ, 1) completes first
        # at every level). The result depends on t only through K = ⌊log₂ t⌋ and the number of
        # completed levels of B_K, so it is cached (O(log t) work once per key).
        big_k = _floor_log2(t)
        key = (big_k, (t - 2**big_k).bit_length())
        hit = self._worst_cache.get(key)
        if hit is None:
            candidates = [self.element_loss(1, t)]
            candidates += [self.element_loss(2**k + 1, t) for k in range(1, big_k + 1) if 2**k + 1 <= t]
            hit = self._worst_cache[key] = max(candidates, key=lambda loss: loss.pure_epsilon + loss.gaussian_mu_sq)
        return hit

    # -- the state machine --------------------------------------------------------------------------
    def init_state(self, stream: str) -> HybridTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        vec = _frozen(np.zeros(self.dim))
        empty = _frozen(np.zeros((0, self.dim)))
        return HybridTreeState(stream, 0, vec, vec.copy(), empty, empty.copy())

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        self._check_group(group, _floor_log2(group.t) if group.t >= 1 else 0)  # B_k of the last milestone
        t = group.t + 1
        k = _floor_log2(t)
        if t > MAX_STEP:
            raise ValueError(f"step {t} exceeds the supported {MAX_STEP} steps")
        beta = group.arrays["beta"] + vectors
        if _is_power_of_two(t):  # milestone 2^k: log noise η_k, release Lout, start B_k
            beta = beta + self._draw(("L", k), noise, group.streams)
            lout = beta
            estimate = lout.copy()
            clean = _frozen(np.zeros((len(group.streams), k, self.dim)))
            noisy = _frozen(np.zeros((len(group.streams), k, self.dim)))
            k_t = k + 1
        else:
            u = t - 2**k
            clean, noisy, prefix = _tree_step(
                group.arrays["clean"], group.arrays["noisy"], u, vectors,
                lambda level, i: self._draw(("B", k, level, i), noise, group.streams),
            )
            lout = group.arrays["lout"]
            estimate = lout + prefix
            k_t = k + 1 + _popcount(u)
        block = max(k, 1)  # the B_k in use at t (at t = 1, 2: the first tree, B_1)
        meta = self._meta(
            t, k_t, block, self.block_noise(block), block=block, log_scale=float(self.log_noise.scale)
        )
        arrays = {"beta": _frozen(beta), "lout": _frozen(lout), "clean": clean, "noisy": noisy}
        return GroupState(group.streams, t, arrays), estimate, meta, self._worst_loss(t)


# ---------------------------------------------------------------------------------------------
# §3.2 doubling restarts
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DoublingTreeState:
    """State of :class:`DoublingTreeSum` after ``t`` steps.

    ``carry``: ``C_k``, the sum of the noisy roots of the finished blocks; ``clean``/``noisy``: the
    TREEMECH arrays of the block that step ``t + 1`` belongs to (``k + 1`` rows for block ``k``).
    """

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    carry: np.ndarray
    clean: np.ndarray
    noisy: np.ndarray


class DoublingTreeSum(_TreeFamily):
    """Doubling restarts for prefix sums over an unbounded horizon.

    Guarantee: ``epsilon``-DP (Gamma) or ``(epsilon, delta)``-DP (Gaussian), event level
    (replace-one contribution, ``Δ₂ = 2R``), forever, adaptive inputs allowed.

    Block ``k = 0, 1, ...`` covers steps ``[2^k, 2^{k+1} − 1]`` with its own binary tree of horizon
    ``2^k`` and ``k + 1`` levels; a step lies in at most ``k + 1`` nodes of its own block and in no other
    block, so no budget split: per node Gamma scale ``(k+1)·Δ₂/ε`` (``ε/(k+1)`` per node) or Gaussian
    ``sigma_tree_004(ε, δ, Δ₂, L=k+1)`` certified at ``(ε, δ)``. As for the hybrid, ``k = 0`` (``L = 1``) is
    the binding certification and is checked at construction.

    Release at step ``t`` of block ``k`` (local step ``u = t − 2^k + 1``): ``s_t = C_k + prefix_k(u)``,
    with ``C_k`` the noisy roots of blocks ``0..k−1``; error = those ``k`` roots + ``popcount(u)`` nodes,
    ``noise_var(t) = Σ_{j<k} v_j + popcount(u)·v_k``. Step 1 (block 0) already pays the full ``ε``.
    """

    name = "doubling_tree"
    state_type = DoublingTreeState

    def __init__(self, spec: SumSpec | None = None, /, *, purpose: str = "doubling", **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`, or its fields as keywords).
            purpose: the noise purpose (prefix).
        """
        super().__init__(spec, **given)
        self._setup(purpose)
        self._block_noise: dict[int, NodeNoise] = {}
        require_within_budget(self.guarantee, self._nodes_loss(self.block_noise(0), 1, self.epsilon, 1), "doubling tree")

    def block_noise(self, k: int) -> NodeNoise:
        """Node noise law of block ``k >= 0`` (``k + 1`` levels), certified on first use and cached."""
        k = check_count("block index", k, 0, MAX_STEP)
        node = self._block_noise.get(k)
        if node is None:
            levels = k + 1
            if self.pure:
                node = self._pure_node(levels * self.sensitivity / self.epsilon)
            else:
                paper = sigma_tree_004(self.epsilon, self.delta, self.sensitivity, levels)
                sigma, how = self.gaussian_sigma(paper, self.epsilon, self.delta, levels)
                node = NodeNoise("gaussian", sigma, how)
            self._block_noise[k] = node
        return node

    # -- node bookkeeping -------------------------------------------------------------------------
    def node_key(self, node: tuple[int, int, int]) -> tuple[str, tuple[int, int, int]]:
        k, level, i = node
        return f"{self.purpose}-{k}", (k, level, i)

    def node_law(self, node: tuple[int, int, int]) -> NodeNoise:
        return self.block_noise(node[0])

    def node_steps(self, node: tuple[int, int, int]) -> tuple[int, int]:
        """Global steps of node ``N(ℓ, i)`` of block ``k``: ``2^k + (i−1)2^ℓ .. 2^k + i·2^ℓ − 1``."""
        k, level, i = node
        return 2**k + (i - 1) * 2**level, 2**k + i * 2**level - 1

    def nodes_used(self, t: int) -> list[tuple[int, int, int]]:
        """Roots ``(j, j, 1)`` of blocks ``j < k``, then block ``k``'s prefix nodes of ``u``."""
        t = _check_step_number(t)
        k = _floor_log2(t)
        u = t - 2**k + 1
        return [(j, j, 1) for j in range(k)] + [(k, level, i) for level, i in _prefix_nodes(u)]

    def nodes_noised_at(self, t: int) -> list[tuple[int, int, int]]:
        t = _check_step_number(t)
        k = _floor_log2(t)
        u = t - 2**k + 1
        i = _tz(u)
        return [(k, i, u >> i)]

    def noise_var(self, t: int) -> float:
        t = _check_step_number(t)
        k = _floor_log2(t)
        u = t - 2**k + 1
        var = sum(self.node_variance(self.block_noise(j)) for j in range(k))
        return var + _popcount(u) * self.node_variance(self.block_noise(k))

    def element_loss(self, s: int, t: int) -> ElementLoss:
        """Privacy loss of an element of step ``s`` after the releases ``1..t``."""
        s, t = _check_step_number(s), _check_step_number(t)
        if s > t:
            return ElementLoss()
        k = _floor_log2(s)
        u, now = s - 2**k + 1, min(t - 2**k + 1, 2**k)
        count = sum(1 for level in range(k + 1) if (-(-u // 2**level)) % 2 == 1 and -(-u // 2**level) * 2**level <= now)
        return self._nodes_loss(self.block_noise(k), count, self.epsilon, k + 1)

    def _worst_loss(self, t: int) -> ElementLoss:
        # The first step of each started block lies in the most completed nodes of its block. The
        # result depends on t only through K = ⌊log₂ t⌋ and the completed levels of block K: cached.
        big_k = _floor_log2(t)
        key = (big_k, (t - 2**big_k + 1).bit_length())
        hit = self._worst_cache.get(key)
        if hit is None:
            candidates = [self.element_loss(2**k, t) for k in range(big_k + 1)]
            hit = self._worst_cache[key] = max(candidates, key=lambda loss: loss.pure_epsilon + loss.gaussian_mu_sq)
        return hit

    # -- the state machine --------------------------------------------------------------------------
    def init_state(self, stream: str) -> DoublingTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return DoublingTreeState(
            stream, 0, _frozen(np.zeros(self.dim)), _frozen(np.zeros((1, self.dim))), _frozen(np.zeros((1, self.dim)))
        )

    def _advance_group(self, group: GroupState, vectors: np.ndarray, noise: NoiseSource):
        t = group.t + 1
        if t > MAX_STEP:
            raise ValueError(f"step {t} exceeds the supported {MAX_STEP} steps")
        k = _floor_log2(t)
        self._check_group(group, k + 1)
        u = t - 2**k + 1
        clean, noisy, prefix = _tree_step(
            group.arrays["clean"], group.arrays["noisy"], u, vectors,
            lambda level, i: self._draw((k, level, i), noise, group.streams),
        )
        carry = group.arrays["carry"]
        estimate = carry + prefix
        if u == 2**k:  # block k closes: carry its noisy root, open block k + 1
            carry = _frozen(carry + noisy[:, k])
            clean = _frozen(np.zeros((len(group.streams), k + 2, self.dim)))
            noisy = _frozen(np.zeros((len(group.streams), k + 2, self.dim)))
        meta = self._meta(t, k + _popcount(u), k + 1, self.block_noise(k), block=k)
        arrays = {"carry": carry, "clean": clean, "noisy": noisy}
        return GroupState(group.streams, t, arrays), estimate, meta, self._worst_loss(t)


# ---------------------------------------------------------------------------------------------
def make_tree_sum(*, horizon: int | None = None, unbounded: str = "hybrid", **kwargs: Any) -> ContinualSumMechanism:
    """A tree prefix-sum mechanism: :class:`BinaryTreeSum` when ``horizon`` is given, otherwise
    :class:`HybridTreeSum` (``unbounded="hybrid"``, default) or :class:`DoublingTreeSum`
    (``unbounded="doubling"``). ``kwargs`` go to the constructor (``dim``, ``epsilon``, ...)."""
    if unbounded not in ("hybrid", "doubling"):
        raise ValueError(f"unbounded must be 'hybrid' or 'doubling', got {unbounded!r}")
    if horizon is not None:
        return BinaryTreeSum(horizon=horizon, **kwargs)
    if unbounded == "hybrid":
        return HybridTreeSum(**kwargs)
    return DoublingTreeSum(**kwargs)
