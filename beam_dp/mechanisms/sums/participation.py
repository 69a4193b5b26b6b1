"""Unit-level (multi-participation) sensitivity of the continual counters. Pure numpy, no Beam.

A privacy unit (a user) takes part in at most ``k`` steps (``max_steps``), any two of them at least ``b``
steps apart (``min_separation``; ``b = 1``: any distinct steps). At a step, the unit's contributions to one
stream are combined and then clipped to L2 norm ``R``, so how many it makes per step does not enter; its
contributions to ``m`` streams go to ``m`` separate mechanisms, whose losses compose (Gaussian ``mu²`` add,
pure ``ε`` add) outside this module. Replacing the unit (its values and its steps may change) moves each of
its step vectors by at most ``Δ₂ = 2R``, the per-step sensitivity the counters calibrate on today (when
its steps change too, the old and the new pattern each move the noised vector by at most ``R`` per step:
the triangle inequality gives the same ``Δ₂`` times the worst single pattern).

Every counter noises a linear image of the steps: the factorization counters ``z = Cx`` (``C``
lower-triangular Toeplitz), the trees one vector per noised node (the node's steps summed). A pattern ``P``
of steps moves it by ``Σ_{s∈P} C[:, s] ⊗ δ_s`` with ``‖δ_s‖ <= Δ₂``; for a non-negative ``C`` the worst
case aligns every ``δ_s`` (Cauchy–Schwarz on ``Σ_{s,s'} G_{ss'} <δ_s, δ_s'>``, ``G = CᵀC >= 0``):

* Gaussian: the joint L2 sensitivity ``Δ₂ · max_P ‖Σ_{s∈P} C[:, s]‖``; for a tree, with node noise
  ``σ_v``, ``mu² = Δ₂² · max_P Σ_v cnt_v(P)² / σ_v²`` (``cnt_v``: steps of ``P`` under ``v``);
* pure ε (K-norm/Gamma, discrete Laplace): a node of scale ``c_v`` moved by a vector of L2 norm ``D`` costs
  ``D / c_v``, so ``ε = Δ₂ · max_P Σ_v cnt_v(P) / c_v`` (additive over the steps of ``P``).

The *multiplier* is that maximum over the one for single steps (``|P| = 1``, today's calibration):
multiplying every noise scale (Gaussian σ, pure scale ``c``) by it gives each unit the guarantee the counter
gives each event today. Factorization counters: exact (:func:`toeplitz_multiplier`, :func:`blt_multiplier`).
Trees: an upper bound, flagged ``exact`` where it is the maximum (:func:`tree_multiplier`). The counters
do not apply it yet: this module computes, it calibrates nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from beam_dp.core.limits import MAX_COUNT, check_count

__all__ = [
    "Layer",
    "Participation",
    "UnitSensitivity",
    "binary_tree_layers",
    "blt_multiplier",
    "doubling_layers",
    "honaker_layers",
    "hybrid_layers",
    "log_layers",
    "toeplitz_multiplier",
    "tree_multiplier",
    "unit_sensitivity",
    "window_layers",
]

_ARRAY_STEPS = 1 << 20  # horizons up to this get the per-step (additive) bound of the trees
_DP_CELLS = 1 << 24  # steps × participations of the exact separated-selection DP
_PATTERN_CELLS = 1 << 23  # pattern steps × layers evaluated to prove a tree bound exact
_EXACT_RTOL = 1e-12  # a pattern within this of the bound proves it exact (the bound is what is returned)


@dataclass(frozen=True)
class Participation:
    """How often one privacy unit takes part: at most ``max_steps`` steps, any two ``min_separation`` apart.

    Args:
        max_steps: ``k >= 1`` steps per unit; ``None``: unbounded (only where a horizon bounds the steps: it
            is refused on a forever guarantee).
        min_separation: ``b >= 1`` steps between any two participations (1: any distinct steps).
    """

    max_steps: int | None
    min_separation: int = 1

    def __post_init__(self) -> None:
        if self.max_steps is not None:
            object.__setattr__(self, "max_steps", check_count("max_steps", self.max_steps))
        object.__setattr__(self, "min_separation", check_count("min_separation", self.min_separation))

    def steps_within(self, horizon: int | None) -> int:
        """``k'``: the most steps a unit can take within ``horizon`` steps (``None``: forever, refused for an
        unbounded ``max_steps``)."""
        if horizon is None:
            if self.max_steps is None:
                raise ValueError("max_steps=None cannot be bounded on a forever guarantee: give max_steps or a horizon")
            return self.max_steps
        fit = (check_count("horizon", horizon) - 1) // self.min_separation + 1
        return fit if self.max_steps is None else min(self.max_steps, fit)


@dataclass(frozen=True)
class UnitSensitivity:
    """``multiplier`` (>= 1): the unit-level sensitivity over the single-participation one, of the joint L2
    sensitivity (Gaussian) or of the pure ε spent; ``exact``: it is the maximum over patterns (else an
    upper bound); ``steps``: ``k'``, the most steps one unit can take."""

    multiplier: float
    exact: bool
    steps: int


