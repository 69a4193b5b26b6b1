"""Shared machinery of the lifelong learners: explicit state, task order, optimiser, evaluation, releases.

A learner is a pure state machine over tasks (ARCHITECTURE §3)::

    state = learner.init_state(stream)
    state, [release] = learner.step(state, TaskData(task_id, x, y), noise)   # one task, in order

``step`` trains on the whole task (its schedule is fixed by public facts: |D_τ|, λ, epochs) and
returns one snapshot of the weights (``Release.value``: name -> array) with accuracy metadata computed
on the *public* ``eval_sets`` only. The state (weights, optimiser moments, episodic memory, noise
draws) never leaves the learner. All randomness comes from the keyed ``NoiseSource``: initial
weights, partitions, visiting orders, memory choices and every noise draw are keyed by
``(stream, purpose, task index, ...)``, so a retry or a replay reproduces the same release.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.lifelong.config import LifelongConfig, TaskData
from beam_dp.mechanisms.lifelong.network import init_params, predict, to_torch
from beam_dp.mechanisms.torch_device import resolve_device

__all__ = ["Learner", "LifelongState", "TaskOrderError"]

log = logging.getLogger(__name__)

_ADAM_B1, _ADAM_B2, _ADAM_EPS = 0.9, 0.999, 1e-8


class TaskOrderError(ValueError):
    """A task id that is not declared (``reason="unknown_task"``) or that does not move forward
    (``reason="task_backwards"``)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class LifelongState:
    """Per-stream state. ``params``/``opt``: name -> array; ``memory_*``: one entry per stored batch;
    ``noise``: the one-time draws (L2DP-ML only); spends are the last release's."""

    STATE_VERSION = 1

    stream: str
    tasks_done: int
    seen_tasks: tuple
    params: dict
    opt: dict
    opt_steps: int
    memory_x: tuple
    memory_y: tuple
    memory_uses: tuple
    noise: dict
    epsilon_spent: float
    delta_spent: float


