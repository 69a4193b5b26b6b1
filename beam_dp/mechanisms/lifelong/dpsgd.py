"""DP-SGD + A-GEM learners with standard accounting (dp-accounting PLD, or RDP), and non-private A-GEM.

The network is the same as L2DP-ML's without χ noise and without batch statistics (they would couple
the examples of a batch); loss: softmax cross-entropy, trained end to end; A-GEM projects the noisy
task gradient ``g`` on the noisy memory gradient ``g_ref`` (one block: post-processing). Per-example
gradients (``torch.func.vmap``, in micro-batches of ``micro_batch`` rows) are clipped to L2 norm ``C``;
Gaussian noise ``N(0, z²C² I)`` is added to their sum, which is divided by the expected batch size λ.
Current-task batches are Poisson-sampled with rate ``q = λ/N_τ`` for ``epochs(N_τ) × max(1,
round(N_τ/λ))`` steps (or the Balanced ``steps_per_task``), N_τ the *declared* public task size
(``task_size``). Neighbouring: add/remove one training example; the true task size is private (no
released number depends on it); every sampling choice and noise draw is keyed.

A step does no host work: for a chunk of steps the host draws, in one call each, the Poisson masks
(``(S, n)`` uniforms of the task's keyed sampler: the numbers of S draws of ``n``), the memory picks and
the keyed Gaussian cells ``(stream, purpose, (τ, s))`` of the steps (``draw_cells``: the cells a
step-by-step draw gives), and moves them to the device once; noise multipliers come from memoised
accountant calls (once per task shape). In the step, task and memory rows go through one vmap(grad),
both clipped sums are small matrix products and the A-GEM projection is branch-free.

* ``NaiveGaussian`` (the paper's baseline): ``num_tasks`` m declared; per task
  ε/(2m) at δ/(2m) for the task stream and the same for the memory stream (Poisson over all memory
  rows at the public rate 1/B, B stored batches of nominal size λ); ``epsilon_spent`` after τ tasks is the sum of the accountant's values (basic
  composition), reaching ≤ ε after m tasks; task m+1 is refused.
* ``BoundedDPAGEM`` (sound for any number of tasks): one batch of λ rows per task is kept in memory and
  each stored batch is used for at most ``memory_uses`` K reference gradients (then retired). Each
  example therefore meets at most its own task's ``T_τ`` Poisson steps plus K unsampled Gaussian uses;
  ``z_M`` spends ``memory_share·ε`` on the K uses and each task's ``z_τ`` is calibrated so that the
  composition of both is ε at δ. Tasks are disjoint, so the worst example's loss is the max over tasks:
  ``epsilon_spent ≤ ε`` however many tasks arrive (it counts the K memory uses before they happen).
* ``NonPrivateAGEM``: no clipping, no noise. NOT private; a reference line for benchmarks.

The config's ``accountant`` (``"pld"``, default, or ``"rdp"``) calibrates every noise multiplier and
accounts every spend. A private learner's release declares its spend (``Release.noise``) as accounts of
public parameters (``"dpsgd_pld"``: :func:`beam_dp.core.accounting.lifelong.dpsgd_pld_spend` with its PLD
discretisation; ``"dpsgd"``: ``dpsgd_spend``, RDP; the function that computed it): NaiveGaussian every task and memory
stream so far, the bounded learner the one task whose account spends most.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import dp_accounting
import numpy as np
import torch

from beam_dp.core.accounting.lifelong import (
    accountant_label,
    dpsgd_account,
    dpsgd_noise_multiplier,
    example_event,
)
from beam_dp.core.clipping import clip_factors_torch
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import ACCOUNT_KINDS, account, declaration_json
from beam_dp.mechanisms.lifelong.agem import project
from beam_dp.mechanisms.lifelong.config import AGEMConfig, BoundedAGEMConfig, NaiveGaussianConfig
from beam_dp.mechanisms.lifelong.learner import Learner, LifelongState
from beam_dp.mechanisms.lifelong.network import classifier, encode, flatten, layout_of, unflatten

__all__ = ["BoundedDPAGEM", "BudgetExhausted", "NaiveGaussian", "NonPrivateAGEM"]

ADD_REMOVE = "add/remove one training example (task sizes private; declared public sizes set q and the steps)"
#: most host-drawn numbers (mask cells + noise cells) held for one chunk of steps (~64 MiB of float64)
CHUNK_CELLS = 1 << 23


class BudgetExhausted(ValueError):
    """More tasks than the declared budget covers (``reason="budget_exhausted"``)."""

    reason = "budget_exhausted"


def _loss_one(p: dict, x: torch.Tensor, y: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Cross-entropy of one example."""
    _, z = classifier(p, encode(p, x.unsqueeze(0)), n_layers, batch_stats=False)
    return torch.nn.functional.cross_entropy(z, y.unsqueeze(0), reduction="sum")


