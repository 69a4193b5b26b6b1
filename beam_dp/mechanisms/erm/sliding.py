"""Algorithm 5 (PSWERM: private sliding-window ERM) and its fine-tuning sampling variant.

Spec erm-release §5 and §6. One step = one block of ``w0`` elements; the window is the last
``2^k − 1`` blocks (w = (2^k − 1)·w0), H = 2^{k−1}. The window is tiled by a **base**
bucket of H blocks (Algorithm 1, scale ``6L/(λ ε H w0)``, cost ε/3) and one **update** bucket of
each size 2^j blocks, j = 0..k−2, left (older than the base) or right (newer), each PBERM on its
blocks (n_norm = 2^j w0) regularised to the size-2^{j+1} bucket's model (the base for j = k−2),
scale ``12L/(λ ε w0)`` (cost ε/(6·2^j)). The released model is the end of the chain: the size-1
bucket's (the base if k = 1). Transitions (the binary-counter rule of §5.2) are
:func:`start_layout`, :func:`advance_layout` and :func:`refresh_layout`.

Guarantee: ε-DP (gamma) or (ε, δ)-DP (gaussian), event level, forever (not window DP: elements
that left the window stay protected). Per element: ≤ ε/3 + 2·Σ_j ε/(6·2^j) < ε; an element
that arrived after the first window and left it has spent exactly (2/3)(1 − 2^{−k})ε.
Gaussian: σ_base = Δ(Hw0)/(μ*/√3), σ_upd = Δ(w0)/(μ*/2) (μ² ≤ μ*²/3 + 2·Σ_j μ*²/(4·4^j) < μ*²).
Sampling (gamma only): a size-2^j update uses ``b_j = 12L/(λ 2^j w0 ε)`` on a Bernoulli(p_j)
sample, p_j = (e^{ε/(6·2^j)} − 1)/(e^{ε/6} − 1); same ledger. The base is never sampled.

State: the window's rows, the bucket layout with each bucket's model, r, the spend of the blocks
in the window and the running maximum of departed blocks (O(window)), with the count of each noise
key per block and of a worst departed block (``declaration``: a release declares its worst block's noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.erm.base import ERMMechanism, LabelledRows, sampling_probability
from beam_dp.mechanisms.erm.declaration import empty_keys, keys_from_v1, padded

__all__ = ["SlidingWindowMechanism", "SlidingWindowState", "advance_layout", "refresh_layout", "start_layout"]

LEFT, BASE, RIGHT = -1, 0, 1
Bucket = tuple[int, int, int]  # (first block, size in blocks, side)


def _left_from(s: int, count: int) -> list[Bucket]:
    """Left buckets of sizes 1, 2, …, 2^{count−1}, oldest first, right after block ``s``."""
    return [(s + 2**j, 2**j, LEFT) for j in range(count)]


def start_layout(k: int) -> list[Bucket]:
    """Layout after block 2^k − 1: base = the newest H blocks, left sizes 1..2^{k−2} from block 1."""
    H = 2 ** (k - 1)
    return _left_from(0, k - 1) + [(H, H, BASE)]


def advance_layout(buckets: list[Bucket], r: int, c: int) -> tuple[list[Bucket], list[int]]:
    """New block ``c`` with r + 1 < H: returns the new layout and the sizes to retrain, in order."""
    m = (~r & (r + 1)).bit_length() - 1  # trailing 1-bits of r
    size = 2**m
    out = [b for b in buckets if not (b[2] == RIGHT and b[1] < size)]
    (old_left,) = [b for b in out if b[2] == LEFT and b[1] == size]
    out.remove(old_left)
    out += [(c - size + 1, size, RIGHT)] + _left_from(old_left[0], m)
    return sorted(out), [2**j for j in range(m, -1, -1)]


def refresh_layout(buckets: list[Bucket], k: int, c: int) -> tuple[list[Bucket], list[int]]:
    """New block ``c`` with r + 1 = H: the newest H blocks become the base, the old base minus its
    first block becomes the left side; retrain the base and the whole left chain."""
    H = 2 ** (k - 1)
    (old_base,) = [b for b in buckets if b[2] == BASE]
    return sorted(_left_from(old_base[0], k - 1) + [(c - H + 1, H, BASE)]), [H] + [2**j for j in range(k - 2, -1, -1)]


@dataclass(frozen=True)
class SlidingWindowState:
    STATE_VERSION: ClassVar[int] = 2
    STATE_MIGRATIONS: ClassVar[dict] = {1: keys_from_v1}  # v1 kept no noise keys

    stream: str
    c: int                   # blocks received
    n_models: int
    first_block: int         # block index of X[0] (1-based)
    X: np.ndarray            # the window's rows (float32, clipped, bias appended)
    y: np.ndarray
    spend: np.ndarray        # (blocks stored, 2): (pure ε, μ²) of each stored block
    departed: np.ndarray     # (2,) running max over blocks that left the window
    keys: np.ndarray         # (V, 3): the noise keys (sensitivity, scale, sample_p) used so far
    counts: np.ndarray       # (blocks stored, V) int: calls of each key per stored block
    departed_counts: np.ndarray  # (<= V,) int: the counts of a departed block with the worst loss
    r: int
    buckets: np.ndarray      # (n, 4) int: first block, size, side, model_id
    models: np.ndarray       # (n, d): each bucket's noisy model


class SlidingWindowMechanism(ERMMechanism):
    """PSWERM over windows of ``(2^levels − 1)·block`` elements. See the module docstring."""

    name = "erm_sliding_window"
    algorithm = "sliding_window"
    state_type = SlidingWindowState

    def __init__(self, *, block: int, levels: int, sampling: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block (w0) must be an integer >= 1, got {block!r}")
        if not isinstance(levels, int) or levels < 1:
            raise ValueError(f"levels (k) must be an integer >= 1, got {levels!r}")
        if sampling and self.noise_law != "gamma":
            raise ValueError("the sampling variant is pure ε only: use noise='gamma'")
        self.w0, self.k, self.H = block, levels, 2 ** (levels - 1)
        self.window_blocks = 2**levels - 1
        self.sampling = bool(sampling)
        if sampling:
            self.algorithm = "sliding_window_sampled"

    @classmethod
    def window_levels(cls, window: int, block: int) -> int:
        """k with window = (2^k − 1)·block, or ``ValueError``."""
        if not isinstance(window, int) or not isinstance(block, int) or block < 1 or window % block:
            raise ValueError(f"window must be (2^k − 1)·w0, got window={window!r}, w0={block!r}")
        q = window // block + 1
        if q < 2 or q & (q - 1):
            raise ValueError(f"window must be (2^k − 1)·w0 for an integer k >= 1, got {window} = {q - 1}·w0")
        return q.bit_length() - 1

    @property
    def schedule(self) -> dict:
        return {"block": self.w0, "levels": self.k}

    def bucket_noise(self, size: int) -> tuple[float, float]:
        """(scale, sampling probability) of a bucket of ``size`` blocks."""
        if size == self.H:
            return self.scale(self.H * self.w0, self.epsilon / 3, self.mu_total / math.sqrt(3)), 1.0
        if self.sampling:
            return (self.sens(size * self.w0) / (self.epsilon / 6),
                    sampling_probability(self.epsilon / (6 * size), self.epsilon / 6))
        return self.scale(self.w0, self.epsilon / 6, self.mu_total / 2), 1.0

    def init_state(self, stream: str) -> SlidingWindowState:
        f1, d = self.model.n_features + 1, self.model.dim
        return SlidingWindowState(stream, 0, 0, 1, np.zeros((0, f1), np.float32),
                                  np.zeros(0, np.int64 if self.model.kind == "softmax" else np.float64),
                                  np.zeros((0, 2)), np.zeros(2), empty_keys(), np.zeros((0, 0), np.int64),
                                  np.zeros(0, np.int64), 0, np.zeros((0, 4), np.int64), np.zeros((0, d)))

    def step(self, state: SlidingWindowState, block: LabelledRows, noise: NoiseSource
             ) -> tuple[SlidingWindowState, list[Release]]:
        Xb, yb = self.prepare(block, self.w0)
        c = state.c + 1
        X, y = np.concatenate([state.X, Xb]), np.concatenate([state.y, yb])
        spend = np.concatenate([state.spend, np.zeros((1, 2))])
        keys, counts = state.keys, np.concatenate([state.counts, np.zeros((1, len(state.keys)), np.int64)])
        first_block, departed, departed_counts = state.first_block, state.departed, state.departed_counts
        if c > self.window_blocks:  # the oldest block leaves the window
            column = 0 if self.noise_law == "gamma" else 1
            if spend[0, column] > departed[column]:
                departed_counts = counts[0].copy()
            departed = np.maximum(departed, spend[0])
            X, y, spend, counts, first_block = X[self.w0:], y[self.w0:], spend[1:], counts[1:], first_block + 1
        if c < self.window_blocks:
            return SlidingWindowState(state.stream, c, state.n_models, first_block, X, y, spend, departed, keys,
                                      counts, departed_counts, state.r, state.buckets, state.models), []
        old = {(int(b[0]), int(b[1]), int(b[2])): (int(b[3]), state.models[i]) for i, b in enumerate(state.buckets)}
        if c == self.window_blocks:
            layout, order, r = start_layout(self.k), [self.H] + [2**j for j in range(self.k - 2, -1, -1)], 0
        elif state.r + 1 < self.H:
            layout, order = advance_layout(list(old), state.r, c)
            r = state.r + 1
        else:
            layout, order = refresh_layout(list(old), self.k, c)
            r = 0
        by_size = {b[1]: b for b in layout}
        trained = {b: old[b] for b in layout if b in old and b[1] not in order}
        events, n_models = [], state.n_models
        for size in order:
            b = by_size[size]
            first, last = (b[0] - 1) * self.w0 + 1, (b[0] + size - 1) * self.w0
            lo = first - (first_block - 1) * self.w0 - 1
            ref_id, ref_w = (-1, None) if size == self.H else trained[by_size[2 * size]]
            scale, p = self.bucket_noise(size)
            m = self.train(stream=state.stream, noise=noise, model_id=n_models, step=c,
                           role="base" if size == self.H else "update", members=[(first, last)],
                           X=X[lo:lo + size * self.w0], y=y[lo:lo + size * self.w0], n_norm=size * self.w0,
                           scale=scale, w_ref=ref_w, w_ref_id=ref_id, p=p,
                           extra={"side": {LEFT: "left", BASE: "base", RIGHT: "right"}[b[2]], "bucket_blocks": size})
            n_models += 1
            trained[b] = (m.event["model_id"], m.w)
            events.append(m.event)
            keys, counts = self.charge(spend, keys, counts, m.event, self.w0, first_block - 1)
            released = m
        chain = []
        size = 1
        while size <= self.H:
            b = by_size[size]
            chain.append((trained[b][0], (b[0] - 1) * self.w0 + 1, (b[0] + size - 1) * self.w0))
            size *= 2
        if released.event["bucket_blocks"] != 1:  # k = 1: the base is the released model
            raise AssertionError("the last trained model must be the size-1 bucket")
        worst = self.worst(spend, keys, counts, (departed, padded(departed_counts, len(keys))))
        release = self.release(state.stream, c, released, worst, chain=chain, events=events)
        buckets = np.array([[b[0], b[1], b[2], trained[b][0]] for b in layout], np.int64)
        models = np.stack([trained[b][1] for b in layout])
        return SlidingWindowState(state.stream, c, n_models, first_block, X, y, spend, departed, keys, counts,
                                  departed_counts, r, buckets, models), [release]
