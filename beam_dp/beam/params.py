"""Frozen parameter dataclasses of the public transforms (in the spirit of PipelineDP's AggregateParams).

Constructing a params object validates everything and builds the mechanism once, so invalid
privacy parameters (epsilon <= 0, delta outside [0, 1), W < 1, horizon < 1, a Gaussian paper
calibration that fails the exact check) raise ``ValueError`` before a pipeline is built.

Steps come from exactly one of:

* ``clock`` (:class:`~beam_dp.core.StepClock`): event-time steps; a batch replay needs its public
  ``end``; every step from 1 to the end releases, empty ones included;
* ``block_size`` (b0): count steps, each a block of b0 contributions in arrival order. This
  assumes the arrival count is public; an incomplete final block is never released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal

import numpy as np

from beam_dp.core.budget import check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.limits import (
    EPSILON_RANGE,
    MAX_DIM,
    MAX_SCALE,
    MIN_SCALE,
    check_count,
    check_delta,
    check_noise_std,
    check_number,
    check_window,
)
from beam_dp.mechanisms.base import ContinualSumMechanism
from beam_dp.mechanisms.snapping import SnappedSum
from beam_dp.steps.params import NoiseKey, StepParams, check_idle, check_stream_groups

__all__ = ["ContinualCountParams", "ContinualSumParams", "NoiseKey", "WindowedSumParams"]


def _public_end(clock: StepClock | None) -> int | None:
    """The clock's public last step (a horizon for the non-tree counters), if it has one."""
    return None if clock is None else clock.last_step


@dataclass(frozen=True)
class _VectorSumParams(StepParams):
    dim: int = 1
    epsilon: float = 1.0
    clip_bound: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian"] = "gamma"
    #: Gaussian noise: "analytic" (the smallest exact sigma) or "paper" (the paper's closed form, certified)
    calibration: Literal["paper", "analytic"] = "analytic"
    #: key the engine by this many groups of streams (a public, stable hash of the stream name): one
    #: state and timer per group, the group stepped in one numpy operation, releases as Arrow tables;
    #: None keys by stream. Releases do not depend on it (noise is keyed per stream).
    stream_groups: int | None = None
    #: the idle rule, both or neither (event time, keyed by stream): a stream ends (``stream_ended``, its
    #: state freed) after its own step t >= idle_steps at which its released prefix sums moved by
    #: ||release_t - release_{t-k}||_2 <= idle_threshold (the values' units). Decided from the releases
    #: alone: post-processing, no privacy cost (docs/steps.md, rule 6).
    idle_steps: int | None = None
    idle_threshold: float | None = None

    #: the noise laws of this family (a counter may accept fewer: it says which)
    _noises: ClassVar[tuple[str, ...]] = ("gamma", "gaussian")

    def _validate_numbers(self) -> None:
        """Ranges of the numeric fields (``beam_dp.core.limits``), checked before the mechanism is built."""
        check_count("dim", self.dim, 1, MAX_DIM)
        check_number("epsilon", self.epsilon, *EPSILON_RANGE)
        check_number("clip_bound", self.clip_bound, MIN_SCALE, MAX_SCALE)
        check_delta(self.delta)
        if self.noise not in self._noises:
            raise ValueError(f"noise must be one of {', '.join(map(repr, self._noises))}, got {self.noise!r}")

    def _validate_noise(self, mechanism: ContinualSumMechanism, last_step: int | None) -> None:
        """Refuse parameters whose release noise overflows float64, at the first and the last public step.
        (Any granularity works: snapped units are exact integers at any size, beam_dp.core.grid.)"""
        with np.errstate(all="ignore"):
            for t in {1, last_step or 1}:
                try:
                    std = math.sqrt(mechanism.noise_var(t))
                except (OverflowError, ZeroDivisionError, FloatingPointError):
                    std = math.inf
                check_noise_std(std, f"epsilon={self.epsilon!r}, delta={self.delta!r}, clip_bound={self.clip_bound!r}")

    def _mechanism_kwargs(self, clip_bound: float) -> dict:
        return dict(
            dim=self.dim, epsilon=self.epsilon, delta=self.delta, clip_bound=clip_bound,
            noise=self.noise, calibration=self.calibration,
        )

    def _snapped(self, make: Callable[[float], ContinualSumMechanism],
                 inputs_on_grid: bool = False) -> ContinualSumMechanism:
        """``make(clip_bound)``, wrapped in a ``SnappedSum`` when a granularity is set."""
        if self.granularity is None or (inputs_on_grid and self.noise == "discrete_laplace"):
            return make(self.clip_bound)  # (integer noise on integer counts is already exact on the grid)
        return SnappedSum(make, clip_bound=self.clip_bound, granularity=self.granularity,
                          inputs_on_grid=inputs_on_grid)


