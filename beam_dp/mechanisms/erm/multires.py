"""Algorithm 2 (private multi-resolution release) and Algorithm 6 (with sampling).

Spec erm-release §2 and §6. One step = one block of ``B`` elements (count steps). At t = q·B
(q ≥ 1) with v trailing zero bits of q, for each level k = 0..v (k ≤ ``max_level``) a model is
trained from scratch (Algorithm 1, w_ref = 0) on positions [t − 2^k B + 1, t] and released,
tagged ``level=k``; the q = 1 release of level k is the prefix model on [1, 2^k B].

Guarantee: ε-DP (``noise="gamma"``) or (ε, δ)-DP (``"gaussian"``), event level (one position's
value replaced), forever. Per-element spend:

* gamma: the same scale at every level, ``b = 4L/(λBε)``; a level-k call costs ``ε/2^{k+1}``,
  levels' blocks are disjoint, so spend(p, T) = Σ_{k: ⌈p/2^kB⌉2^kB ≤ T} ε/2^{k+1} < ε;
  ``epsilon_spent(T) = ε(1 − 2^{−(K_T+1)})``.
* gaussian: ``σ = Δ(B)/(μ*·√(3/4))``: a level-k call has μ_k = μ₀/2^k and Σ_k μ_k² ≤ μ*².
* sampling (Algorithm 6, gamma only): level k uses ``b_k = 4L/(λ 2^k B ε)`` on a Bernoulli(p_k)
  sample, ``p_k = (e^{ε/2^{k+1}} − 1)/(e^{ε/2} − 1)``, n_norm = 2^k B; same ledger.

State: the raw (clipped) rows still needed — the whole prefix, or the last 2^{max_level}·B rows —
and the per-B-block spend with the count of each noise key per block (``declaration``: a release
declares its worst block's noise). Storage grows linearly without ``max_level``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.erm.base import ERMMechanism, LabelledRows, sampling_probability
from beam_dp.mechanisms.erm.declaration import empty_keys, keys_from_v1

__all__ = ["MultiResolutionMechanism", "MultiResolutionState"]


@dataclass(frozen=True)
class MultiResolutionState:
    STATE_VERSION: ClassVar[int] = 2
    STATE_MIGRATIONS: ClassVar[dict] = {1: keys_from_v1}  # v1 kept no noise keys

    stream: str
    t: int                 # blocks of B received
    n_models: int
    first_row: int         # position of X[0] (1-based)
    X: np.ndarray          # (rows kept, f+1) float32, clipped, bias appended
    y: np.ndarray
    spend: np.ndarray      # (t, 2): per B-block (pure ε, μ²)
    keys: np.ndarray       # (V, 3): the noise keys (sensitivity, scale, sample_p) used so far
    counts: np.ndarray     # (t, V) int: calls of each key per B-block


def trailing_zeros(q: int) -> int:
    return (q & -q).bit_length() - 1


class MultiResolutionMechanism(ERMMechanism):
    """Algorithm 2 (``sampling=False``) / Algorithm 6 (``sampling=True``). See the module docstring."""

    name = "erm_multires"
    algorithm = "multires"
    state_type = MultiResolutionState

    def __init__(self, *, block: int, max_level: int | None = None, sampling: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block (B) must be an integer >= 1, got {block!r}")
        if max_level is not None and (not isinstance(max_level, int) or max_level < 0):
            raise ValueError(f"max_level must be an integer >= 0 or None, got {max_level!r}")
        if sampling and self.noise_law != "gamma":
            raise ValueError("the sampling variant (Algorithm 6) is pure ε only: use noise='gamma'")
        self.block = block
        self.max_level = max_level
        self.sampling = bool(sampling)
        if sampling:
            self.algorithm = self.name = "multires_sampled"

    def init_state(self, stream: str) -> MultiResolutionState:
        f1 = self.model.n_features + 1
        return MultiResolutionState(stream, 0, 0, 1, np.zeros((0, f1), np.float32),
                                    np.zeros(0, np.int64 if self.model.kind == "softmax" else np.float64),
                                    np.zeros((0, 2)), empty_keys(), np.zeros((0, 0), np.int64))

    @property
    def schedule(self) -> dict:
        return {"block": self.block, "max_level": self.max_level}

    def level_noise(self, k: int) -> tuple[float, float]:
        """(scale, sampling probability) of a level-k call."""
        if self.sampling:
            return (self.sens(2**k * self.block) / (self.epsilon / 2),
                    sampling_probability(self.epsilon / 2 ** (k + 1), self.epsilon / 2))
        return self.scale(self.block, self.epsilon / 2, self.mu_total * math.sqrt(0.75)), 1.0

    def step(self, state: MultiResolutionState, block: LabelledRows, noise: NoiseSource
             ) -> tuple[MultiResolutionState, list[Release]]:
        Xb, yb = self.prepare(block, self.block)
        t = state.t + 1
        end = t * self.block
        X, y = np.concatenate([state.X, Xb]), np.concatenate([state.y, yb])
        spend = np.concatenate([state.spend, np.zeros((1, 2))])
        keys, counts = state.keys, np.concatenate([state.counts, np.zeros((1, len(state.keys)), np.int64)])
        top = trailing_zeros(t) if self.max_level is None else min(trailing_zeros(t), self.max_level)
        releases, n_models = [], state.n_models
        for k in range(top + 1):
            n = 2**k * self.block
            start = end - n + 1
            scale, p = self.level_noise(k)
            lo = start - state.first_row
            model = self.train(stream=state.stream, noise=noise, model_id=n_models, step=t, role="level",
                               members=[(start, end)], X=X[lo:], y=y[lo:], n_norm=n, scale=scale,
                               w_ref=None, w_ref_id=-1, p=p, extra={"level": k})
            n_models += 1
            keys, counts = self.charge(spend, keys, counts, model.event, self.block)
            releases.append(self.release(state.stream, t, model, self.worst(spend, keys, counts),
                                         chain=[(model.event["model_id"], start, end)], events=[model.event]))
        first_row = state.first_row
        if self.max_level is not None:  # keep only the rows later blocks can still use
            keep = 2**self.max_level * self.block - self.block
            drop = max(0, len(X) - keep)
            X, y, first_row = X[drop:], y[drop:], first_row + drop
        return MultiResolutionState(state.stream, t, n_models, first_row, X, y, spend, keys, counts), releases
