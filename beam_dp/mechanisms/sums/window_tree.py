"""Window tree mechanism: private prefix sums with privacy expiration (Chan, Shi & Song, "Private and Continual Release of Statistics").

Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" (Lemmas 1 and 3, Fig. 1), built on the running sums with privacy
expiration of Bolot et al. 2013.

Guarantee
---------
*Window differential privacy, event level* (replace one contribution; every contribution is
clipped to L2 norm ``R`` so a step vector moves by at most ``Δ₂ = 2R``). For any horizon ``T``,
a step ``t`` with ``T - t < B`` (one of the last ``B`` steps) is protected: changing one of its
contributions changes the probability of any event over the whole release sequence ``s_1..s_T``
by a factor at most ``e^ε`` (Gamma / K-norm noise: window ε-DP) or ``e^ε`` plus ``δ`` (Gaussian
noise: window (ε, δ)-DP). ``B = 2^⌈log₂ W⌉ >= W`` is the block size, so the requested window
``W`` is protected too; ``Guarantee.window`` is ``B`` and ``Guarantee.window_requested``
is ``W``. ε is in nats, δ is a probability.

**Expired steps are published.** Once ``B`` later steps have arrived, a step has no guarantee
at all: from the release at step ``t + B`` on, its exact value is part of the *clean* (un-noised)
part of every release (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" Definition 6). Use this mechanism only where old data may
become public.

Construction
------------
Block ``b >= 1`` holds steps ``(b-1)B+1 .. bB`` and carries a complete binary tree of
``2B - 1`` noisy nodes ``N_b(ℓ, i)`` (``ℓ = 0..h``, ``h = log₂ B``, ``i = 1..B/2^ℓ``), each
covering block positions ``(i-1)2^ℓ+1 .. i·2^ℓ``. A step lies in exactly ``L_W = h + 1 =
⌈log₂ W⌉ + 1`` nodes, all in its own block. A node's noise enters the state when it completes, keyed by
``(stream, "wtm", block, level, index)`` in the ``NoiseSource``, so it is a pure function of its
key and can never be redrawn (an engine closing many steps in one call may draw it earlier, with the
nodes of its next steps: ``NodeNoise.draw_step``, the same value). The release at step ``t`` (block ``k``, position ``j``) is

    exact sum of steps 1..t-B (blocks 1..k-2 and positions 1..j of block k-1)
    + noisy suffix of block k-1 (positions j+1..B; right children; popcount(B-j) nodes)
    + noisy prefix of block k   (positions 1..j; left children / root; popcount(j) nodes)

so it uses at most ``L_W`` noisy nodes (§4.4) and the first block is a plain tree with ``L_W``
levels.

Noise and spend per node
------------------------
* ``noise="gamma"``: K-norm noise, ``‖n‖ ~ Gamma(d, c_W)``, uniform direction,
  ``c_W = Δ₂ (⌈log₂ W⌉ + 1) / ε`` (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" eq. 11). One node costs ``Δ₂ / c_W = ε / L_W``;
  a step is in ``L_W`` nodes, so ``L_W · ε / L_W = ε``. Per-coordinate node variance
  ``(d+1) c_W²``.
* ``noise="gaussian"``: ``N(0, σ_W² I_d)``. ``calibration="analytic"`` (default): the smallest σ
  passing the exact analytic Gaussian test (Balle & Wang 2018) at ``(ε, δ)`` on the joint
  sensitivity ``Δ₂ √L_W`` of the whole release sequence (below), so a step still protected spends
  exactly ``ε`` once its ``L_W`` nodes are out. ``calibration="paper"``: ``σ_W² = 8 Δ₂² L_W² ln²(2/δ)
  / ε²`` (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" eq. 13), certified by the same test (raises ``ValueError`` if it fails); it
  is far larger than needed (at ``W = 8``, ``δ = 1e-6`` it spends about 4% of ``ε``). One node is a
  Gaussian charge ``μ = Δ₂ / σ_W``.

The Gamma scale is exact under either ``calibration`` (K-norm noise of scale ``c`` on a node moved
by ``Δ₂`` in L2 costs exactly ``Δ₂/c``, and the pure losses of the ``L_W`` nodes add).

Joint sensitivity
-----------------
Up to a horizon ``T``, the releases are a function of the exact values of the expired steps (those
``<= T - B``) and of the noisy nodes they use, so a protected step moves only the noisy nodes that
contain it and that some release ``<= T`` uses. Those are all of its ``L_W`` nodes in the worst case,
never more: a left child or root ``N_k(ℓ, i)`` (``i`` odd) enters the prefix of block ``k`` at its
completion, a right child (``i`` even) the suffix of block ``k-1`` at block ``k+1``'s position
``(i-1)2^ℓ``, fewer than ``B`` steps after any step it covers. So the joint L2 sensitivity is
``Δ₂ √L_W`` (``WindowTreeSum.joint_nodes = L_W``; ``tests/mechanisms/sums/test_window_tree_exact.py``
enumerates it for every position and horizon of small windows).

``Release.epsilon_spent`` is the spend of the worst step still protected: ``ε · m_t / L_W`` with
``m_t = min(L_W, ⌊log₂ t⌋ + 1)`` completed nodes (Gamma), or the analytic ε' at δ of ``m_t``
Gaussian charges (``delta_spent = δ``).

State
-----
``WindowTreeState`` (§4.7): the exact sum of blocks ``1..k-2``, the exact prefix sums and node
noises of block ``k-1`` (``B+1`` and ``2B-1`` vectors) and of block ``k`` so far (at most the
same). At most ``6B + 1`` vectors of length ``d``, independent of ``t``. Node noises are stored
in completion order (``N(ℓ, i)`` completes at block position ``i·2^ℓ``; the nodes completed by
position ``p`` are the first ``2p - popcount(p)``).

The step is written once for a group of streams (``GroupSteppedSum``: every array above gains a
leading stream axis, and each step is one array operation per completing node for the whole group);
the per-stream ``step`` is the group of one, and ``unstack`` hands out read-only row views, not copies.

The current block's arrays are leading-row views of preallocated ``(streams, capacity, d)`` buffers
that later steps fill in place, so one step costs ``O(L_W · d)`` numpy work per stream (plus one
``O(B·d)`` buffer allocation per block, and one after a state was decoded, stacked from separate
states or unstacked from a larger group). A state is never changed by stepping it: rows after a
state's own rows are unused by it, and stepping the same state twice (e.g. a retry) notices that
the next rows were already claimed and copies instead of overwriting. Do not step one state
object from two threads at once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from beam_dp.core.calibration import sigma_window_002
from beam_dp.core.guarantee import Charge, ElementLoss, Guarantee
from beam_dp.core.limits import check_window
from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.base import GroupState, GroupSteppedSum, NodeNoise, SumSpec
from beam_dp.mechanisms.sums.tree import _check_step_number

__all__ = ["WindowTreeState", "WindowTreeSum"]

PURPOSE = "wtm"

_FIELDS = ("clean_base", "prev_prefix", "prev_noise", "cur_prefix", "cur_noise")  # the state's arrays
Node = tuple[int, int, int]  # (block, level, index) = N_block(level, index)
_Span = tuple[int, int, int, int]  # (level, index, lo, hi): N(level, index) covers block positions lo+1..hi
_Gather = tuple[np.ndarray, np.ndarray, np.ndarray]  # (hi, lo, noise rows) index arrays


@dataclass(frozen=True)
class WindowTreeState:
    """State of one stream after ``t`` steps. ``k``/``j`` below refer to step ``t + 1``.

    ``clean_base``  (d,)          exact sum of all blocks before the previous one;
    ``prev_prefix`` (B+1, d)      exact prefix sums of the previous block (``(0, d)`` if none);
    ``prev_noise``  (2B-1, d)     noises of all nodes of the previous block, completion order;
    ``cur_prefix``  (j, d)        exact prefix sums of the current block, ``cur_prefix[0] = 0``;
    ``cur_noise``   (n, d)        noises of its completed nodes, ``n = 2(j-1) - popcount(j-1)``.
    """

    STATE_VERSION: ClassVar[int] = 1

    stream: str
    t: int
    clean_base: np.ndarray
    prev_prefix: np.ndarray
    prev_noise: np.ndarray
    cur_prefix: np.ndarray
    cur_noise: np.ndarray


def _tz(n: int) -> int:
    """Trailing zero bits of ``n >= 1``."""
    return (n & -n).bit_length() - 1


def _completed_before(p: int) -> int:
    """Number of nodes of a block completed by block position ``p`` (``2p - popcount(p)``)."""
    return 2 * p - p.bit_count()


def _noise_row(level: int, index: int) -> int:
    """Row of node ``N(level, index)`` in the completion-ordered noise array of its block."""
    return _completed_before((index << level) - 1) + level


@functools.lru_cache(maxsize=8192)
def _decomposition(block: int, j: int) -> tuple[tuple[_Span, ...], tuple[_Span, ...]]:
    """Nodes for block position ``j`` of a block of size ``block``: ``(prefix, suffix)``.

    Each entry is ``(level, index, lo, hi)``: the node ``N(level, index)`` covering block positions
    ``lo+1 .. hi``. ``prefix`` decomposes positions ``1..j`` (§2.2, high bits first), ``suffix``
    positions ``j+1..block`` greedily from the left (§4.4); both in step order.
    """
    h = block.bit_length() - 1
    prefix = []
    pos = 0
    for level in range(h, -1, -1):
        if (j >> level) & 1:
            prefix.append((level, (pos >> level) + 1, pos, pos + (1 << level)))
            pos += 1 << level
    suffix = []
    a = j
    while a < block:
        level = _tz(a)
        suffix.append((level, (a >> level) + 1, a, a + (1 << level)))
        a += 1 << level
    return tuple(prefix), tuple(suffix)


def _index_arrays(nodes: tuple[_Span, ...]) -> _Gather:
    """``(hi, lo, noise rows)`` index arrays of a node list from :func:`_decomposition`."""
    arrays = (
        np.array([hi for _, _, _, hi in nodes], dtype=np.intp),
        np.array([lo for _, _, lo, _ in nodes], dtype=np.intp),
        np.array([_noise_row(level, i) for level, i, _, _ in nodes], dtype=np.intp),
    )
    for arr in arrays:
        arr.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=8192)
def _gather_plan(block: int, j: int) -> tuple[_Gather, _Gather, int, int]:
    """Index arrays for the prefix and suffix nodes of position ``j``, and their counts."""
    prefix, suffix = _decomposition(block, j)
    return _index_arrays(prefix), _index_arrays(suffix), len(prefix), len(suffix)


def _writable_buffer(view: np.ndarray, extra: int, capacity: int) -> np.ndarray:
    """A ``(streams, capacity, d)`` buffer whose first ``view.shape[1]`` rows per stream equal ``view``
    ``(streams, n, d)`` and whose next ``extra`` rows may be written without changing any existing state.

    Reuses the buffer ``view`` is the leading rows of when the row after ``view`` is unclaimed
    (NaN: rows ``n..n+extra-1`` of every stream are always written together by one step, so one
    check suffices); otherwise (a decoded or stacked state, one unstacked from a larger group, or a
    state that was stepped before, e.g. a retry) copies. The stream stride of a group of one is not
    compared (``state[None]`` has stride 0 there).
    """
    streams, n, d = view.shape
    if n + extra > capacity:
        raise ValueError(f"window tree state overflow: {n} + {extra} rows > capacity {capacity}")
    base = view.base
    if (
        type(base) is np.ndarray
        and base.shape == (streams, capacity, d)
        and base.dtype == np.float64
        and base.flags.writeable
        and view.strides[1:] == base.strides[1:]
        and (streams == 1 or view.strides[0] == base.strides[0])
        and view.ctypes.data == base.ctypes.data
        and math.isnan(base[0, n, 0])
    ):
        return base
    buf = np.empty((streams, capacity, d))
    buf[:, :n] = view
    buf[:, n:] = np.nan
    return buf


def _frozen_rows(buf: np.ndarray, n: int) -> np.ndarray:
    """Read-only view of the first ``n`` rows of every stream of ``buf`` (the form state arrays take)."""
    out = buf[:, :n]
    out.flags.writeable = False
    return out


class WindowTreeSum(GroupSteppedSum[WindowTreeState]):
    """Private prefix sums of vectors in ``R^dim`` with privacy expiration after ``B >= W`` steps.

    See the module docstring for the guarantee (window ε-DP or (ε, δ)-DP over the last ``B`` steps,
    event level; expired steps appear un-noised in later releases), the per-node spend and units.

    Attributes: ``window`` (W), ``block`` (B = 2^⌈log₂ W⌉), ``levels`` (L_W = ⌈log₂ W⌉ + 1),
    ``node_noise`` (law and scale ``c_W`` or ``σ_W`` of every node), ``guarantee``.
    """

    name = "window_tree"
    state_type = WindowTreeState

    default_calibration = "analytic"

    def __init__(self, spec: SumSpec | None = None, /, *, window: int, **given: Any) -> None:
        """Args:
            spec: the shared parameters (:class:`~beam_dp.mechanisms.base.SumSpec`; or its fields as
                keywords, ``calibration`` defaulting to ``"analytic"``): ``noise`` ``"gamma"`` (K-norm,
                window ε-DP) or ``"gaussian"`` (window (ε, δ)-DP); ``calibration`` ``"analytic"`` (the
                smallest exact σ) or ``"paper"`` (eq. 13, certified).
            window: ``W`` steps, in ``[1, MAX_WINDOW_CELLS // dim]``; protection lasts ``B = 2^⌈log₂ W⌉`` steps.
        """
        super().__init__(spec, **given)
        self.window = check_window(window, self.dim)
        self.block = 1 << (self.window - 1).bit_length()  # smallest power of two >= W
        self.height = self.block.bit_length() - 1  # h = log2 B
        self.levels = self.height + 1  # L_W = ceil(log2 W) + 1
        self.guarantee = Guarantee(self.epsilon, self.delta, window=self.block, window_requested=self.window)
        self.joint_nodes = self.levels  # noisy nodes one protected step moves (module docstring)
        if self.noise_law == "gamma":
            self.node_noise = NodeNoise("gamma", self.sensitivity * self.joint_nodes / self.epsilon, "exact")
        else:
            paper = sigma_window_002(self.epsilon, self.delta, self.sensitivity, self.levels)
            sigma, how = self.gaussian_sigma(paper, self.epsilon, self.delta, self.joint_nodes)
            self.node_noise = NodeNoise("gaussian", sigma, how)

    def __repr__(self) -> str:
        return (
            f"WindowTreeSum(dim={self.dim}, window={self.window}, block={self.block}, levels={self.levels}, "
            f"{self.guarantee.describe()}, noise={self.node_noise.law}, scale={self.node_noise.scale:.6g})"
        )

    # -- node bookkeeping (pure functions of the public step numbers) ------------------------
    def _locate(self, t: int) -> tuple[int, int]:
        t = _check_step_number(t)
        k = (t - 1) // self.block + 1
        return k, t - (k - 1) * self.block

    def node_steps(self, node: Node) -> tuple[int, int]:
        """Global steps ``(first, last)`` covered by node ``(block, level, index)``; ``last`` is when it
        completes and gets its noise."""
        b, level, i = node
        if b < 1 or not 0 <= level <= self.height or not 1 <= i <= self.block >> level:
            raise ValueError(f"no node {node!r} in a window tree with block size {self.block}")
        start = (b - 1) * self.block
        return start + ((i - 1) << level) + 1, start + (i << level)

    def nodes_containing(self, t: int) -> list[Node]:
        """The ``L_W`` nodes step ``t`` lies in (level 0 first); all in its own block."""
        k, j = self._locate(t)
        return [(k, level, ((j - 1) >> level) + 1) for level in range(self.levels)]

    def nodes_used(self, t: int) -> list[Node]:
        """The noisy nodes whose values enter the release at step ``t``, in step order: the suffix of
        block ``k-1`` (if ``k >= 2``), then the prefix of block ``k``."""
        k, j = self._locate(t)
        prefix, suffix = _decomposition(self.block, j)
        used = [(k - 1, lv, i) for lv, i, _, _ in suffix] if k >= 2 else []
        return used + [(k, lv, i) for lv, i, _, _ in prefix]

    def noisy_nodes(self, t: int) -> int:
        """``k_t``: number of noisy nodes in the release at step ``t`` (three cases of §4.4)."""
        k, j = self._locate(t)
        if k == 1:
            return j.bit_count()
        if j == self.block:
            return 1
        return self.levels - _tz(j)

    def clean_through(self, t: int) -> int:
        """Largest step whose exact value is in the clean part of the release at ``t`` (0: none).

        Always ``max(0, t - B)``: steps inside the window are never used clean."""
        k, j = self._locate(t)
        return 0 if k == 1 else (k - 2) * self.block + j

    def clean_part(self, state: WindowTreeState) -> np.ndarray:
        """TEST/AUDIT ONLY (raw data): the exact, un-noised part of the release at step ``state.t``
        (the state returned by that step)."""
        k, j = self._locate(state.t)
        if k == 1:
            return np.zeros(self.dim)
        if j == self.block:  # the step closed block k and folded block k-1 into the base
            return state.clean_base.copy()
        return state.clean_base + state.prev_prefix[j]

    def held_nodes(self, state: WindowTreeState) -> dict[Node, tuple[np.ndarray, np.ndarray]]:
        """TEST/AUDIT ONLY (raw data): ``{node: (clean value, noise)}`` of every completed node the
        state holds (previous block and current block)."""
        k_next, j_next = self._locate(state.t + 1)
        out: dict[Node, tuple[np.ndarray, np.ndarray]] = {}
        blocks = [(k_next - 1, state.prev_prefix, state.prev_noise), (k_next, state.cur_prefix, state.cur_noise)]
        for b, prefix, noise in blocks:
            done = prefix.shape[0] - 1
            if b < 1 or done < 1:
                continue
            for level in range(self.levels):
                for i in range(1, (done >> level) + 1):
                    lo, hi = (i - 1) << level, i << level
                    out[(b, level, i)] = (prefix[hi] - prefix[lo], noise[_noise_row(level, i)].copy())
        return out

    # -- privacy and error arithmetic -------------------------------------------------------
    def noise_var(self, t: int) -> float:
        """Per-coordinate noise variance of the release at ``t``: ``k_t`` × node variance."""
        return self.noisy_nodes(t) * self.node_variance(self.node_noise)

    def nodes_completing(self, t: int) -> list[Node]:
        """The nodes that complete (and get their noise) at step ``t``, in completion order (level 0 first)."""
        k, j = self._locate(t)
        return [(k, level, j >> level) for level in range(_tz(j) + 1)]

    def charges_at(self, t: int) -> list[Charge]:
        """Charges of the nodes that get their noise at step ``t`` (those completing at ``t``)."""
        return [self.node_noise.charge(*self.node_steps(node), self.sensitivity, f"wtm{node}")
                for node in self.nodes_completing(t)]

    def worst_loss(self, t: int) -> ElementLoss:
        """Loss of the worst step still protected after the release at ``t``: ``m_t`` completed nodes
        (memoised: ``m_t`` takes at most ``L_W + 1`` values)."""
        completed = min(self.levels, int(t).bit_length())  # floor(log2 t) + 1, capped at L_W
        cache = self.__dict__.setdefault("_loss_cache", {})
        loss = cache.get(completed)
        if loss is None:
            node = self.node_noise
            if node.law == "gamma":
                loss = ElementLoss.of_noise("gamma", self.sensitivity, node.scale, completed,
                                            pure_epsilon=self.epsilon * completed / self.levels)
            else:
                loss = ElementLoss.of_noise("gaussian", self.sensitivity, node.scale, completed)
            cache[completed] = loss
        return loss

    def max_spend(self, last_step: int | None = None) -> tuple[float, float]:
        """The most any release up to ``last_step`` (``None``: any step) spends, ``(epsilon, delta)``:
        the spend of :meth:`worst_loss` there. Equals the guarantee (to the calibration's tolerance)
        once ``last_step >= 2^{L_W - 1}`` with ``calibration="analytic"`` or Gamma noise; less with the
        paper's Gaussian calibration or a shorter public horizon."""
        return self.spend(self.worst_loss(self.block if last_step is None else max(1, int(last_step))))

    def _release_meta(self, k_t: int) -> dict:
        """The public meta of a release with ``k_t`` noisy nodes (a new dict of memoised values)."""
        cache = self.__dict__.setdefault("_meta_cache", {})
        meta = cache.get(k_t)
        if meta is None:
            var = k_t * self.node_variance(self.node_noise)
            meta = cache[k_t] = {
                "noisy_nodes": int(k_t),
                "levels": int(self.levels),
                "window": int(self.block),
                "window_requested": int(self.window),
                "noise": self.node_noise.law,
                "scale": float(self.node_noise.scale),
                "noise_std": float(math.sqrt(var)),
                "calibration": self.node_noise.calibration,
            }
        return dict(meta)

    # -- the mechanism -------------------------------------------------------------------------
    def init_state(self, stream: str) -> WindowTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        d = self.dim
        return WindowTreeState(
            stream=stream,
            t=0,
            clean_base=np.zeros(d),
            prev_prefix=np.zeros((0, d)),
            prev_noise=np.zeros((0, d)),
            cur_prefix=np.zeros((1, d)),
            cur_noise=np.zeros((0, d)),
        )

    @staticmethod
    def _stream_array(arr: np.ndarray, i: int) -> np.ndarray:
        """A read-only view of stream ``i``'s rows: later steps of the group write only rows beyond
        them, so the group of one stays ``O(L_W·d)`` per step (module docstring)."""
        out = arr[i]
        out.flags.writeable = False
        return out

    def _check_group(self, group: GroupState, k: int, j: int) -> None:
        d, B, a = self.dim, self.block, group.arrays
        n, prev = len(group.streams), (self.block if k >= 2 else 0)
        expected = ((n, d), (n, prev + (prev > 0), d), (n, max(2 * prev - 1, 0), d), (n, j, d),
                    (n, _completed_before(j - 1), d))
        if tuple(a[name].shape for name in _FIELDS) != expected:
            raise ValueError(
                f"window tree state does not match step t={group.t} (block size {B}, dim {d}): shapes "
                + ", ".join(str(a[name].shape[1:]) for name in _FIELDS)
            )

    def _advance_group(
        self, group: GroupState, vectors: np.ndarray, noise: NoiseSource
    ) -> tuple[GroupState, np.ndarray, dict, ElementLoss]:
        t = group.t + 1
        k, j = self._locate(t)
        self._check_group(group, k, j)
        B, d, a, streams = self.block, self.dim, group.arrays, group.streams

        # Position j of block k: extend the exact prefix sums, noise the nodes completing now
        # (N_k(l, j >> l) for l = 0..tz(j)), in completion order.
        new_rows = a["cur_prefix"][:, j - 1] + vectors
        fresh = self.node_noise.draw_step(noise, streams, PURPOSE, t, self.nodes_completing, d)
        if not (np.isfinite(new_rows).all() and np.isfinite(fresh).all()):
            raise ValueError("window tree: non-finite prefix sum or noise (overflow?)")
        buf = _writable_buffer(a["cur_prefix"], 1, B + 1)
        buf[:, j] = new_rows
        cur_prefix = _frozen_rows(buf, j + 1)
        n_done, n_new = a["cur_noise"].shape[1], fresh.shape[1]
        buf = _writable_buffer(a["cur_noise"], n_new, 2 * B - 1)
        buf[:, n_done : n_done + n_new] = fresh
        cur_noise = _frozen_rows(buf, n_done + n_new)

        # The release: clean part (steps <= t - B: blocks 1..k-2 and positions 1..j of block k-1),
        # noisy suffix of block k-1 (positions j+1..B), noisy prefix of block k (positions 1..j).
        # Each node adds its clean value and its noise.
        (p_hi, p_lo, p_rows), (s_hi, s_lo, s_rows), n_prefix, n_suffix = _gather_plan(B, j)
        total = np.add.reduce
        if k == 1:
            estimate = np.zeros((len(streams), d))
        else:
            pp = a["prev_prefix"]
            estimate = a["clean_base"] + pp[:, j]
            if n_suffix:
                estimate = estimate + total(pp[:, s_hi] - pp[:, s_lo], axis=1) + total(a["prev_noise"][:, s_rows], axis=1)
        estimate = estimate + total(cur_prefix[:, p_hi] - cur_prefix[:, p_lo], axis=1) + total(cur_noise[:, p_rows], axis=1)

        if j == B:  # block k closes: block k-1 has fully expired, fold its exact total into the base
            arrays = {
                "clean_base": a["clean_base"] + a["prev_prefix"][:, B] if k >= 2 else a["clean_base"],
                "prev_prefix": cur_prefix,
                "prev_noise": cur_noise,
                "cur_prefix": np.zeros((len(streams), 1, d)),
                "cur_noise": np.zeros((len(streams), 0, d)),
            }
        else:
            arrays = {**a, "cur_prefix": cur_prefix, "cur_noise": cur_noise}
        k_t = n_prefix + (n_suffix if k >= 2 else 0)
        return GroupState(streams, t, arrays), estimate, self._release_meta(k_t), self.worst_loss(t)
