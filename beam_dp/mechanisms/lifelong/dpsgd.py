"""DP-SGD + A-GEM learners with standard accounting (dp-accounting RDP), and non-private A-GEM.

The network is the same as L2DP-ML's without χ noise and without batch statistics (they would couple
the examples of a batch); loss: softmax cross-entropy, trained end to end; A-GEM projects the noisy
task gradient ``g`` on the noisy memory gradient ``g_ref`` (one block: post-processing). Per-example
gradients (``torch.func.vmap``) are clipped to L2 norm ``C``; Gaussian noise ``N(0, z²C² I)`` is
added to their sum, which is divided by the expected batch size λ. Current-task batches are
Poisson-sampled with rate ``q = λ/|D_τ|`` for ``epochs × round(|D_τ|/λ)`` steps (or the Balanced
``steps_per_task``). Neighbouring: add/remove one training example; task sizes are public (the usual
DP-SGD convention for ``q``); every sampling choice and noise draw is keyed.

* ``NaiveGaussian`` (the paper's baseline): ``num_tasks`` m declared; per task
  ε/(2m) at δ/(2m) for the task stream and the same for the memory stream (Poisson over all memory
  rows, rate λ/|𝕄|); ``epsilon_spent`` after τ tasks is the sum of the accountant's values (basic
  composition), reaching ≤ ε after m tasks; task m+1 is refused.
* ``BoundedDPAGEM`` (sound for any number of tasks): one batch of λ rows per task is kept in memory and
  each stored batch is used for at most ``memory_uses`` K reference gradients (then retired). Each
  example therefore meets at most its own task's ``T_τ`` Poisson steps plus K unsampled Gaussian uses;
  ``z_M`` spends ``memory_share·ε`` on the K uses and each task's ``z_τ`` is calibrated so that the
  composition of both is ε at δ. Tasks are disjoint, so the worst example's loss is the max over tasks:
  ``epsilon_spent ≤ ε`` however many tasks arrive (it counts the K memory uses before they happen).
* ``NonPrivateAGEM``: no clipping, no noise. NOT private; a reference line for benchmarks.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import dp_accounting
import numpy as np
import torch

from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.lifelong.accounting import calibrate_noise_multiplier, dpsgd_event, epsilon_of
from beam_dp.mechanisms.lifelong.agem import project_blocks
from beam_dp.mechanisms.lifelong.config import AGEMConfig, BoundedAGEMConfig, NaiveGaussianConfig
from beam_dp.mechanisms.lifelong.learner import Learner, LifelongState
from beam_dp.mechanisms.lifelong.network import classifier, encode

__all__ = ["BoundedDPAGEM", "BudgetExhausted", "NaiveGaussian", "NonPrivateAGEM"]

ADD_REMOVE = "add/remove one training example (task sizes public)"


class BudgetExhausted(ValueError):
    """More tasks than the declared budget covers (``reason="budget_exhausted"``)."""

    reason = "budget_exhausted"


def _loss_one(p: dict, x: torch.Tensor, y: torch.Tensor, n_layers: int) -> torch.Tensor:
    _, z = classifier(p, encode(p, x.unsqueeze(0)), n_layers, batch_stats=False)
    return torch.nn.functional.cross_entropy(z, y.unsqueeze(0), reduction="sum")


class _SGDLearner(Learner):
    """Shared training loop; subclasses choose the noise (``_plan``) and the memory batches."""

    clip_norm: float | None = None

    def _plan(self, state: LifelongState, q: float, steps: int, memory_rows: int) -> tuple:
        """``(z_task, z_memory, (epsilon_spent, delta_spent), meta)`` for the next task."""
        return None, None, (0.0, 0.0), {}

    def _memory_batch(self, rng: np.random.Generator, sizes: list[int], uses: list[int]) -> np.ndarray | None:
        """Row indices (into the concatenated memory) of one reference batch; updates ``uses``."""
        active = [i for i, u in enumerate(uses) if self._cap is None or u < self._cap]
        if not active:
            return None
        pick = active[int(rng.integers(0, len(active)))]
        uses[pick] += 1
        start = int(np.sum(sizes[:pick]))
        return np.arange(start, start + sizes[pick])

    _cap: int | None = None

    def per_example_gradients(self, params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Flattened per-example gradients ``(n, P)`` in the order of ``params``."""
        fn = torch.func.vmap(torch.func.grad(functools.partial(_loss_one, n_layers=self.n_layers)),
                             in_dims=(None, 0, 0))
        per = fn(params, xb, yb)
        return torch.cat([per[k].reshape(xb.shape[0], -1) for k in params], dim=1)

    def clipped_per_example_gradients(self, params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Per-example gradients scaled to L2 norm at most ``clip_norm``."""
        flat = self.per_example_gradients(params, xb, yb)
        norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True)
        return flat * torch.clamp(self.clip_norm / norms, max=1.0)

    def _gradient(self, params: dict, xb: torch.Tensor, yb: torch.Tensor, z: float | None, noise: NoiseSource,
                  stream: str, purpose: str, index: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """``(Σ clip(g_i) + N(0, z²C²I)) / λ``; without privacy the plain mean-over-λ gradient."""
        lam = self.config.batch_size
        size = sum(v.numel() for v in params.values())
        if self.clip_norm is None:
            if xb.shape[0] == 0:
                flat = torch.zeros(size, dtype=self.dtype, device=self.device)
            else:
                leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
                _, zs = classifier(leaves, encode(leaves, xb), self.n_layers, batch_stats=False)
                loss = torch.nn.functional.cross_entropy(zs, yb, reduction="sum") / lam
                return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        else:
            flat = (self.clipped_per_example_gradients(params, xb, yb).sum(dim=0) if xb.shape[0]
                    else torch.zeros(size, dtype=self.dtype, device=self.device))
            draw = noise.gaussian(stream, f"{self.name}/{purpose}", index, z * self.clip_norm, size)
            flat = (flat + torch.as_tensor(draw, dtype=self.dtype, device=self.device)) / lam
        out, offset = {}, 0
        for k, v in params.items():
            out[k] = flat[offset: offset + v.numel()].reshape(v.shape)
            offset += v.numel()
        return out

    def _train_task(self, state, task_id, x, y, noise):
        cfg, lam = self.config, self.config.batch_size
        stream, task_index, n = state.stream, state.tasks_done + 1, x.shape[0]
        epochs, steps = self._steps_for(task_id, n, max(1, round(n / lam)) if n else 0)
        q = min(1.0, lam / n) if n else 0.0
        sizes = [len(m) for m in state.memory_y]
        z, z_mem, spent, meta = self._plan(state, q, steps, int(sum(sizes)))
        dev, dt = self.device, self.dtype
        xt = torch.as_tensor(x, dtype=dt, device=dev)
        yt = torch.as_tensor(y, device=dev)
        mem_x = torch.as_tensor(np.concatenate(state.memory_x) if sizes else np.zeros((0, cfg.input_dim)), dtype=dt,
                                device=dev)
        mem_y = torch.as_tensor(np.concatenate(state.memory_y) if sizes else np.zeros(0, np.int64), device=dev)
        sample_rng = noise.generator(stream, f"{self.name}/sample", task_index)
        memory_rng = noise.generator(stream, f"{self.name}/memory-sample", task_index)
        params, opt = self._torch_state(state)
        names = (tuple(params),)
        uses, t, ref_steps = list(state.memory_uses), state.opt_steps, 0
        for s in range(steps):
            rows = torch.as_tensor(np.flatnonzero(sample_rng.random(n) < q), device=dev)
            g = self._gradient(params, xt[rows], yt[rows], z, noise, stream, "noise-task", (task_index, s))
            mem_rows = self._memory_batch(memory_rng, sizes, uses) if sizes else None
            if mem_rows is not None:
                mr = torch.as_tensor(mem_rows, device=dev)
                g_ref = self._gradient(params, mem_x[mr], mem_y[mr], z_mem, noise, stream, "noise-memory",
                                       (task_index, s))
                g = project_blocks(g, g_ref, list(names), cfg.agem_always_project)
                ref_steps += 1
            t += 1
            self._update(params, g, opt, t)
        memory_x, memory_y = state.memory_x, state.memory_y
        if n:
            keep = np.sort(noise.generator(stream, f"{self.name}/memory", task_index).permutation(n)[: min(n, lam)])
            memory_x, memory_y, uses = memory_x + (x[keep].copy(),), memory_y + (y[keep].copy(),), uses + [0]
        state = replace(state, params={k: v.detach().cpu().numpy().copy() for k, v in params.items()},
                        opt={k: v.detach().cpu().numpy().copy() for k, v in opt.items()}, opt_steps=t,
                        memory_x=memory_x, memory_y=memory_y, memory_uses=tuple(uses))
        meta = {**meta, "epochs": epochs, "steps": steps, "sampling_rate": q, "memory_batches": len(memory_x),
                "reference_steps": ref_steps, "clip_norm": self.clip_norm}
        return state, meta, spent


class NaiveGaussian(_SGDLearner):
    """The paper's NaiveGaussian baseline; (ε, δ)-DP over ``num_tasks`` tasks (see the module docstring)."""

    name = "naive_gaussian"

    def __init__(self, config: NaiveGaussianConfig):
        if not isinstance(config, NaiveGaussianConfig):
            raise TypeError("NaiveGaussian takes a NaiveGaussianConfig")
        super().__init__(config)
        self.clip_norm = config.clip_norm
        self.guarantee = Guarantee(config.epsilon, config.delta, f"{ADD_REMOVE}; over {config.num_tasks} tasks")
        self.stream_epsilon = config.epsilon / (2 * config.num_tasks)
        self.stream_delta = config.delta / (2 * config.num_tasks)

    def noise_multiplier(self, q: float, steps: int) -> float:
        """z such that ``steps`` Poisson(q) Gaussian steps spend ε/(2m) at δ/(2m) (or the fixed z)."""
        if self.config.noise_multiplier is not None:
            return float(self.config.noise_multiplier)
        return calibrate_noise_multiplier(lambda z: dpsgd_event(q, z, steps), self.stream_epsilon, self.stream_delta)

    def _memory_batch(self, rng, sizes, uses):
        total = int(sum(sizes))
        return np.flatnonzero(rng.random(total) < min(1.0, self.config.batch_size / total))

    def _plan(self, state, q, steps, memory_rows):
        cfg = self.config
        if state.tasks_done >= cfg.num_tasks:
            raise BudgetExhausted(f"budget_exhausted: the budget covers {cfg.num_tasks} tasks")
        eps, delta, meta = state.epsilon_spent, state.delta_spent, {}
        z = z_mem = None
        if steps:
            z = self.noise_multiplier(q, steps)
            eps += epsilon_of(dpsgd_event(q, z, steps), self.stream_delta)
            delta += self.stream_delta
            if memory_rows:
                q_mem = min(1.0, cfg.batch_size / memory_rows)
                z_mem = self.noise_multiplier(q_mem, steps)
                eps += epsilon_of(dpsgd_event(q_mem, z_mem, steps), self.stream_delta)
                delta += self.stream_delta
                meta["memory_sampling_rate"] = q_mem
        if eps > cfg.epsilon * (1 + 1e-9):
            raise BudgetExhausted(f"budget_exhausted: epsilon {eps:.4g} would exceed {cfg.epsilon:g}")
        meta.update(noise_multiplier=z, noise_multiplier_memory=z_mem, accountant="dp-accounting RDP")
        return z, z_mem, (min(eps, cfg.epsilon), min(delta, cfg.delta)), meta


class BoundedDPAGEM(_SGDLearner):
    """DP-SGD + A-GEM with bounded participation: (ε, δ)-DP for any number of tasks (module docstring)."""

    name = "dpsgd_agem_bounded"

    def __init__(self, config: BoundedAGEMConfig):
        if not isinstance(config, BoundedAGEMConfig):
            raise TypeError("BoundedDPAGEM takes a BoundedAGEMConfig")
        super().__init__(config)
        self.clip_norm = config.clip_norm
        self._cap = config.memory_uses
        self.guarantee = Guarantee(config.epsilon, config.delta, f"{ADD_REMOVE}; any number of tasks")
        self.memory_noise_multiplier = calibrate_noise_multiplier(
            lambda z: dpsgd_event(1.0, z, config.memory_uses), config.memory_share * config.epsilon, config.delta)

    def example_event(self, q: float, z: float, steps: int) -> dp_accounting.DpEvent:
        """Everything one example of a task can take part in: its task's steps and K memory uses."""
        return dp_accounting.ComposedDpEvent([dpsgd_event(q, z, steps),
                                              dpsgd_event(1.0, self.memory_noise_multiplier, self._cap)])

    def _plan(self, state, q, steps, memory_rows):
        cfg = self.config
        z, eps = None, state.epsilon_spent
        if steps:
            z = calibrate_noise_multiplier(lambda v: self.example_event(q, v, steps), cfg.epsilon, cfg.delta)
            eps = max(eps, epsilon_of(self.example_event(q, z, steps), cfg.delta))
        meta = {"noise_multiplier": z, "noise_multiplier_memory": self.memory_noise_multiplier,
                "memory_uses_cap": self._cap, "accountant": "dp-accounting RDP"}
        return z, self.memory_noise_multiplier, (eps, cfg.delta), meta


class NonPrivateAGEM(_SGDLearner):
    """A-GEM without clipping or noise. NOT private (``guarantee is None``); benchmarks only."""

    name = "agem_nonprivate"
    guarantee = None
    guarantee_basis = "none (not private)"

    def __init__(self, config: AGEMConfig):
        if not isinstance(config, AGEMConfig):
            raise TypeError("NonPrivateAGEM takes an AGEMConfig")
        super().__init__(config)
