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

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal

from beam_dp.core.budget import BudgetShare, check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.noise import KEY_ENV_VAR, NoiseSource
from beam_dp.core.grid import power_of_two_at_least
from beam_dp.mechanisms.base import ContinualSumMechanism
from beam_dp.mechanisms.snapping import SnappedSum

__all__ = ["ContinualCountParams", "ContinualSumParams", "NoiseKey", "WindowedSumParams"]


@dataclass(frozen=True)
class NoiseKey:
    """Where workers read the secret noise key at ``setup()`` (a Secret Manager secret version
    ``projects/P/secrets/S/versions/V``, a file on any Beam filesystem such as ``gs://``, or an env var
    holding hex; see :mod:`beam_dp.io.keys`), and the *noise domain* the transform draws in.

    Only the *location* travels in the pipeline graph, never the key. With none present the
    workers draw a random key and log that the run is not reproducible.

    ``domain`` names one transform instance of one job; every draw is keyed by (key, domain, stream,
    purpose, index), so two transforms never share noise. Leave it ``None``: a beam_dp transform binds
    it to its full label in the pipeline when it is applied (``beam_dp.beam.domains``) and refuses a
    domain already claimed in the same pipeline. Set it explicitly to keep a transform's noise when it
    is renamed, or to separate two jobs that reuse one key with the same labels.
    """

    env_var: str | None = KEY_ENV_VAR
    key_file: str | None = None
    domain: str | None = None
    secret: str | None = None

    def __post_init__(self) -> None:
        if self.domain is not None and (not isinstance(self.domain, str) or not self.domain):
            raise ValueError(f"NoiseKey.domain must be a non-empty string or None, got {self.domain!r}")

    def load(self) -> NoiseSource:
        """The noise source of this key's domain (read on the worker; never pickled)."""
        from beam_dp.io.keys import load_noise_source

        if self.domain is None:
            raise ValueError(
                "this noise key has no noise domain: apply the params through a beam_dp transform (which "
                "binds its full label) or set NoiseKey(domain=...)"
            )
        return load_noise_source(self.env_var, self.key_file, self.secret).for_domain(self.domain)


def _public_end(clock: StepClock | None) -> int | None:
    """The clock's public last step (a horizon for the non-tree counters), if it has one."""
    return None if clock is None else clock.last_step


@dataclass(frozen=True)
class _StepParams:
    clock: StepClock | None = None
    block_size: int | None = None
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    # Encoded mechanism states to resume streams from (stream -> mechanism.encode_state(...)), e.g. a
    # snapshot taken mid-stream. A snapshot holds un-noised sums: it is as sensitive as the raw data.
    restore_states: tuple[tuple[str, bytes], ...] | None = None
    # Release on the grid g = 2^k (the power of two >= granularity) with exact arithmetic and
    # data-independent noise (beam_dp.mechanisms.snapping.SnappedSum): closes the floating-point channel
    # of Mironov 2012; the mechanism is calibrated for the clip bound R + sqrt(dim)*g (see docs/reliability.md).
    granularity: float | None = None
    # this transform's share of its job's budget (JobBudget(...).split(...)[name]; pass **share.params()):
    # refused at construction unless the mechanism fits it; releases then report the job's spend
    budget: BudgetShare | None = None

    def _validate_steps(self) -> None:
        if (self.clock is None) == (self.block_size is None):
            raise ValueError("give exactly one of clock (event-time steps) or block_size (count steps)")
        if self.granularity is not None:
            power_of_two_at_least(self.granularity)  # raises ValueError unless finite and > 0
        if self.restore_states is not None:
            states = dict(self.restore_states)
            if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in states.items()):
                raise ValueError("restore_states must be (stream, encoded state bytes) pairs")
            object.__setattr__(self, "restore_states", tuple(sorted(states.items())))
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.streams is not None:
            if isinstance(self.streams, str) or not all(isinstance(s, str) and s for s in self.streams):
                raise ValueError("streams must be a tuple of non-empty strings")
            object.__setattr__(self, "streams", tuple(dict.fromkeys(self.streams)))

    @property
    def event_time(self) -> bool:
        return self.clock is not None


@dataclass(frozen=True)
class _VectorSumParams(_StepParams):
    dim: int = 1
    epsilon: float = 1.0
    clip_bound: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian"] = "gamma"
    calibration: Literal["paper", "analytic"] = "paper"

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
    ``calibration`` applies to ``"tree"`` only. Guarantee: epsilon-DP (``noise="gamma"``) or
    (epsilon, delta)-DP (``"gaussian"``) for each contribution, over the whole stream.
    """

    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"

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
        if self.horizon is not None and self.clock is not None and self.clock.last_step is not None:
            if self.clock.last_step > self.horizon:
                raise ValueError(f"the clock has {self.clock.last_step} steps but horizon is {self.horizon}")
        check_params_budget(self, self.build_mechanism())

    def build_mechanism(self):
        from beam_dp.mechanisms.counters import make_counter

        def make(clip_bound: float):
            return make_counter(self.counter, horizon=self.horizon, unbounded=self.unbounded,
                                public_end=_public_end(self.clock), **self._mechanism_kwargs(clip_bound))

        # a count's steps are integers, already on any grid g <= 1: snapping them costs no sensitivity
        return self._snapped(make, inputs_on_grid=self._integer_contributions and (self.granularity or 1.0) <= 1.0)


@dataclass(frozen=True)
class _UnitCountSumParams(ContinualSumParams):
    """``ContinualSumParams`` of a count (every contribution is exactly 1, R = 1): the one place the
    integer law ``noise="discrete_laplace"`` is admitted."""

    _integer_contributions: ClassVar[bool] = True


@dataclass(frozen=True)
class WindowedSumParams(_VectorSumParams):
    """Private running sums with privacy expiration: each contribution is protected while fewer than
    ``window`` (rounded up to a power of two) later steps have been released; afterwards it appears
    un-noised in later releases."""

    window: int = 1

    def __post_init__(self) -> None:
        self._validate_steps()
        check_params_budget(self, self.build_mechanism())

    def build_mechanism(self):
        from beam_dp.mechanisms.window_tree import WindowTreeSum

        return self._snapped(lambda bound: WindowTreeSum(window=self.window, **self._mechanism_kwargs(bound)))


@dataclass(frozen=True)
class ContinualCountParams(_StepParams):
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
    calibration: Literal["paper", "analytic"] = "paper"
    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"

    def __post_init__(self) -> None:
        self._validate_steps()
        self.as_sum_params()

    def as_sum_params(self) -> ContinualSumParams:
        return _UnitCountSumParams(
            clock=self.clock, block_size=self.block_size, streams=self.streams, noise_key=self.noise_key,
            restore_states=self.restore_states, granularity=self.granularity, dim=1, epsilon=self.epsilon,
            clip_bound=1.0, delta=self.delta, noise=self.noise, calibration=self.calibration, horizon=self.horizon,
            unbounded=self.unbounded, counter=self.counter, budget=self.budget,
        )

    def build_mechanism(self):
        return self.as_sum_params().build_mechanism()