class Learner(abc.ABC):
    """Base class: subclasses implement ``_train_task`` (and set ``name``, ``guarantee``, ``blocks``)."""

    name: str = "lifelong"
    guarantee: Guarantee | None
    batch_stats: bool = False
    encoder_norm: bool = False
    guarantee_basis: str = "accountant"

    def __init__(self, config: LifelongConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.n_layers = len(config.g_layers)
        log.info("%s: training on %s (%s)", self.name, self.device, config.dtype)

    # -- mechanism protocol --------------------------------------------------------------------
    def init_state(self, stream: str) -> LifelongState:
        return LifelongState(stream, 0, (), {}, {}, 0, (), (), (), {}, 0.0, 0.0)

    def encode_state(self, state: LifelongState) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> LifelongState:
        return decode_state(LifelongState, data)

    def merge_blocks(self, items: list[TaskData]) -> TaskData:
        """One task's block from the chunks an adapter buffered for it, rows in a canonical (sorted) order."""
        if not items:
            raise ValueError("no data for the task")
        task = items[0].task_id
        if any(item.task_id != task for item in items):
            raise ValueError("chunks of different tasks cannot be merged")
        x = np.concatenate([np.asarray(i.x, dtype=np.float64).reshape(-1, self.config.input_dim) for i in items])
        y = np.concatenate([np.asarray(i.y).reshape(-1) for i in items])
        order = np.lexsort(np.column_stack([x, y]).T[::-1])  # canonical row order: releases do not depend
        return TaskData(task, x[order], y[order])              # on the order in which an engine delivers rows

    def block_count(self, item: TaskData) -> int:
        return len(item)

    def check_task(self, state: LifelongState, task_id: str) -> None:
        """``TaskOrderError`` unless ``task_id`` is declared (when ids are declared) and comes after every
        task already trained."""
        declared = self.config.task_ids
        if declared is None:
            if task_id in state.seen_tasks:
                raise TaskOrderError("task_backwards", "this task was already trained")
            return
        if task_id not in declared:
            raise TaskOrderError("unknown_task", "task id is not among the declared task_ids")
        if state.seen_tasks and declared.index(task_id) <= declared.index(state.seen_tasks[-1]):
            raise TaskOrderError("task_backwards", "task comes at or before the last trained task")

    def step(self, state: LifelongState, block: TaskData, noise: NoiseSource) -> tuple[LifelongState, list[Release]]:
        """Train on one task (clipped to [−1, 1]) and release the weights."""
        task_id = str(block.task_id)
        self.check_task(state, task_id)
        x, y = self._validate(block)
        if not state.params:
            state = self._initialise(state, noise)
        state, meta, spent = self._train_task(state, task_id, x, y, noise)
        params = to_torch(state.params, self.device, self.dtype)
        seen = state.seen_tasks + (task_id,)
        state = replace(state, tasks_done=state.tasks_done + 1, seen_tasks=seen,
                        epsilon_spent=spent[0], delta_spent=spent[1])
        meta = {**meta, **self._accuracy_meta(params, seen), "task": task_id, "task_index": state.tasks_done,
                "optimizer": self.config.optimizer, "learning_rate": self.config.learning_rate,
                "batch_size": self.config.batch_size, "guarantee_basis": self.guarantee_basis}
        release = Release(state.stream, state.tasks_done, self.name, dict(state.params), spent[0], spent[1], meta,
                          noise=spent[2])
        return state, [release]

    # -- helpers for subclasses ----------------------------------------------------------------------
    def _validate(self, block: TaskData) -> tuple[np.ndarray, np.ndarray]:
        d, k = self.config.input_dim, self.config.n_classes
        x = np.asarray(block.x, dtype=np.float64)
        y = np.asarray(block.y)
        if x.ndim != 2 or x.shape[1] != d or y.shape != (x.shape[0],):
            raise ValueError(f"task data must be x (n, {d}) and y (n,)")
        if not np.all(np.isfinite(x)):
            raise ValueError("task data holds non-finite inputs")
        if y.size and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= k):
            raise ValueError(f"labels must be integers in [0, {k})")
        return np.clip(x, -1.0, 1.0), y.astype(np.int64)

    def _init_bound(self) -> float | None:
        return None

    def _initialise(self, state: LifelongState, noise: NoiseSource) -> LifelongState:
        cfg = self.config
        rng = noise.generator(state.stream, f"{self.name}/init", 0)
        params = init_params(rng, cfg.input_dim, cfg.hidden, cfg.g_layers, cfg.n_classes, self._init_bound())
        params = {k: v.astype(cfg.dtype) for k, v in params.items()}
        opt = {f"{m}/{k}": np.zeros_like(v) for k, v in params.items() for m in ("m", "v")}
        return replace(state, params=params, opt=opt)

    def _torch_state(self, state: LifelongState) -> tuple[dict, dict]:
        return to_torch(state.params, self.device, self.dtype), to_torch(state.opt, self.device, self.dtype)

    def _update(self, params: dict, grads: dict, opt: dict, t: int) -> None:
        """One optimiser step in place on named tensors (``t`` is the 1-based step count of this learner)."""
        for name, g in grads.items():
            self._optimise(params[name], g, opt[f"m/{name}"], opt[f"v/{name}"], t)

    @torch.no_grad()
    def _optimise(self, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int) -> None:
        """SGD or Adam on one tensor in place (a named parameter or the flat vector of all of them)."""
        lr = self.config.learning_rate
        if self.config.optimizer == "sgd":
            p.sub_(lr * g)
            return
        m.mul_(_ADAM_B1).add_(g, alpha=1 - _ADAM_B1)
        v.mul_(_ADAM_B2).addcmul_(g, g, value=1 - _ADAM_B2)
        m_hat = m / (1 - _ADAM_B1 ** t)
        v_hat = v / (1 - _ADAM_B2 ** t)
        p.sub_(lr * m_hat / (torch.sqrt(v_hat) + _ADAM_EPS))

    def _steps_for(self, task_id: str, n_rows: int, batches_per_epoch: int) -> tuple[int, int]:
        """``(epochs, steps)`` of a task: Balanced ``steps_per_task`` or ``epochs × batches``."""
        if batches_per_epoch < 1:
            return 0, 0
        if self.config.steps_per_task is not None:
            return 0, self.config.steps_per_task
        epochs = self.config.epochs_for(task_id, n_rows)
        return epochs, epochs * batches_per_epoch

    def _accuracy_meta(self, params: dict, seen: tuple) -> dict:
        sets = self.config.eval_sets
        if not sets:
            return {}
        acc = {}
        for task in seen:
            if task in sets:
                x, y = sets[task]
                pred = predict(params, x, self.n_layers, self.batch_stats, self.config.eval_batch, self.encoder_norm)
                acc[task] = float(np.mean(pred == y))
        return {"accuracy": acc, "average_accuracy": float(np.mean(list(acc.values()))) if acc else None}

    @abc.abstractmethod
    def _train_task(self, state: LifelongState, task_id: str, x: np.ndarray, y: np.ndarray,
                    noise: NoiseSource) -> tuple[LifelongState, dict[str, Any], tuple[float, float, str]]:
        """Train on one task (x clipped to [−1, 1]); return the new state (params, opt, memory), extra
        meta and the ``(epsilon_spent, delta_spent, noise declaration)`` of the release (the declaration
        ``""`` for a learner that is not private)."""