# ---------------------------------------------------------------------------------------------
# Toeplitz factorizations
# ---------------------------------------------------------------------------------------------
def _window_sums(x: np.ndarray, width: int) -> np.ndarray:
    """``out[q] = Σ_{0<=a<width, a<=q} x[q − a]`` along axis 0, by doubling: additions of the
    (non-negative) inputs only, so no cancellation (relative error ~ ``log₂ width`` ulps)."""
    rows = x.shape[0]
    out = np.zeros_like(x)
    block, size, offset = x.copy(), 1, 0
    while width and offset < rows:
        if width & 1:
            out[offset:] += block[: rows - offset]
            offset += size
        width >>= 1
        if width and size < rows:
            grown = block.copy()
            grown[size:] += block[: rows - size]
            block, size = grown, 2 * size
    return out


def toeplitz_multiplier(coeffs: Sequence[float] | np.ndarray, participation: Participation) -> UnitSensitivity:
    """Exact multiplier of a lower-triangular Toeplitz ``C`` (``c_0..c_{n−1}``, horizon ``n``), ``c >= 0``
    non-increasing from ``c_1`` on (refused otherwise).

    ``‖Σ_{i∈P} C[:, i]‖² = Σ_{i,j∈P} G_ij`` with ``G_ij = Σ_{m<n−max(i,j)} c_m c_{m+|i−j|}``: non-increasing in
    ``max(i, j)`` (``c >= 0``) and, for ``i ≠ j`` (lag >= 1), in ``|i − j|``. The earliest pattern
    ``q_a = a·b`` (``a < k'``) has ``q_c − q_a <= p_c − p_a`` and ``max q <= max p`` for every admissible ``p``
    of the same size, so ``G(q) >= G(p)`` entrywise: it is the worst. Its column sum ``u_t = Σ_a c_{t−ab}``
    is a window sum along each residue class mod ``b``: O(n log k') time, O(n) memory.
    """
    c = np.asarray(coeffs, dtype=np.float64)
    if c.ndim != 1 or c.size < 1 or not np.all(np.isfinite(c)):
        raise ValueError("coeffs must be a non-empty finite vector c_0..c_{n-1}")
    if np.any(c < 0) or np.any(np.diff(c[1:]) > 0):
        raise ValueError("the earliest pattern is the worst only for c >= 0 non-increasing from c_1 on")
    n, b = c.size, participation.min_separation
    k = participation.steps_within(n)
    rows = -(-n // b)
    grid = np.zeros(rows * b)
    grid[:n] = c
    u = _window_sums(grid.reshape(rows, b), k).ravel()[:n]
    return UnitSensitivity(math.sqrt(float(np.sum(u * u)) / float(np.sum(c * c))), True, k)


def blt_multiplier(blt: Any, participation: Participation, horizon: int | None) -> UnitSensitivity:
    """Exact multiplier of a BLT's ``C`` (``c_j = Σ_i ω_i θ_i^{j−1}``, positive and decreasing from ``c_1``):
    :func:`toeplitz_multiplier` of ``c_0..c_{T−1}`` for a horizon ``T``; for ``horizon=None`` (the unbounded
    mode, columns over all steps) the closed form ``k r(0) + 2 Σ_{j<k} (k − j) r(jb)`` of the earliest pattern,
    ``r(0) = Σ_j c_j²`` and, for ``δ >= 1``, ``r(δ) = Σ_m c_m c_{m+δ} = Σ_l θ_l^δ α_l`` with
    ``α_l = ω_l/θ_l + ω_l Σ_i ω_i/(1 − θ_iθ_l)``: O(buffers²)."""
    from beam_dp.mechanisms.sums.blt_math import _geom_weighted

    if horizon is not None:
        return toeplitz_multiplier(blt.c_coeffs(horizon), participation)
    k = participation.steps_within(None)
    if k == 1:
        return UnitSensitivity(1.0, True, 1)
    theta, omega = blt.arrays
    r0 = blt.col_norm_sq(math.inf)
    alpha = omega / theta + omega * (omega[:, None] / (1.0 - np.outer(theta, theta))).sum(axis=0)
    q = theta ** float(participation.min_separation)
    lagged = q * _geom_weighted(q, k - 1)  # Σ_{j=1}^{k−1} (k − j) q^j, without a subtraction
    return UnitSensitivity(math.sqrt((k * r0 + 2.0 * float(alpha @ lagged)) / r0), True, k)


# ---------------------------------------------------------------------------------------------
# trees
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """Noised nodes ``[start + i·stride, start + i·stride + length)``, ``i < count`` (0-based steps, every
    node complete within the horizon), each of weight ``weight``: ``1/σ²`` (Gaussian) or ``1/c`` (pure).
    ``level`` groups layers whose nodes are disjoint (the per-level bound); ``tree``: layers of one tree
    all contain the tree's first step (``start``) in their first node; distinct trees are disjoint in time."""

    start: int
    length: int
    stride: int
    count: int
    weight: float
    level: Hashable
    tree: Hashable


def binary_tree_layers(horizon: int, weight: float = 1.0) -> list[Layer]:
    """The noised nodes of TREEMECH over ``horizon`` steps: at level ``ℓ`` the odd-index nodes ``N(ℓ, i)``
    (those the streaming tree noises), complete by ``horizon``."""
    return _binary_block(0, horizon, horizon, weight, 0, horizon.bit_length())


def _binary_block(start: int, done: int, size: int, weight: float, tree: Hashable, levels: int) -> list[Layer]:
    """Odd-index nodes of a binary tree of ``size`` steps from ``start``, ``done`` of them run, ``levels`` levels."""
    done = min(done, size)
    counts = [((done >> lv) + 1) // 2 for lv in range(levels)]
    return [Layer(start, 1 << lv, (2 << lv) if count > 1 else 1 << lv, count, weight, lv, tree)
            for lv, count in enumerate(counts) if count]


def honaker_layers(arity: int, weights: Sequence[float], horizon: int) -> list[Layer]:
    """The nodes of a k-ary (Honaker) tree over ``horizon`` steps: every node of a level of weight ``> 0``."""
    out = []
    for lv, w in enumerate(weights):
        span = arity**lv
        if w > 0 and horizon // span:
            out.append(Layer(0, span, span, horizon // span, float(w), lv, 0))
    return out


def doubling_layers(block_weight: Callable[[int], float], horizon: int) -> list[Layer]:
    """Doubling restarts: block ``j`` (0-based steps ``[2^j − 1, 2^{j+1} − 1)``) is a binary tree of ``2^j``
    steps and ``j + 1`` levels of weight ``block_weight(j)``."""
    out: list[Layer] = []
    j = 0
    while (1 << j) - 1 < horizon:
        start = (1 << j) - 1
        out += _binary_block(start, horizon - start, 1 << j, block_weight(j), j, j + 1)
        j += 1
    return out


def hybrid_layers(block_weight: Callable[[int], float], horizon: int) -> list[Layer]:
    """The hybrid's trees ``B_k`` (``k >= 1``: 0-based steps ``[2^k, 2^{k+1} − 1)``, ``k`` levels of weight
    ``block_weight(k)``). Its logarithmic part is :func:`log_layers`."""
    out: list[Layer] = []
    k = 1
    while (1 << k) < horizon:
        out += _binary_block(1 << k, horizon - (1 << k), (1 << k) - 1, block_weight(k), k, k)
        k += 1
    return out


def log_layers(weight: float, horizon: int) -> list[Layer]:
    """The hybrid's logarithmic part: the increment ``η_j`` covers 0-based steps ``[2^{j−1}, 2^j)`` (``η_0``:
    step 0), one node each, complete at ``2^j <= horizon``."""
    out = [Layer(0, 1, 1, 1, weight, "L", 0)]
    j = 1
    while (1 << j) <= horizon:
        out.append(Layer(1 << (j - 1), 1 << (j - 1), 1 << (j - 1), 1, weight, "L", j))
        j += 1
    return out


def window_layers(block: int, weight: float = 1.0) -> list[Layer]:
    """The window tree: complete binary trees of ``block`` steps, every node noised; two consecutive blocks
    (a window of ``block`` steps meets at most two)."""
    levels = block.bit_length()
    return [Layer(b * block, 1 << lv, 1 << lv, block >> lv, weight, lv, b) for b in (0, 1) for lv in range(levels)]


def _vertex(k: int, caps: list[tuple[int, int]]) -> int:
    """``max Σ x_v²`` over ``Σ x_v <= k``, ``0 <= x_v <= cap_v`` (``caps``: (cap, count) groups): a convex
    maximum, at a vertex; filling the largest caps first is optimal (an exchange argument)."""
    total, left = 0, k
    for cap, count in sorted(caps, reverse=True):
        full = min(count, left // cap)
        total += full * cap * cap
        left -= full * cap
        if full < count and left:
            return total + left * left
    return total


def _layer_bounds(layers: list[Layer], k: int, b: int, pure: bool) -> tuple[float, float, float]:
    """``(base, per-tree bound, per-level bound)`` of ``max_P Σ_v w_v cnt_v^p`` (``p = 1`` pure, 2 Gaussian).

    Per tree: ``cnt_v <= min(k, ⌈len/b⌉)`` and a step lies in one node per layer of its own tree, all of
    which its tree's first step lies in, so ``Σ_v w_v cnt_v² = Σ_{s∈P} Σ_{v∋s} w_v cnt_v <= k · max_tree
    Σ_layers w·min(k, ⌈len/b⌉)`` (pure: ``k · max_tree Σ w``). Per level (nodes disjoint, weight at most
    the level's largest): ``Σ cnt_v <= min(k, steps the level can hold)``, each ``cnt_v <= ⌈len/b⌉``, and
    ``Σ cnt_v²`` is at most the vertex :func:`_vertex`. ``base``: the single-step value, ``max_tree Σ w``."""
    trees: dict[Hashable, list[float]] = {}
    levels: dict[Hashable, list] = {}
    for layer in layers:
        cap = -(-layer.length // b)
        held = min(layer.count * cap, -(-((layer.count - 1) * layer.stride + layer.length) // b))
        tree = trees.setdefault(layer.tree, [0.0, 0.0])
        tree[0] += layer.weight
        tree[1] += layer.weight * min(k, cap)
        level = levels.setdefault(layer.level, [0.0, 0, []])
        level[0] = max(level[0], layer.weight)
        level[1] += held
        level[2].append((cap, layer.count))
    base = max(t[0] for t in trees.values())
    if pure:
        per_tree = k * base
        per_level = sum(w * min(k, held) for w, held, _ in levels.values())
    else:
        per_tree = k * max(t[1] for t in trees.values())
        per_level = sum(w * _vertex(min(k, held), caps) for w, held, caps in levels.values())
    return base, per_tree, per_level


def _step_values(layers: list[Layer], horizon: int, k: int, b: int, pure: bool) -> np.ndarray:
    """Per step ``s``: ``Σ_{v∋s} w_v`` (pure) or ``Σ_{v∋s} w_v min(k, ⌈len_v/b⌉)`` (Gaussian), O(horizon) per
    level."""
    out = np.zeros(horizon)
    for layer in layers:
        end = min(horizon, layer.start + (layer.count - 1) * layer.stride + layer.length)
        offsets = np.arange(end - layer.start) % layer.stride < layer.length
        value = layer.weight * (1 if pure else min(k, -(-layer.length // b)))
        out[layer.start:end] += np.where(offsets, value, 0.0)
    return out


def _best_separated_sum(values: np.ndarray, k: int, b: int) -> tuple[float, bool]:
    """``(max Σ_{s∈P} values_s, exact)`` over ``|P| <= k``, gaps ``>= b``, ``values >= 0``: the top ``k``
    (``b = 1``, exact), the DP ``F_j = cummax(shift_b(F_{j−1}) + values)`` (exact, when ``n·k`` is small),
    else the top ``k`` ignoring the separation (a bound)."""
    n = values.size
    k = min(k, n)
    if b == 1 or n * k > _DP_CELLS:
        top = np.partition(values, n - k)[n - k:] if k < n else values
        return float(np.sum(top)), b == 1
    best = np.maximum.accumulate(values)
    for _ in range(k - 1):
        shifted = np.concatenate([np.zeros(b), best[:-b]]) if b < n else np.zeros(n)  # F_{j−1}, b steps back
        best = np.maximum(best, np.maximum.accumulate(shifted + values))
    return float(best[-1]), True


def _pattern_value(layers: list[Layer], steps: np.ndarray, pure: bool) -> float:
    """``Σ_v w_v cnt_v^p`` of the pattern ``steps`` (0-based)."""
    total = 0.0
    for layer in layers:
        rel = steps - layer.start
        index = rel // layer.stride
        inside = (rel >= 0) & (rel % layer.stride < layer.length) & (index < layer.count)
        if inside.any():
            counts = np.bincount(index[inside]).astype(np.float64)
            total += layer.weight * float(np.sum(counts if pure else counts * counts))
    return total


def tree_multiplier(layers: list[Layer], participation: Participation, horizon: int | None, pure: bool,
                    window: int | None = None) -> UnitSensitivity:
    """Multiplier of a tree over ``horizon`` steps (``None``: forever, the layers then cover ``MAX_COUNT``
    steps) from its noised nodes ``layers``, for ``participation`` within ``window`` steps (default: the
    horizon): an upper bound, the least of

    * per tree and per level (:func:`_layer_bounds`; any horizon, O(layers));
    * for horizons up to ``2^20``, the additive bound ``max_P Σ_{s∈P} Σ_{v∋s} w_v·m_v`` (``m_v = 1`` pure,
      ``min(k, ⌈len_v/b⌉)`` Gaussian: ``cnt_v <= m_v``), maximised exactly over patterns for ``b = 1`` or
      small ``n·k`` (:func:`_best_separated_sum`). Pure, maximised exactly, it *is* the maximum.

    ``exact`` when the maximum is attained: by that exact pure maximum, or by a candidate pattern (the
    earliest pattern from the first step of the heaviest trees; the first steps of the trees) whose
    value equals the bound. Exact, checked by brute force on small horizons: every pure tree with ``b = 1``
    or small ``n·k``; Gaussian k-ary/window trees with ``b`` dividing the node sizes (all nodes noised:
    the earliest pattern fills every level); the binary trees (odd nodes only) when ``k`` is a power of two
    and ``b = 1``; any tree at ``k = 1``.
    """
    b = participation.min_separation
    k = participation.steps_within(horizon if window is None else window)
    n = MAX_COUNT if horizon is None else horizon
    base, per_tree, per_level = _layer_bounds(layers, k, b, pure)
    upper, exact = min(per_tree, per_level), k == 1
    if n <= _ARRAY_STEPS:
        additive, solved = _best_separated_sum(_step_values(layers, n, k, b, pure), k, b)
        if pure and solved:  # the maximum itself
            upper, exact = additive, True
        else:
            upper = min(upper, additive)
    if not exact:
        exact = _attained(layers, k, b, n, pure) >= upper * (1.0 - _EXACT_RTOL)
    power = 1.0 if pure else 0.5
    # never above k: ‖Σ_{s∈P} C[:, s]‖ <= Σ_{s∈P} ‖C[:, s]‖ (group privacy)
    return UnitSensitivity(max(1.0, min(float(k), (upper / base) ** power)), exact, k)


def _attained(layers: list[Layer], k: int, b: int, n: int, pure: bool) -> float:
    """The best value of a few admissible patterns (a lower bound of the maximum), within a cost limit."""
    weight: dict[Hashable, float] = {}
    starts: dict[Hashable, int] = {}
    for layer in layers:
        weight[layer.tree] = weight.get(layer.tree, 0.0) + layer.weight * (1 if pure else min(k, -(-layer.length // b)))
        starts[layer.tree] = min(starts.get(layer.tree, layer.start), layer.start)
    heavy = sorted(weight, key=lambda tree: (weight[tree], starts[tree]), reverse=True)
    afford = _PATTERN_CELLS // len(layers)
    candidates = []
    for tree in heavy[:4]:  # the earliest pattern from a tree's first step
        size = min(k, (n - 1 - starts[tree]) // b + 1)
        if size <= afford:
            candidates.append(starts[tree] + b * np.arange(size, dtype=np.int64))
    picked: list[int] = []  # the trees' first steps, heaviest first, kept when b apart
    for tree in heavy:
        if len(picked) < min(k, afford) and all(abs(starts[tree] - s) >= b for s in picked):
            picked.append(starts[tree])
    candidates.append(np.array(sorted(picked), dtype=np.int64))
    return max(_pattern_value(layers, steps, pure) for steps in candidates)


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
def _weight(node: Any, pure: bool) -> float:
    """A node's weight: ``1/c`` (pure: its ε per unit of L2 move) or ``1/σ²`` (Gaussian)."""
    return 1.0 / node.scale if pure else 1.0 / node.scale**2


def unit_sensitivity(mechanism: Any, participation: Participation, horizon: int | None = None) -> UnitSensitivity:
    """The unit-level multiplier of a counter as it calibrates today (``BLTSum``, ``ToeplitzSqrtSum``,
    ``BinaryTreeSum``, ``HybridTreeSum``, ``DoublingTreeSum``, ``HonakerTreeSum``/``KaryTreeSum``,
    ``WindowTreeSum``, a ``SnappedSum`` of one), over ``horizon`` steps (``None``: the mechanism's own;
    forever for those without one). The hybrid's two parts are certified apart (``ε/2`` each): its
    multiplier is the larger of theirs. The window tree protects the last ``B >= W`` steps and
    ``max_steps`` counts a unit's steps within any ``W`` consecutive ones (the requested window), so a
    unit has at most ``k·⌈B/W⌉`` steps in the protected ones."""
    from beam_dp.mechanisms.sums.blt import BLTSum
    from beam_dp.mechanisms.sums.factorization import ToeplitzFactorizationSum
    from beam_dp.mechanisms.sums.honaker import HonakerTreeSum
    from beam_dp.mechanisms.sums.snapping import SnappedSum
    from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
    from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

    if isinstance(mechanism, SnappedSum):
        return unit_sensitivity(mechanism.inner, participation, horizon)
    own = getattr(mechanism, "horizon", None)
    if isinstance(mechanism, HonakerTreeSum):  # a KaryTreeSum's horizon only picks its fit: forever
        own = None
    if horizon is not None:
        horizon = check_count("horizon", horizon, 1, own if own is not None else MAX_COUNT)
    else:
        horizon = own
    pure = getattr(mechanism, "noise_law", "gaussian") != "gaussian"
    n = MAX_COUNT if horizon is None else horizon
    if isinstance(mechanism, BLTSum):
        return blt_multiplier(mechanism.blt, participation, horizon)
    if isinstance(mechanism, ToeplitzFactorizationSum):
        return toeplitz_multiplier(mechanism.c_coeffs(n), participation)
    if isinstance(mechanism, BinaryTreeSum):
        return tree_multiplier(binary_tree_layers(n, _weight(mechanism.node_noise, pure)), participation, horizon, pure)
    if isinstance(mechanism, HonakerTreeSum):
        weights = [0.0 if node is None else _weight(node, pure) for node in mechanism.level_noise]
        return tree_multiplier(honaker_layers(mechanism.arity, weights, n), participation, horizon, pure)
    if isinstance(mechanism, DoublingTreeSum):
        layers = doubling_layers(lambda j: _weight(mechanism.block_noise(j), pure), n)
        return tree_multiplier(layers, participation, horizon, pure)
    if isinstance(mechanism, HybridTreeSum):
        parts = [tree_multiplier(log_layers(_weight(mechanism.log_noise, pure), n), participation, horizon, pure)]
        layers = hybrid_layers(lambda k: _weight(mechanism.block_noise(k), pure), n)
        if layers:  # B_1 starts at step 3
            parts.append(tree_multiplier(layers, participation, horizon, pure))
        return max(parts, key=lambda part: part.multiplier)
    if isinstance(mechanism, WindowTreeSum):
        block, k, b = mechanism.block, participation.max_steps, participation.min_separation
        per_block = Participation(None if k is None else k * -(-block // mechanism.window), b)
        got = tree_multiplier(window_layers(block, _weight(mechanism.node_noise, pure)), per_block, 2 * block, pure,
                              window=min(block, n))
        binding = k is not None and block > mechanism.window and k < -(-mechanism.window // b)
        return dataclasses.replace(got, exact=False) if binding else got  # patterns ignore the W-windows
    raise TypeError(f"no unit-level sensitivity for {type(mechanism).__name__}")