@dataclass(frozen=True)
class _Chunk:
    """Host draws of a chunk of steps moved to the device once: the Poisson rows of every
    step (``rows[offsets[i]:offsets[i+1]]``), the memory rows of every step (``mem_rows``/``mem_offsets``;
    empty where no memory batch is used) and the noise of the steps (rows of ``noise``/``mem_noise``)."""

    rows: torch.Tensor
    offsets: np.ndarray
    mem_rows: torch.Tensor
    mem_offsets: np.ndarray
    noise: torch.Tensor | None
    mem_noise: torch.Tensor | None
    mem_used: np.ndarray


def _ragged(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of each line of a boolean ``(S, n)`` mask, concatenated, and the ``S + 1`` offsets."""
    rows = np.nonzero(mask)[1]
    return rows, np.concatenate([[0], np.cumsum(mask.sum(axis=1))])


class _SGDLearner(Learner):
    """Shared training loop; subclasses choose the noise (``_plan``) and the memory batches."""

    clip_norm: float | None = None
    _cap: int | None = None

    def __init__(self, config):
        super().__init__(config)
        shapes = {"enc.W": (config.input_dim, config.hidden), "enc.b": (config.hidden,)}
        width = config.hidden
        for i, out in enumerate(config.g_layers):
            shapes[f"g{i}.W"], shapes[f"g{i}.b"], width = (width, out), (out,), out
        shapes["head.W"] = (width + 1, config.n_classes)
        self.layout = layout_of({k: np.empty(v) for k, v in shapes.items()})
        self.size = self.layout[-1][3]
        self._per_example = torch.func.vmap(
            torch.func.grad(functools.partial(_loss_one, n_layers=self.n_layers)),
            in_dims=(None, 0, 0))

    def _plan(self, state: LifelongState, q: float, steps: int, memory_batches: int) -> tuple:
        """``(z_task, z_memory, (epsilon_spent, delta_spent, noise declaration), meta)`` for the next task."""
        return None, None, (0.0, 0.0, ""), {}

    def _public_size(self, task_id: str, n_rows: int) -> int:
        return self.config.public_size(task_id)

    def _shape(self, task_id: str, n_rows: int) -> tuple[int, int, int, float]:
        """``(size, epochs, steps, q)`` of a task: its public size (``_public_size``), the epochs and steps
        it sets and the Poisson rate ``q = λ/size``."""
        lam = self.config.batch_size
        size = self._public_size(task_id, n_rows)
        epochs, steps = self._steps_for(task_id, size, max(1, round(size / lam)) if size else 0)
        return size, epochs, steps, (min(1.0, lam / size) if size else 0.0)

    def _past_shapes(self, state: LifelongState) -> list[tuple[int, float]]:
        """``(steps, q)`` of every task trained so far (public: declared sizes and the task order)."""
        return [self._shape(task, 0)[2:] for task in state.seen_tasks]

    def _memory_masks(self, rng: np.random.Generator, sizes: list[int], uses: list[int],
                      steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, Σ sizes)`` memory rows of each step's reference batch and whether the step has one:
        one whole stored batch among those used fewer than ``memory_uses`` times (picked by the keyed
        ``rng``; updates ``uses``). Which steps have a batch depends on public counts only."""
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        mask = np.zeros((steps, int(starts[-1])), dtype=bool)
        picked = np.zeros(steps, dtype=bool)
        for s in range(steps):
            active = [i for i, u in enumerate(uses) if self._cap is None or u < self._cap]
            if not active:
                break
            pick = active[int(rng.integers(0, len(active)))]
            uses[pick] += 1
            mask[s, starts[pick]: starts[pick + 1]] = True
            picked[s] = True
        return mask, picked

    def _flat(self, arrays: dict, prefix: str = "") -> torch.Tensor:
        """Named arrays in the layout's order as one flat tensor on the device (one copy, once per task)."""
        flat = np.concatenate([np.asarray(arrays[prefix + name]).reshape(-1) for name, *_ in self.layout])
        return torch.as_tensor(flat, dtype=self.dtype).to(self.device)

    # -- per-example gradients ------------------------------------------------------------------
    def _pieces(self, w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
        """Per-example gradients ``(n, size_k)`` of each named parameter, in layout order (``w`` flat)."""
        per = self._per_example(unflatten(w, self.layout), xb, yb)
        return [per[name].reshape(xb.shape[0], -1) for name, *_ in self.layout]

    def per_example_gradients(self, params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Flattened per-example gradients ``(n, P)`` in the order of ``params``."""
        return torch.cat(self._pieces(flatten(params), xb, yb), dim=1)

    def clipped_per_example_gradients(self, params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Per-example gradients scaled to L2 norm at most ``clip_norm``."""
        pieces = self._pieces(flatten(params), xb, yb)
        return torch.cat(pieces, dim=1) * self._clip_factors(pieces)[:, None]

    def _clip_factors(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """``min(1, C/‖g_i‖)`` per example (1 without clipping); ‖g_i‖ over all pieces."""
        n, ref = pieces[0].shape[0], pieces[0]
        if self.clip_norm is None:
            return torch.ones(n, dtype=ref.dtype, device=ref.device)
        return clip_factors_torch(pieces, self.clip_norm)  # no overflow to a zero factor

    def _clipped_sums(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, split: int) -> torch.Tensor:
        """``(2, P)``: the clipped per-example gradients of rows ``[:split]`` summed, and of ``[split:]``.

        One vmap(grad) over both groups, in micro-batches; the two sums are ``(2, b) @ (b, size_k)``
        products (the ``(b, P)`` matrix is never assembled)."""
        out = torch.zeros((2, self.size), dtype=w.dtype, device=w.device)
        micro, m = self.config.micro_batch, x.shape[0]
        for lo in range(0, m, micro):
            hi = min(m, lo + micro)
            pieces = self._pieces(w, x[lo:hi], y[lo:hi])
            f = self._clip_factors(pieces)
            first = max(0, min(hi, split) - lo)
            weights = torch.zeros((2, hi - lo), dtype=w.dtype, device=w.device)
            weights[0, :first] = f[:first]
            weights[1, first:] = f[first:]
            out += torch.cat([weights @ piece for piece in pieces], dim=1)
        return out

    def _gradient(self, params: dict, xb: torch.Tensor, yb: torch.Tensor, z: float | None, noise: NoiseSource,
                  stream: str, purpose: str, index: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """``(Σ clip(g_i) + N(0, z²C²I)) / λ`` of one batch with its keyed noise cell, as named tensors
        (the step loop computes the same thing for a whole chunk; this entry serves checks)."""
        flat = self._clipped_sums(flatten(params), xb, yb, xb.shape[0])[0]
        if self.clip_norm is not None:
            draw = noise.gaussian(stream, f"{self.name}/{purpose}", index, z * self.clip_norm, self.size)
            flat = flat + torch.as_tensor(draw, dtype=self.dtype, device=self.device)
        return unflatten(flat / self.config.batch_size, self.layout)

    # -- the training loop ------------------------------------------------------------------------
    def _noise_cells(self, noise: NoiseSource, stream: str, purpose: str, task_index: int, steps: np.ndarray,
                     z: float | None) -> torch.Tensor | None:
        """The keyed Gaussian cells ``(stream, purpose, (τ, s))`` of ``steps``, drawn in one call, on the device."""
        if self.clip_norm is None or not steps.size:
            return None
        index = np.column_stack([np.full(steps.size, task_index, dtype=np.int64), steps])
        draws = noise.draw_cells("gaussian", [stream] * steps.size, f"{self.name}/{purpose}", index,
                                 z * self.clip_norm, self.size)
        return torch.as_tensor(draws, dtype=self.dtype).to(self.device)

    def _chunks(self, noise, stream, task_index, n, q, steps, sizes, uses, z, z_mem):
        """Yield the :class:`_Chunk` s of a task's steps (host draws in one call per chunk)."""
        sample_rng = noise.generator(stream, f"{self.name}/sample", task_index)
        memory_rng = noise.generator(stream, f"{self.name}/memory-sample", task_index)
        per_step = n + int(sum(sizes)) + 2 * self.size
        chunk = max(1, CHUNK_CELLS // max(per_step, 1))
        for start in range(0, steps, chunk):
            count = min(chunk, steps - start)
            rows, offsets = _ragged(sample_rng.random((count, n)) < q)
            mem_mask, picked = (self._memory_masks(memory_rng, sizes, uses, count) if sizes
                                else (np.zeros((count, 0), bool), np.zeros(count, bool)))
            mem_rows, mem_offsets = _ragged(mem_mask)
            used = np.flatnonzero(picked)
            step_ids = np.arange(start, start + count, dtype=np.int64)
            mem_noise = self._noise_cells(noise, stream, "noise-memory", task_index, step_ids[used], z_mem)
            mem_used = np.full(count, -1, dtype=np.int64)
            mem_used[used] = np.arange(used.size)
            yield _Chunk(torch.as_tensor(rows).to(self.device), offsets,
                         torch.as_tensor(mem_rows).to(self.device), mem_offsets,
                         self._noise_cells(noise, stream, "noise-task", task_index, step_ids, z), mem_noise, mem_used)

    def _train_task(self, state, task_id, x, y, noise):
        cfg, lam = self.config, self.config.batch_size
        stream, task_index, n = state.stream, state.tasks_done + 1, x.shape[0]
        size, epochs, steps, q = self._shape(task_id, n)
        sizes = [len(m) for m in state.memory_y]
        z, z_mem, spent, meta = self._plan(state, q, steps, len(sizes))
        dev, dt = self.device, self.dtype
        xt = torch.as_tensor(x, dtype=dt).to(dev)
        yt = torch.as_tensor(y).to(dev)
        mem_x = torch.as_tensor(np.concatenate(state.memory_x) if sizes else np.zeros((0, cfg.input_dim)),
                                dtype=dt).to(dev)
        mem_y = torch.as_tensor(np.concatenate(state.memory_y) if sizes else np.zeros(0, np.int64)).to(dev)
        w, m, v = self._flat(state.params), self._flat(state.opt, "m/"), self._flat(state.opt, "v/")
        uses, t, ref_steps = list(state.memory_uses), state.opt_steps, 0
        for chunk in self._chunks(noise, stream, task_index, n, q, steps, sizes, uses, z, z_mem):
            for i in range(len(chunk.offsets) - 1):
                rows = chunk.rows[chunk.offsets[i]: chunk.offsets[i + 1]]
                mem = chunk.mem_rows[chunk.mem_offsets[i]: chunk.mem_offsets[i + 1]]
                k = rows.shape[0]
                sums = self._clipped_sums(w, torch.cat([xt[rows], mem_x[mem]]), torch.cat([yt[rows], mem_y[mem]]), k)
                g = sums[0] if chunk.noise is None else sums[0] + chunk.noise[i]
                j = int(chunk.mem_used[i])
                if j >= 0:
                    g_ref = sums[1] if chunk.mem_noise is None else sums[1] + chunk.mem_noise[j]
                    g = project(g, g_ref, cfg.agem_always_project)
                    ref_steps += 1
                t += 1
                self._optimise(w, g / lam, m, v, t)
        memory_x, memory_y = state.memory_x, state.memory_y
        keep = np.sort(noise.generator(stream, f"{self.name}/memory", task_index).permutation(n)[: min(n, lam)])
        memory_x, memory_y, uses = memory_x + (x[keep].copy(),), memory_y + (y[keep].copy(),), uses + [0]
        named = {"": w, "m/": m, "v/": v}
        arrays = {pre: {k: a.detach().cpu().numpy().copy() for k, a in unflatten(vec, self.layout).items()}
                  for pre, vec in named.items()}
        state = replace(state, params=arrays[""],
                        opt={f"{pre}{k}": a for pre in ("m/", "v/") for k, a in arrays[pre].items()}, opt_steps=t,
                        memory_x=memory_x, memory_y=memory_y, memory_uses=tuple(uses))
        meta = {**meta, "epochs": epochs, "steps": steps, "task_size": size, "sampling_rate": q,
                "memory_batches": len(memory_x), "reference_steps": ref_steps, "clip_norm": self.clip_norm,
                "micro_batch": cfg.micro_batch}
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
        return dpsgd_noise_multiplier(q, steps, self.stream_epsilon, self.stream_delta,
                                      accountant=self.config.accountant)

    def _task_accounts(self, memory_batches: int, q: float, steps: int) -> list[tuple[str, dict]]:
        """The ``(kind, parameters)`` accounts of one task: its task stream and, with ``memory_batches``
        stored batches, its memory stream (Poisson at ``1/B``), each at ε/(2m), δ/(2m); none for a task
        without steps."""
        if not steps:
            return []
        rates = [q] + ([1.0 / memory_batches] if memory_batches else [])
        return [dpsgd_account(self.config.accountant, r, self.noise_multiplier(r, steps), steps, self.stream_delta)
                for r in rates]

    def _memory_masks(self, rng, sizes, uses, steps):
        """Poisson rows over the whole memory at the public rate ``1/B`` (B stored batches of nominal size λ);
        every step has a (possibly empty) reference batch."""
        mask = rng.random((steps, int(sum(sizes)))) < 1.0 / len(sizes)
        return mask, np.ones(steps, dtype=bool)

    def _plan(self, state, q, steps, memory_batches):
        cfg = self.config
        if state.tasks_done >= cfg.num_tasks:
            raise BudgetExhausted(f"budget_exhausted: the budget covers {cfg.num_tasks} tasks")
        # basic composition of every stream of every task so far (task i had i stored batches)
        current = self._task_accounts(memory_batches, q, steps)
        accounts = [a for i, (s, r) in enumerate(self._past_shapes(state)) for a in self._task_accounts(i, r, s)]
        accounts += current
        spends = [ACCOUNT_KINDS[kind](**a) for kind, a in accounts]
        eps, delta = sum(e for e, _ in spends), sum(d for _, d in spends)
        if eps > cfg.epsilon * (1 + 1e-9):
            raise BudgetExhausted(f"budget_exhausted: epsilon {eps:.4g} would exceed {cfg.epsilon:g}")
        z = current[0][1]["noise_multiplier"] if current else None
        z_mem = current[1][1]["noise_multiplier"] if len(current) > 1 else None
        meta = {"memory_sampling_rate": current[1][1]["sampling_rate"]} if len(current) > 1 else {}
        meta.update(noise_multiplier=z, noise_multiplier_memory=z_mem, accountant=accountant_label(cfg.accountant))
        declared = declaration_json((), tuple(account(kind, **a) for kind, a in accounts))
        return z, z_mem, (min(eps, cfg.epsilon), min(delta, cfg.delta), declared), meta


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
        self.memory_noise_multiplier = dpsgd_noise_multiplier(
            1.0, config.memory_uses, config.memory_share * config.epsilon, config.delta, accountant=config.accountant)

    def example_event(self, q: float, z: float, steps: int) -> dp_accounting.DpEvent:
        """Everything one example of a task can take part in: its task's steps and K memory uses."""
        return example_event(q, z, steps, self.memory_noise_multiplier, self._cap)

    def _task_account(self, q: float, steps: int) -> tuple[str, dict]:
        """The ``(kind, parameters)`` account of one example of a task: its ``steps`` Poisson(q) steps at the
        calibrated ``z_τ`` and its K memory uses at ``z_M``."""
        cfg = self.config
        z = dpsgd_noise_multiplier(q, steps, cfg.epsilon, cfg.delta, self.memory_noise_multiplier, self._cap,
                                   accountant=cfg.accountant)
        return dpsgd_account(cfg.accountant, q, z, steps, cfg.delta, self.memory_noise_multiplier, self._cap)

    def _plan(self, state, q, steps, memory_batches):
        cfg = self.config
        # tasks are disjoint: the worst example is that of the task whose account spends most
        accounts = [self._task_account(r, s) for s, r in self._past_shapes(state) + [(steps, q)] if s]
        spends = [ACCOUNT_KINDS[kind](**a)[0] for kind, a in accounts]
        worst = max(range(len(accounts)), key=spends.__getitem__, default=None)
        eps = state.epsilon_spent if worst is None else max(state.epsilon_spent, spends[worst])
        declared = "" if worst is None else declaration_json((), (account(accounts[worst][0], **accounts[worst][1]),))
        z = accounts[-1][1]["noise_multiplier"] if steps else None
        meta = {"noise_multiplier": z, "noise_multiplier_memory": self.memory_noise_multiplier,
                "memory_uses_cap": self._cap, "accountant": accountant_label(cfg.accountant)}
        return z, self.memory_noise_multiplier, (eps, cfg.delta, declared), meta


class NonPrivateAGEM(_SGDLearner):
    """A-GEM without clipping or noise. NOT private (``guarantee is None``); benchmarks only."""

    name = "agem_nonprivate"
    guarantee = None
    guarantee_basis = "none (not private)"

    def __init__(self, config: AGEMConfig):
        if not isinstance(config, AGEMConfig):
            raise TypeError("NonPrivateAGEM takes an AGEMConfig")
        super().__init__(config)

    def _public_size(self, task_id: str, n_rows: int) -> int:
        return n_rows  # not private: the true size sets the steps