@dataclass(frozen=True)
class ContinualSumParams(_VectorSumParams):
    """Private running sums of vectors per stream, forever.

    ``counter`` picks the mechanism (``beam_dp.mechanisms.counters.make_counter``): ``"auto"``
    (default) = the 4-buffer BLT factorization for ``noise="gaussian"`` and the fitted k-ary Honaker
    tree for ``noise="gamma"``; ``"tree"`` = the tree mechanisms (``horizon`` known -> binary tree;
    ``None`` -> unbounded: ``"hybrid"`` (default) or ``"doubling"``); also ``"honaker"``,
    ``"toeplitz"`` (needs a horizon), ``"blt"``, ``"kary"``. For counters other than ``"tree"`` a missing
    ``horizon`` defaults to the clock's public end, else to the counter's unbounded mode;
    ``calibration`` applies to ``"tree"`` only. ``blt_error`` picks the BLT's shipped fit: ``"max"``
    (default, minimal max per-step variance) or ``"mean"`` (minimal mean per-step variance over the
    horizon; the BLT only). Guarantee: epsilon-DP (``noise="gamma"``) or
    (epsilon, delta)-DP (``"gaussian"``) for each contribution, over the whole stream.
    """

    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"
    blt_error: Literal["max", "mean"] = "max"  # the BLT's fit: minimal max or mean per-step variance

    # Only the unit contributions of ContinualCount are integers; a real-valued sum plus integer noise
    # would release its fractional part exactly, so ContinualSum refuses discrete_laplace.
    _integer_contributions: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self._validate_steps()
        if self.noise == "discrete_laplace" and not self._integer_contributions:
            raise ValueError(
                "noise='discrete_laplace' is for ContinualCount only: a non-integer sum plus integer noise "
                "would leak its fractional part"
            )
        self._validate_numbers()
        if self.horizon is not None:
            check_count("horizon", self.horizon)
        if self.horizon is not None and self.clock is not None and self.clock.last_step is not None:
            if self.clock.last_step > self.horizon:
                raise ValueError(f"the clock has {self.clock.last_step} steps but horizon is {self.horizon}")
        mechanism = self.build_mechanism()
        self._validate_noise(mechanism, self.horizon or _public_end(self.clock))
        check_stream_groups(self, mechanism)
        check_idle(self, mechanism)
        check_params_budget(self, mechanism)

    def build_mechanism(self):
        from beam_dp.mechanisms.counters import make_counter

        def make(clip_bound: float):
            return make_counter(self.counter, horizon=self.horizon, unbounded=self.unbounded,
                                public_end=_public_end(self.clock), blt_error=self.blt_error,
                                **self._mechanism_kwargs(clip_bound))

        # a count's steps are integers, already on any grid g <= 1: snapping them costs no sensitivity
        return self._snapped(make, inputs_on_grid=self._integer_contributions and (self.granularity or 1.0) <= 1.0)


@dataclass(frozen=True)
class _UnitCountSumParams(ContinualSumParams):
    """``ContinualSumParams`` of a count (every contribution is exactly 1, R = 1): the one place the
    integer law ``noise="discrete_laplace"`` is admitted."""

    _integer_contributions: ClassVar[bool] = True
    _noises: ClassVar[tuple[str, ...]] = ("gamma", "gaussian", "discrete_laplace")


@dataclass(frozen=True)
class WindowedSumParams(_VectorSumParams):
    """Private running sums with privacy expiration: each contribution is protected while fewer than
    ``window`` (rounded up to a power of two) later steps have been released; afterwards it appears
    un-noised in later releases. ``calibration`` (Gaussian noise): ``"analytic"`` (default, the
    smallest exact sigma: the transform spends its whole share) or ``"paper"`` (certified)."""

    window: int = 1

    def __post_init__(self) -> None:
        self._validate_steps()
        self._validate_numbers()
        check_window(self.window, self.dim)
        mechanism = self.build_mechanism()
        self._validate_noise(mechanism, _public_end(self.clock))
        check_stream_groups(self, mechanism)
        check_idle(self, mechanism)
        check_params_budget(self, mechanism)

    def build_mechanism(self):
        from beam_dp.mechanisms.window_tree import WindowTreeSum

        return self._snapped(lambda bound: WindowTreeSum(window=self.window, **self._mechanism_kwargs(bound)))


@dataclass(frozen=True)
class ContinualCountParams(StepParams):
    """Private running counts of events per stream: a continual sum of 1 per event (R = 1, so
    Δ₂ = 2 under replace-one neighbours). Same mechanisms (``counter``) and guarantees as ``ContinualSumParams``.

    Counts are integers, so by default (``granularity=1``) they are released as exact integers:
    integer steps plus data-independent noise rounded to the integers, added exactly (``SnappedSum``;
    the steps are already on the grid, so the guarantee is the counter's own). ``granularity=None``
    releases the raw float estimate. ``noise="discrete_laplace"``: the trees' exact integer sampler
    (discrete Laplace node noise at their Gamma scales, pure epsilon; ``counter`` must be ``"auto"`` or
    ``"tree"``)."""

    granularity: float | None = 1.0
    epsilon: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian", "discrete_laplace"] = "gamma"
    calibration: Literal["paper", "analytic"] = "analytic"
    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"
    blt_error: Literal["max", "mean"] = "max"  # as ContinualSumParams.blt_error
    stream_groups: int | None = None  # as ContinualSumParams.stream_groups (needs granularity=None)

    def __post_init__(self) -> None:
        self._validate_steps()
        self.as_sum_params()

    def as_sum_params(self) -> ContinualSumParams:
        return _UnitCountSumParams(
            clock=self.clock, block_size=self.block_size, streams=self.streams, noise_key=self.noise_key,
            restore_states=self.restore_states, granularity=self.granularity, allowed_lateness=self.allowed_lateness,
            dim=1, epsilon=self.epsilon,
            clip_bound=1.0, delta=self.delta, noise=self.noise, calibration=self.calibration, horizon=self.horizon,
            unbounded=self.unbounded, counter=self.counter, blt_error=self.blt_error, budget=self.budget,
            stream_groups=self.stream_groups,
        )

    def build_mechanism(self):
        return self.as_sum_params().build_mechanism()
