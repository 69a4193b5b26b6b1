"""Configuration of the lifelong learners and the task block they consume (no torch here).

Every config is a frozen, keyword-only dataclass validated at construction (``ValueError``);
:func:`beam_dp.mechanisms.lifelong.factory.build_learner` returns its learner (that import pulls in
torch, so a pipeline graph holding a config does not need torch until a worker builds the learner).

Common knobs (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning"): ``input_dim`` d, ``n_classes`` K (one shared head),
``hidden`` β (width of the input layer θ_1), ``g_layers`` (widths of G's hidden layers; the last
one, n_π, is clipped to [−1, 1] and gets a constant bias unit), ``batch_size`` λ,
``learning_rate``/``optimizer`` ("adam" per block, or the paper's plain "sgd"), the schedule
(``epochs``: an int, a mapping task id → epochs, or a function of the public task size |D_τ|;
or ``steps_per_task`` for the Balanced mode), ``task_ids`` (declared order; None accepts any new
id), ``eval_sets`` (public test data per task for the accuracy metadata), ``device`` and ``dtype``;
``micro_batch``: most rows whose per-example gradients are held at once (DP-SGD learners; a logical
batch of any size is summed over micro-batches, the result does not depend on it beyond rounding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

from beam_dp.core.limits import MAX_SCALE, check_number

__all__ = [
    "AGEMConfig",
    "BoundedAGEMConfig",
    "L2DPConfig",
    "LifelongConfig",
    "NaiveGaussianConfig",
    "TaskData",
]

Epochs = int | Mapping[str, int] | Callable[[int], int]


@dataclass(frozen=True, eq=False)
class TaskData:
    """All training tuples of one task: ``x`` (n, d) float, ``y`` (n,) integer class ids in [0, K)."""

    task_id: str
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(np.asarray(self.y).shape[0])


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_float(name: str, value: Any) -> None:
    check_number(name, value, 0.0, MAX_SCALE, low_open=True)


@dataclass(frozen=True, kw_only=True)
class LifelongConfig:
    """Shared settings of every learner (see the module docstring)."""

    input_dim: int
    n_classes: int
    hidden: int = 32
    g_layers: tuple[int, ...] = (64, 32)
    batch_size: int = 32
    learning_rate: float = 1e-3
    optimizer: Literal["adam", "sgd"] = "adam"
    epochs: Epochs = 1
    steps_per_task: int | None = None
    task_ids: tuple[str, ...] | None = None
    eval_sets: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = field(default=None, repr=False)
    eval_batch: int = 256
    agem_always_project: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float64", "float32"] = "float64"
    micro_batch: int = 1024

    def __post_init__(self) -> None:
        for name in ("input_dim", "n_classes", "hidden", "batch_size", "micro_batch"):
            _positive_int(name, getattr(self, name))
        if self.n_classes < 2:
            raise ValueError("n_classes must be >= 2")
        if not self.g_layers or not all(isinstance(w, int) and w >= 1 for w in self.g_layers):
            raise ValueError("g_layers must be a non-empty tuple of widths >= 1")
        object.__setattr__(self, "g_layers", tuple(self.g_layers))
        _positive_float("learning_rate", self.learning_rate)
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.steps_per_task is not None:
            _positive_int("steps_per_task", self.steps_per_task)
        if isinstance(self.epochs, Mapping):
            for task, e in self.epochs.items():
                _positive_int(f"epochs[{task!r}]", e)
        elif not callable(self.epochs):
            _positive_int("epochs", self.epochs)
        if self.task_ids is not None:
            ids = tuple(str(t) for t in self.task_ids)
            if not ids or len(set(ids)) != len(ids):
                raise ValueError("task_ids must be a non-empty tuple of distinct ids")
            object.__setattr__(self, "task_ids", ids)
            if isinstance(self.epochs, Mapping) and set(map(str, self.epochs)) - set(ids):
                raise ValueError("epochs names a task that is not among task_ids")
        if self.eval_batch < 32:
            raise ValueError("eval_batch must be >= 32 (batch-statistics normalisation)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")
        if self.eval_sets is not None:
            clean = {}
            for task, (x, y) in self.eval_sets.items():
                x = np.asarray(x, dtype=np.float64)
                y = np.asarray(y).astype(np.int64)
                if x.ndim != 2 or x.shape[1] != self.input_dim or y.shape != (x.shape[0],):
                    raise ValueError(f"eval set of task {task!r} must be x (n, {self.input_dim}) and y (n,)")
                if x.shape[0] < 32:
                    raise ValueError(f"eval set of task {task!r} needs >= 32 rows")
                clean[str(task)] = (np.clip(x, -1.0, 1.0), y)
            object.__setattr__(self, "eval_sets", clean)

    def epochs_for(self, task_id: str, n_rows: int) -> int:
        """Epochs of a task: the configured int, the mapping's entry (default 1) or ``epochs(|D_τ|)``."""
        if isinstance(self.epochs, Mapping):
            return int({str(k): v for k, v in self.epochs.items()}.get(task_id, 1))
        if callable(self.epochs):
            e = self.epochs(int(n_rows))
            _positive_int("epochs(|D_τ|)", e)
            return int(e)
        return int(self.epochs)


