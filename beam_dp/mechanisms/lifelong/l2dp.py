"""L2DP-ML (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning", Algorithm 2).

Guarantee — **the paper's claim** (Theorem 2), not a standard proof:
``ε = ε_1 + ε_1/γ_x + ε_1/γ + ε_2``-Lifelong DP for any number of tasks, under lifelong neighbours
(Def. 2: one tuple per task set and per memory set). ``epsilon_spent = ε`` on every release (Theorem 2
of the draws' Laplace scales, declared as the account ``"l2dp_ml"``, capped at ε against rounding). The
caveat: ``χ_1`` is one vector shared by all tuples, so ``x̄_r − x̄_r' = x_r − x_r'`` are noise-free,
and G's batch-statistics normalisation cancels the constant ``χ_2`` offset; the claim rests on the
paper's functional-mechanism reasoning. For a standard per-example accounting use
``BoundedDPAGEM`` (or ``NaiveGaussian``).

What is enforced (each removes a way to spend budget twice): one draw of each χ per stream, kept in
state (purposes ``"l2dp-chi1/2/3"``); inputs clipped to [−1, 1] then ``x̄ = x + χ_1/λ`` at ingestion
(training reads only ``x̄``); fixed disjoint batches of λ per task, remainder dropped; memory of one
perturbed batch per task; hidden layers clipped to [−1, 1]; ``|W_1[i, j]| ≤ B_θ/max(d, β)`` after
every update (so ``1/γ ≤ λB_θ/(2Δ_R)``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from beam_dp.core.accounting.lifelong import l2dp_budget, l2dp_claim, sensitivity_label, sensitivity_reconstruction
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import account, declaration_json
from beam_dp.mechanisms.lifelong.agem import project_blocks_flagged
from beam_dp.mechanisms.lifelong.config import L2DPConfig
from beam_dp.mechanisms.lifelong.learner import Learner, LifelongState
from beam_dp.mechanisms.lifelong.network import THETA_1, classifier, encode

__all__ = ["GUARANTEE_BASIS", "L2DPML", "l2dp_gradients", "taylor_loss"]

GUARANTEE_BASIS = "paper_claim (Lai et al. Thm 2)"
NEIGHBOURING = "lifelong neighbours (Lai et al. Def. 2): one tuple per task set and per memory set; paper_claim"
_LN2 = math.log(2.0)


def taylor_loss(z, y):
    """Second-order expansion at 0 of the sigmoid cross-entropy: ``ln 2 + (½ − y) z + z²/8``."""
    return _LN2 + (0.5 - y) * z + z * z / 8.0


def l2dp_gradients(p: dict[str, torch.Tensor], x_bar: torch.Tensor, y_onehot: torch.Tensor, chi2: torch.Tensor,
                   chi3: torch.Tensor, lam: int, n_layers: int, ae_mode: str,
                   label_path: str = "autodiff", encoder_norm: bool = False) -> dict[str, torch.Tensor]:
    """Gradients of the perturbed batch objectives on one batch of *perturbed* inputs ``x̄``.

    θ_1 (``enc.*``) gets ``∇R̄_B``: "paper" → ``(1/λ) Σ_r (½ − x̄_r) h̄_rᵀ`` (no bias gradient); "code" →
    autodiff of ``(1/λ) Σ_r Σ_s |ln 2 + (½ − x̄_rs) x̃_rs|``. θ_2 gets autodiff of
    ``L̄_B = (1/λ)[Σ_r Σ_k (½ z_rk + z_rk²/8) − Σ_k ⟨W_πk, M_B[:, k] + χ_3[:, k]⟩]`` with
    ``M_B = Σ_r [h_πr, 1] y_rᵀ`` (labels enter only here) and ``h̄ = clip(x̄W + b) + 2χ_2/λ`` as input.
    ``label_path="autodiff"`` (default, the form of the predecessor code) also differentiates
    ``M_B`` through ``h_π(θ_2)``: G's lower layers then get ``Σ_r J_rᵀ W y_r``, a label-dependent term that
    ``χ_3`` does not cover (one more reason the guarantee is the paper's claim). ``"constant"`` treats
    ``M_B`` as a constant, so labels act only through ``M_B + χ_3``; it learns far worse (docs/lifelong.md).
    """
    names = list(p)
    leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
    h_bar = encode(leaves, x_bar, encoder_norm) + 2.0 * chi2 / lam
    grads: dict[str, torch.Tensor] = {}
    if ae_mode == "paper":
        grads["enc.W"] = (0.5 - x_bar).T @ h_bar.detach() / lam
        grads["enc.b"] = torch.zeros_like(leaves["enc.b"])
    else:
        x_tilde = h_bar @ leaves["enc.W"].T
        r_bar = torch.abs(_LN2 + (0.5 - x_bar) * x_tilde).sum() / lam
        grads["enc.W"], grads["enc.b"] = torch.autograd.grad(r_bar, [leaves["enc.W"], leaves["enc.b"]])
    theta_2 = [k for k in names if k not in THETA_1]
    aug, z = classifier(leaves, h_bar.detach(), n_layers, batch_stats=True)
    coeff = (aug.detach() if label_path == "constant" else aug).T @ y_onehot
    l_bar = ((0.5 * z + z * z / 8.0).sum() - (leaves["head.W"] * (coeff + chi3)).sum()) / lam
    for k, g in zip(theta_2, torch.autograd.grad(l_bar, [leaves[k] for k in theta_2])):
        grads[k] = g
    return grads


class L2DPML(Learner):
    """L2DP-ML learner (see the module docstring for the guarantee and what is enforced)."""

    name = "l2dp_ml"
    batch_stats = True
    guarantee_basis = GUARANTEE_BASIS

    def __init__(self, config: L2DPConfig):
        if not isinstance(config, L2DPConfig):
            raise TypeError("L2DPML takes an L2DPConfig")
        super().__init__(config)
        cfg = config
        self.delta_r = sensitivity_reconstruction(cfg.input_dim, cfg.hidden)
        self.delta_l = sensitivity_label(cfg.g_layers[-1])
        self.budget = l2dp_budget(cfg.epsilon, cfg.rho_s, cfg.batch_size, cfg.b_theta, self.delta_r, self.delta_l)
        self.w1_bound = cfg.b_theta / max(cfg.input_dim, cfg.hidden)
        self.guarantee = Guarantee(cfg.epsilon, 0.0, NEIGHBOURING)
        self.encoder_norm = cfg.encoder_batch_norm
        self.spent = self._declared_spend()

    def _declared_spend(self) -> tuple[float, float, str]:
        """``(epsilon_spent, 0, noise declaration)`` of every release: Theorem 2 (``l2dp_claim``) of the
        one-time draws' Laplace scales, declared as the account ``"l2dp_ml"`` (the paper's claim)."""
        scales = self.noise_scales
        params = dict(delta_r=self.delta_r, delta_l=self.delta_l, scale_chi1=scales["l2dp-chi1"],
                      scale_chi2=scales["l2dp-chi2"], scale_chi3=scales["l2dp-chi3"],
                      batch_size=self.config.batch_size, b_theta=self.config.b_theta)
        epsilon, delta = l2dp_claim(**params)
        return min(epsilon, self.guarantee.epsilon), delta, declaration_json((), (account("l2dp_ml", **params),))

    @property
    def noise_scales(self) -> dict[str, float]:
        """Laplace scales of the one-time draws."""
        return {"l2dp-chi1": self.delta_r / self.budget.epsilon_1, "l2dp-chi2": self.delta_r / self.budget.epsilon_1,
                "l2dp-chi3": self.delta_l / self.budget.epsilon_2}

    def _init_bound(self) -> float:
        return self.w1_bound

    def _initialise(self, state: LifelongState, noise: NoiseSource) -> LifelongState:
        """Initial weights and the one-time draws χ_1 (d), χ_2 (β), χ_3 ((n_π+1) × K), kept for the model's life."""
        state = super()._initialise(state, noise)
        cfg, scales = self.config, self.noise_scales
        shapes = {"l2dp-chi1": (cfg.input_dim,), "l2dp-chi2": (cfg.hidden,),
                  "l2dp-chi3": (cfg.g_layers[-1] + 1, cfg.n_classes)}
        chis = {}
        for purpose, shape in shapes.items():
            draw = noise.laplace(state.stream, purpose, (0,), scales[purpose], int(np.prod(shape)))
            chis[purpose.split("-")[1]] = np.asarray(draw, dtype=np.float64).reshape(shape)
        return replace(state, noise=chis)

    def perturb(self, state: LifelongState, x: np.ndarray) -> np.ndarray:
        """``x̄ = clip(x, −1, 1) + χ_1/λ`` (float64, exact so that ``x̄ − x = χ_1/λ``)."""
        return np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0) + state.noise["chi1"] / self.config.batch_size

    def partition(self, noise: NoiseSource, stream: str, task_index: int, n_rows: int) -> np.ndarray:
        """The task's fixed disjoint batches, ``(⌊n/λ⌋, λ)`` row indices (keyed permutation; remainder dropped)."""
        lam = self.config.batch_size
        perm = noise.generator(stream, f"{self.name}/partition", task_index).permutation(n_rows)
        n_b = n_rows // lam
        return perm[: n_b * lam].reshape(n_b, lam)

    def schedule(self, noise: NoiseSource, stream: str, task_index: int, task_id: str, n_rows: int) -> np.ndarray:
        """Batch visited at each step: epochs of keyed per-epoch orders, or Balanced ``steps_per_task``
        cycling through the batches (the last pass may be partial)."""
        n_b = n_rows // self.config.batch_size
        epochs, steps = self._steps_for(task_id, n_rows, n_b)
        passes = -(-steps // n_b) if n_b else 0
        orders = [noise.generator(stream, f"{self.name}/order", task_index, e).permutation(n_b) for e in range(passes)]
        return np.concatenate(orders)[:steps] if orders else np.zeros(0, dtype=np.int64)

    def _train_task(self, state, task_id, x, y, noise):
        cfg, lam = self.config, self.config.batch_size
        stream, task_index = state.stream, state.tasks_done + 1
        x_bar = self.perturb(state, x)
        del x  # from here on only x̄ is read
        batches = self.partition(noise, stream, task_index, x_bar.shape[0])
        order = self.schedule(noise, stream, task_index, task_id, x_bar.shape[0])
        dev, dt = self.device, self.dtype
        eye = torch.eye(cfg.n_classes, dtype=dt, device=dev)
        xb = torch.as_tensor(x_bar, dtype=dt, device=dev)
        yb = eye[torch.as_tensor(y, device=dev)]
        mem_x = [torch.as_tensor(m, dtype=dt, device=dev) for m in state.memory_x]
        mem_y = [eye[torch.as_tensor(m, device=dev)] for m in state.memory_y]
        picks = (noise.generator(stream, f"{self.name}/memory-pick", task_index).integers(0, len(mem_x), len(order))
                 if mem_x else None)
        chi2 = torch.as_tensor(state.noise["chi2"], dtype=dt, device=dev)
        chi3 = torch.as_tensor(state.noise["chi3"], dtype=dt, device=dev)
        params, opt = self._torch_state(state)
        blocks = [THETA_1, tuple(k for k in params if k not in THETA_1)]
        batch_idx = torch.as_tensor(batches, device=dev)
        t = state.opt_steps
        projected = torch.zeros((), dtype=torch.int64, device=dev)  # counted on the device: no sync per step
        for s, b in enumerate(order):
            rows = batch_idx[b]
            g = l2dp_gradients(params, xb[rows], yb[rows], chi2, chi3, lam, self.n_layers, cfg.ae_mode,
                               cfg.label_path, self.encoder_norm)
            if picks is not None:
                e = int(picks[s])
                g_ref = l2dp_gradients(params, mem_x[e], mem_y[e], chi2, chi3, lam, self.n_layers, cfg.ae_mode,
                                       cfg.label_path, self.encoder_norm)
                g, moved = project_blocks_flagged(g, g_ref, blocks, cfg.agem_always_project)
                projected += moved
            t += 1
            self._update(params, g, opt, t)
            with torch.no_grad():
                params["enc.W"].clamp_(-self.w1_bound, self.w1_bound)
        memory_x, memory_y = state.memory_x, state.memory_y
        if len(batches):
            chosen = int(noise.generator(stream, "memory", task_index).integers(0, len(batches)))
            memory_x = memory_x + (x_bar[batches[chosen]].copy(),)
            memory_y = memory_y + (y[batches[chosen]].copy(),)
        epochs = self._steps_for(task_id, x_bar.shape[0], len(batches))[0]
        state = replace(state, params={k: v.detach().cpu().numpy().copy() for k, v in params.items()},
                        opt={k: v.detach().cpu().numpy().copy() for k, v in opt.items()}, opt_steps=t,
                        memory_x=memory_x, memory_y=memory_y, memory_uses=state.memory_uses + (0,) * (
                            len(memory_x) - len(state.memory_uses)))
        meta = {"epochs": epochs, "steps": int(len(order)), "batches": int(len(batches)),
                "dropped_rows": int(x_bar.shape[0] - batches.size), "memory_batches": len(memory_x),
                "projected_steps": int(projected), "epsilon_1": self.budget.epsilon_1, "epsilon_2": self.budget.epsilon_2,
                "delta_r": self.delta_r, "delta_l": self.delta_l, "b_theta": cfg.b_theta, "ae_mode": cfg.ae_mode, "label_path": cfg.label_path,
                "encoder_batch_norm": cfg.encoder_batch_norm,
                "noise": "laplace, drawn once per stream", "noise_scale_chi1": self.noise_scales["l2dp-chi1"],
                "noise_scale_chi3": self.noise_scales["l2dp-chi3"], "rho_s": cfg.rho_s, "input_dim": cfg.input_dim,
                "hidden": cfg.hidden, "last_hidden": cfg.g_layers[-1]}
        return state, meta, self.spent
