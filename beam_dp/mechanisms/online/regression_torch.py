"""The torch backend of PRIVINCREG₁/₂ (``backend="torch"``): their ``d × d`` tree sums and the solver's
gradient on a torch device (CUDA for large ``d``; numpy stays the default and the reference).

:class:`DeviceTree` runs a tree prefix-sum mechanism (binary, hybrid or doubling; built by
``make_tree_sum`` exactly as for numpy) on the device. It keeps per stream the clean running sum
``P_t = Σ_{s<=t} x_s`` and the noise of every node that the release at ``t`` uses, and releases
``P_t + Σ_{node ∈ nodes_used(t)} noise(node)``. That is the numpy tree's release: for all three trees
the nodes used at ``t`` partition the steps ``1..t`` (``node_steps``; tested), so the sum of their clean
node sums is ``P_t``. The noise cells are the numpy tree's own (``tree._draw``: the same keyed
``NoiseSource`` cells, drawn on the host and moved to the device once per step); calibration, the
horizon refusal, ``noise_var``, ``epsilon_spent`` and the noise declaration are the wrapped tree's. So
the guarantee is the numpy mechanism's ((ε, δ)-DP per tree, event level), and releases agree with numpy
up to float64 reassociation (the sums are added in another order).

A node used at ``t + 1`` is either used at ``t`` or noised at ``t + 1`` (dyadic prefixes), so the noise
kept after step ``t`` is exactly that of ``nodes_used(t)``. A decoded state carries ``P_t`` only; the
next step redraws the noise of the nodes it uses from their keys (the same cells: a replay, never a
fresh, averageable draw). State on the wire: ``(stream, t, P_t)`` float64 (raw; never released).

Pin one backend per job: a numpy state does not decode on torch and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import numpy as np
import torch

from beam_dp.core.noise import NoiseSource
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.base import GroupSteppedSum
from beam_dp.mechanisms.torch_device import resolve_device

__all__ = ["DeviceTree", "DeviceTreeGroup", "DeviceTreeState", "device_gradient"]


@dataclass(frozen=True, eq=False)
class DeviceTreeState:
    """One stream's device tree after ``t`` steps: ``prefix`` = ``P_t`` (``(D,)`` numpy or tensor) and the
    noises of ``nodes_used(t)`` (``None`` after decoding: redrawn at the next step)."""

    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    prefix: Any
    noises: dict | None = None


@dataclass(frozen=True, eq=False)
class DeviceTreeGroup:
    """A group of streams at step ``t``: ``prefix (S, D)`` and ``noises`` node → ``(S, D)`` tensor."""

    streams: tuple[str, ...]
    t: int
    prefix: Any
    noises: dict


@dataclass(frozen=True, eq=False)
class _Wire:
    STATE_VERSION: ClassVar[int] = 1
    stream: str
    t: int
    prefix: np.ndarray


class DeviceRelease(NamedTuple):
    """A device tree's step output: ``values (S, D)`` on the host, the same on the device, the spend and
    its noise declaration (the wrapped tree's worst loss, :mod:`beam_dp.core.noise_declaration`)."""

    values: np.ndarray
    device_values: torch.Tensor
    epsilon_spent: float
    delta_spent: float
    noise: str


class DeviceTree:
    """``tree`` (a :class:`~beam_dp.mechanisms.base.GroupSteppedSum` tree) stepped on ``device`` ("cpu",
    "cuda" or "auto", resolved at each step on the worker). The interface PRIVINCREG uses: ``init_state``,
    ``stack``/``unstack``, ``encode_state``/``decode_state``, ``clip_and_sum_groups``, ``step_group``,
    ``noise_var``."""

    def __init__(self, tree: GroupSteppedSum, device: str = "cpu") -> None:
        self.tree = tree
        self.device = device
        self.dim = tree.dim

    def noise_var(self, t: int) -> float:
        return self.tree.noise_var(t)

    def clip_and_sum_groups(self, contributions: np.ndarray, groups: np.ndarray, n_groups: int):
        return self.tree.clip_and_sum_groups(contributions, groups, n_groups)

    def init_state(self, stream: str) -> DeviceTreeState:
        if not isinstance(stream, str):
            raise TypeError(f"stream must be a str, got {type(stream).__name__}")
        return DeviceTreeState(stream, 0, np.zeros(self.dim), {})

    def encode_state(self, state: DeviceTreeState) -> bytes:
        prefix = state.prefix.cpu().numpy() if isinstance(state.prefix, torch.Tensor) else np.asarray(state.prefix)
        return encode_state(_Wire(state.stream, state.t, prefix))

    def decode_state(self, data: bytes) -> DeviceTreeState:
        wire = decode_state(_Wire, data)
        if wire.prefix.shape != (self.dim,):
            raise ValueError(f"device tree state of shape {wire.prefix.shape}, expected ({self.dim},)")
        return DeviceTreeState(wire.stream, wire.t, wire.prefix, None)

    def stack(self, states: Sequence[DeviceTreeState]) -> DeviceTreeGroup:
        if not states:
            raise ValueError("a group needs at least one stream")
        steps = {s.t for s in states}
        if len(steps) != 1:
            raise ValueError(f"the streams of a group must be at the same step, got steps {sorted(steps)}")
        dev = resolve_device(self.device)
        shared = set.intersection(*(set(s.noises or {}) for s in states))
        if len(states) == 1:  # the per-stream path: views, no copies
            (one,) = states
            return DeviceTreeGroup((one.stream,), one.t, _on(one.prefix, dev)[None],
                                   {node: one.noises[node][None] for node in shared})
        prefix = torch.stack([_on(s.prefix, dev) for s in states])
        noises = {node: torch.stack([s.noises[node] for s in states]) for node in shared}
        return DeviceTreeGroup(tuple(s.stream for s in states), steps.pop(), prefix, noises)

    def unstack(self, group: DeviceTreeGroup) -> list[DeviceTreeState]:
        """Per-stream states: views of the group's tensors (never written in place)."""
        return [DeviceTreeState(s, group.t, group.prefix[i], {node: v[i] for node, v in group.noises.items()})
                for i, s in enumerate(group.streams)]

    def step_group(self, group: DeviceTreeGroup, sums: np.ndarray, counts: np.ndarray,
                   noise: NoiseSource) -> tuple[DeviceTreeGroup, DeviceRelease]:
        """Step ``t + 1`` of every stream on its clipped step sum (``clip_and_sum_groups``): ``P`` grows by
        the sums (moved once); the node noised now is drawn on the host and moved once."""
        sums = np.asarray(sums, dtype=np.float64)
        S = len(group.streams)
        if sums.shape != (S, self.dim) or np.shape(counts) != (S,):
            raise ValueError(f"expected sums ({S}, {self.dim}) and counts ({S},), got {sums.shape}, {np.shape(counts)}")
        bound = np.asarray(counts) * self.tree.clip_bound * (1 + 1e-9)
        if not np.all(np.isfinite(sums)) or np.any(np.linalg.norm(sums, axis=1) > bound):  # defence in depth
            raise ValueError("step sums must be finite and made by clip_and_sum_groups")
        t = group.t + 1
        used = self.tree.nodes_used(t)  # refuses steps beyond a binary tree's horizon
        dev = group.prefix.device
        prefix = group.prefix + torch.as_tensor(sums, device=dev)
        noises = {}
        for node in used:
            v = group.noises.get(node)
            noises[node] = v if v is not None else torch.as_tensor(self.tree._draw(node, noise, group.streams), device=dev)
        values = prefix.clone()
        for v in noises.values():
            values.add_(v)
        loss = self.tree._worst_loss(t)
        eps, delta = self.tree.spend(loss)
        release = DeviceRelease(values.cpu().numpy(), values, eps, delta, loss.declaration())
        return DeviceTreeGroup(group.streams, t, prefix, noises), release


def _on(x: Any, dev: torch.device) -> torch.Tensor:
    """A float64 tensor on ``dev``: tensors move (no copy if already there), host arrays are copied
    (they may be read-only views of a decoded state)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=dev, dtype=torch.float64)
    return torch.tensor(np.asarray(x), dtype=torch.float64, device=dev)


def device_gradient(rq: DeviceRelease, rQ: DeviceRelease, m: int, symmetrize: bool) -> Callable[[np.ndarray], np.ndarray]:
    """PRIVINCREG's private gradient ``θ ↦ 2(Q̂θ − q̂)`` of every stream with ``Q̂`` kept on the device;
    ``θ`` (``(S, m)``, host) goes there and back each call (``m`` floats per stream)."""
    Q = rQ.device_values.reshape(-1, m, m)
    if symmetrize:
        Q = 0.5 * (Q + Q.swapaxes(1, 2))
    q = rq.device_values

    def grad(theta: np.ndarray) -> np.ndarray:
        th = torch.tensor(theta, dtype=torch.float64, device=Q.device)  # a copy: theta may be read-only
        return (2.0 * (torch.matmul(Q, th[:, :, None])[:, :, 0] - q)).cpu().numpy()

    return grad