@dataclass(frozen=True, kw_only=True)
class L2DPConfig(LifelongConfig):
    """L2DP-ML (Lai et al.): ``epsilon`` total (the paper's Theorem 2 claim), ``rho_s`` share of it for
    the reconstruction side, ``b_theta`` the bound on |W_1|'s column and row sums, ``ae_mode``
    ("code": |first-order expansion| with autodiff, default; "paper": the printed gradient) and
    ``label_path`` ("autodiff": M_B differentiated through G, default; "constant": M_B a constant);
    ``encoder_batch_norm`` normalises the encoder's pre-activation by batch statistics before the clip
    (predecessor code; cancels the constant ``χ_1/λ`` offset, which otherwise saturates the clip when d is large)."""

    epsilon: float = 1.0
    rho_s: float = 0.5
    b_theta: float = 1.0
    ae_mode: Literal["code", "paper"] = "code"
    label_path: Literal["autodiff", "constant"] = "autodiff"
    encoder_batch_norm: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_float("epsilon", self.epsilon)
        _positive_float("b_theta", self.b_theta)
        if not 0.0 < self.rho_s < 1.0:
            raise ValueError(f"rho_s must lie in (0, 1), got {self.rho_s!r}")
        if self.ae_mode not in ("code", "paper"):
            raise ValueError(f"ae_mode must be 'code' or 'paper', got {self.ae_mode!r}")
        if self.label_path not in ("autodiff", "constant"):
            raise ValueError(f"label_path must be 'autodiff' or 'constant', got {self.label_path!r}")



TASK_SIZE_REQUIRED = ("task_size is required: the public, declared size of each task (an int, or a mapping task "
                      "id -> int). The sampling rate batch_size/task_size and the step count are computed from it, "
                      "so that the true task size stays private under add/remove-one neighbours")


@dataclass(frozen=True, kw_only=True)
class _DPSGDConfig(LifelongConfig):
    """DP-SGD settings: ``epsilon``, ``delta``, ``clip_norm`` C and ``task_size``, the *declared public*
    size N_τ of each task (int or mapping task id → int). Poisson sampling runs at ``q = λ/N_τ`` for
    ``epochs(N_τ) × max(1, round(N_τ/λ))`` steps (or ``steps_per_task``): the true size n_τ only changes
    which rows the keyed sampler meets (expected batch ``q·n_τ``), never a released number.
    ``accountant``: ``"pld"`` (default: dp-accounting's pessimistic PLD, tight) or ``"rdp"`` (its RDP
    accountant, looser) both calibrates the noise multipliers and accounts the spend
    (:mod:`beam_dp.core.accounting.lifelong`)."""

    epsilon: float = 1.0
    delta: float = 1e-5
    clip_norm: float = 1.0
    task_size: int | Mapping[str, int] | None = None
    accountant: Literal["pld", "rdp"] = "pld"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.accountant not in ("pld", "rdp"):
            raise ValueError(f"accountant must be 'pld' or 'rdp', got {self.accountant!r}")
        _positive_float("epsilon", self.epsilon)
        _positive_float("clip_norm", self.clip_norm)
        if check_number("delta", self.delta, 0.0, 1.0, low_open=True) == 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.task_size is None:
            raise ValueError(TASK_SIZE_REQUIRED)
        if isinstance(self.task_size, Mapping):
            sizes = {str(k): v for k, v in self.task_size.items()}
            for task, v in sizes.items():
                _positive_int(f"task_size[{task!r}]", v)
            if self.task_ids is not None and set(self.task_ids) - set(sizes):
                raise ValueError("task_size must give a size for every declared task id")
            object.__setattr__(self, "task_size", sizes)
        else:
            _positive_int("task_size", self.task_size)

    def public_size(self, task_id: str) -> int:
        """The declared size N_τ of a task (``ValueError`` for a task the mapping does not name)."""
        if isinstance(self.task_size, Mapping):
            if task_id not in self.task_size:
                raise ValueError(f"task_size declares no size for task {task_id!r}")
            return int(self.task_size[task_id])
        return int(self.task_size)


@dataclass(frozen=True, kw_only=True)
class NaiveGaussianConfig(_DPSGDConfig):
    """The paper's NaiveGaussian baseline: ``num_tasks`` m declared up front; each task spends
    ε/(2m) on its own data and ε/(2m) on the memory (δ/(2m) each), so the total reaches ε after m tasks
    and a task beyond m is refused. ``noise_multiplier`` fixes z instead (the paper's grid)."""

    num_tasks: int = 1
    noise_multiplier: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("num_tasks", self.num_tasks)
        if self.noise_multiplier is not None:
            _positive_float("noise_multiplier", self.noise_multiplier)
        if self.task_ids is not None and len(self.task_ids) > self.num_tasks:
            raise ValueError("more declared task_ids than num_tasks")



@dataclass(frozen=True, kw_only=True)
class BoundedAGEMConfig(_DPSGDConfig):
    """DP-SGD + A-GEM with bounded participation (sound for any number of tasks): each example is used
    by its own task's Poisson-sampled steps and at most ``memory_uses`` times as part of a memory batch;
    ``memory_share`` of ε is reserved for those memory uses."""

    memory_uses: int = 50
    memory_share: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("memory_uses", self.memory_uses)
        if not 0.0 < self.memory_share < 1.0:
            raise ValueError(f"memory_share must lie in (0, 1), got {self.memory_share!r}")



@dataclass(frozen=True, kw_only=True)
class AGEMConfig(LifelongConfig):
    """Non-private A-GEM: the reference upper line of the benchmarks. NOT private; the Beam transform
    refuses it."""

