"""Algorithm 4 (private continual cumulative release), Algorithm 8 (with sampling), the paper's
"basic" continual release and the independent-block baseline. Spec erm-release §4, §6.

One step = one block of ``b0`` elements; t counts elements. Variants:

* ``"cumulative"`` (Algorithm 4; Algorithm 8 with ``sampling=True``). At each multiple t of b0
  with t ≥ B, the first rule that applies:
  1. **base** t = 2^k·B: the prefix model on [1, t] (Algorithm 2's level-k, q = 1 release;
     scale ``4L/(λ B ε_base)``, cost ε_base/2^{k+1}); f_g = f_c = it, t_g = t;
  2. **large** i = (t − t_g)/b0 = 2^j: PBERM on [t_g+1, t] regularised to f_g, n_norm = 2^j b0,
     scale ``4L/(λ b0 ε_upd)`` (cost ε_upd/2^{j+1}); f_c = it. With sampling (Algorithm 8):
     scale ``4L/(λ 2^j b0 ε_upd)`` on a Bernoulli(p_j) sample, p_j = (e^{ε_upd/2^{j+1}} − 1)/(e^{ε_upd/2} − 1);
  3. **small** otherwise: PBERM on [t − b0 + 1, t] regularised to f_c, n_norm = b0, same scale
     (cost ε_upd/2).
* ``"basic"``: rule 1, else a small update on the last b0-block regularised to the previous
  release (scale ``4L/(λ b0 ε_upd)``, each element once: ε_upd/2).
* ``"independent"`` (baseline): Algorithm 1 on each b0-block alone, scale ``2L/(λ b0 ε)``
  (each element once: ε). Releases from t = b0.

Guarantee: ε-DP (gamma) or (ε, δ)-DP (gaussian), event level, forever. The budget is split
ε_base = f·ε and ε_upd = (1 − f)·ε (``base_fraction`` f, default 1/2); every element's spend
is base + update < ε. Gaussian: μ_base = μ*√f, μ_upd = μ*√(1−f), each family's scale set so its
worst element's Σμ² stays within its share (prefix models: Σ 4^{−k} = 4/3; updates: the first
block of an epoch, also 4/3; basic and independent: each element once).

State: the whole prefix (the base models need it; the baseline keeps only the last block), the
current base and f_c models with their chains, the per-b0-block spend and count of each noise key
(``declaration``: a release declares its worst block's noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.erm.base import ERMMechanism, LabelledRows, TrainedModel, is_power_of_two, sampling_probability
from beam_dp.mechanisms.erm.declaration import empty_keys, keys_from_v1

__all__ = ["ContinualReleaseMechanism", "ContinualReleaseState"]

Variant = Literal["cumulative", "basic", "independent"]


@dataclass(frozen=True)
class ContinualReleaseState:
    STATE_VERSION: ClassVar[int] = 2
    STATE_MIGRATIONS: ClassVar[dict] = {1: keys_from_v1}  # v1 kept no noise keys

    stream: str
    t: int                 # b0-blocks received
    n_models: int
    first_row: int         # position of X[0]
    X: np.ndarray          # clipped rows (float32, bias appended)
    y: np.ndarray
    spend: np.ndarray      # (t, 2) per b0-block (pure ε, μ²)
    keys: np.ndarray       # (V, 3): the noise keys (sensitivity, scale, sample_p) used so far
    counts: np.ndarray     # (t, V) int: calls of each key per b0-block
    t_g: int               # position of the current base (0: none yet)
    w_g: np.ndarray        # base model (noisy)
    chain_g: np.ndarray    # (m, 3) [model_id, first, last]
    w_c: np.ndarray        # f_c (cumulative) / previous release (basic)
    chain_c: np.ndarray


class ContinualReleaseMechanism(ERMMechanism):
    """See the module docstring. ``update`` = b0, ``base`` = B (b0 | B)."""

    name = "erm_continual"
    state_type = ContinualReleaseState

    def __init__(self, *, update: int, base: int, variant: Variant = "cumulative", sampling: bool = False,
                 base_fraction: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(update, int) or update < 1:
            raise ValueError(f"update block b0 must be an integer >= 1, got {update!r}")
        if not isinstance(base, int) or base < 1 or base % update:
            raise ValueError(f"base block B must be a positive multiple of b0={update}, got {base!r}")
        if variant not in ("cumulative", "basic", "independent"):
            raise ValueError(f"variant must be 'cumulative', 'basic' or 'independent', got {variant!r}")
        if sampling and (variant != "cumulative" or self.noise_law != "gamma"):
            raise ValueError("sampling (Algorithm 8) exists for variant='cumulative' with noise='gamma' only")
        if not (0.0 < base_fraction < 1.0):
            raise ValueError(f"base_fraction must lie in (0, 1), got {base_fraction!r}")
        self.b0, self.B = update, base
        self.variant: Variant = variant
        self.sampling = bool(sampling)
        self.base_fraction = float(base_fraction)
        self.algorithm = {"cumulative": "continual_sampled" if sampling else "continual",
                          "basic": "continual_basic", "independent": "independent_blocks"}[variant]
        f = self.base_fraction
        self.eps_base, self.eps_upd = f * self.epsilon, (1 - f) * self.epsilon
        self.mu_base, self.mu_upd = self.mu_total * math.sqrt(f), self.mu_total * math.sqrt(1 - f)

    # -- scales ----------------------------------------------------------------------------------
    @property
    def schedule(self) -> dict:
        return {"update": self.b0, "base": self.B, "base_fraction": self.base_fraction}

    def base_scale(self) -> float:
        return self.scale(self.B, self.eps_base / 2, self.mu_base * math.sqrt(0.75))

    def update_scale(self) -> float:
        if self.variant == "independent":
            return self.scale(self.b0, self.epsilon, self.mu_total)
        if self.variant == "basic":
            return self.scale(self.b0, self.eps_upd / 2, self.mu_upd)
        return self.scale(self.b0, self.eps_upd / 2, self.mu_upd * math.sqrt(0.75))

    def large_noise(self, j: int) -> tuple[float, float]:
        if self.sampling:
            return (self.sens(2**j * self.b0) / (self.eps_upd / 2),
                    sampling_probability(self.eps_upd / 2 ** (j + 1), self.eps_upd / 2))
        return self.update_scale(), 1.0

    # -- the interface ---------------------------------------------------------------------------
    def init_state(self, stream: str) -> ContinualReleaseState:
        f1, d = self.model.n_features + 1, self.model.dim
        empty = np.zeros((0, 3), np.int64)
        return ContinualReleaseState(stream, 0, 0, 1, np.zeros((0, f1), np.float32),
                                     np.zeros(0, np.int64 if self.model.kind == "softmax" else np.float64),
                                     np.zeros((0, 2)), empty_keys(), np.zeros((0, 0), np.int64), 0, np.zeros(d), empty,
                                     np.zeros(d), empty)

    def step(self, state: ContinualReleaseState, block: LabelledRows, noise: NoiseSource
             ) -> tuple[ContinualReleaseState, list[Release]]:
        Xb, yb = self.prepare(block, self.b0)
        t = state.t + 1
        end = t * self.b0
        X, y = np.concatenate([state.X, Xb]), np.concatenate([state.y, yb])
        first_row = state.first_row
        if self.variant == "independent":
            X, y, first_row = Xb, yb, end - self.b0 + 1
        spend = np.concatenate([state.spend, np.zeros((1, 2))])
        keys, counts = state.keys, np.concatenate([state.counts, np.zeros((1, len(state.keys)), np.int64)])
        s = dict(t_g=state.t_g, w_g=state.w_g, chain_g=state.chain_g, w_c=state.w_c, chain_c=state.chain_c)
        common = dict(stream=state.stream, noise=noise, model_id=state.n_models, step=t)

        def rows(first: int) -> tuple[np.ndarray, np.ndarray]:
            return X[first - first_row:], y[first - first_row:]

        def chained(m: TrainedModel, ref_chain: np.ndarray) -> np.ndarray:
            (a, b), = m.event["members"]
            return np.vstack([[[m.event["model_id"], a, b]], ref_chain]).astype(np.int64)

        small = (end - self.b0 + 1, end)
        if self.variant == "independent":
            m = self.train(**common, role="block", members=[small], X=Xb, y=yb, n_norm=self.b0,
                           scale=self.update_scale(), w_ref=None, w_ref_id=-1)
            chain = chained(m, np.zeros((0, 3), np.int64))
        elif end < self.B:
            return ContinualReleaseState(state.stream, t, state.n_models, first_row, X, y, spend, keys, counts, **s), []
        elif end % self.B == 0 and is_power_of_two(end // self.B):
            k = (end // self.B).bit_length() - 1
            m = self.train(**common, role="base", members=[(1, end)], X=X, y=y, n_norm=end,
                           scale=self.base_scale(), w_ref=None, w_ref_id=-1, extra={"level": k})
            chain = chained(m, np.zeros((0, 3), np.int64))
            s.update(t_g=end, w_g=m.w, chain_g=chain, w_c=m.w, chain_c=chain)
        elif self.variant == "cumulative" and is_power_of_two((end - s["t_g"]) // self.b0):
            i = (end - s["t_g"]) // self.b0
            j = i.bit_length() - 1
            scale, p = self.large_noise(j)
            m = self.train(**common, role="large", members=[(s["t_g"] + 1, end)], X=rows(s["t_g"] + 1)[0],
                           y=rows(s["t_g"] + 1)[1], n_norm=i * self.b0, scale=scale, w_ref=s["w_g"],
                           w_ref_id=int(s["chain_g"][0, 0]), p=p, extra={"j": j})
            chain = chained(m, s["chain_g"])
            s.update(w_c=m.w, chain_c=chain)
        else:
            m = self.train(**common, role="small", members=[small], X=Xb, y=yb, n_norm=self.b0,
                           scale=self.update_scale(), w_ref=s["w_c"], w_ref_id=int(s["chain_c"][0, 0]))
            chain = chained(m, s["chain_c"])
            if self.variant == "basic":
                s.update(w_c=m.w, chain_c=chain)
        keys, counts = self.charge(spend, keys, counts, m.event, self.b0)
        release = self.release(state.stream, t, m, self.worst(spend, keys, counts), chain=chain.tolist(),
                               events=[m.event])
        return (ContinualReleaseState(state.stream, t, state.n_models + 1, first_row, X, y, spend, keys, counts, **s),
                [release])
