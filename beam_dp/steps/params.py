"""The step-parameter contract every engine shares, validated in one place (Beam-free).

Steps come from exactly one of ``clock`` (event time, :class:`~beam_dp.core.StepClock`) or
``block_size`` (count steps: blocks of ``block_size`` contributions in arrival order).
``allowed_lateness`` (seconds, event time only) is the grace: a step closes when the watermark
passes its end plus the grace; data for it arriving within the grace counts, later data is
dead-lettered whole (reason ``late``). ``streams`` declares streams that release from step 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from beam_dp.core import limits
from beam_dp.core.budget import BudgetShare
from beam_dp.core.clock import StepClock
from beam_dp.core.noise import KEY_ENV_VAR, NoiseSource
from beam_dp.core.noise_binding import calibration_binding

__all__ = ["NoiseKey", "StepParams", "check_idle", "check_schedule", "check_stream_groups", "check_streams",
           "legacy_noise_of", "noise_source_of"]


@dataclass(frozen=True)
class NoiseKey:
    """Where workers read the secret noise key at ``setup()`` (a file path, an env var or a secret, hex),
    and the *noise domain* the transform draws in. Only the *location* travels in the pipeline graph,
    never the key; with none present the workers draw a random key and log that the run is not
    reproducible. Every draw is keyed by (key, domain, calibration binding, stream, purpose, index), so
    two transforms never share noise and a changed parameter draws independent noise
    (:func:`noise_source_of`; ``docs/running.md``).

    Args:
        env_var: the environment variable holding the hex key (default ``KEY_ENV_VAR``); None: not read.
        key_file: a file holding the hex key (any Beam filesystem through ``beam_dp.io.keys``; default None).
        domain: the noise domain, a non-empty string naming one transform instance of one job. Default None:
            a beam_dp transform binds it to its full pipeline label when applied and refuses one already
            claimed in the pipeline; set it to keep a transform's noise when renamed, or to separate two jobs
            that reuse one key with the same labels.
        secret: a Secret Manager secret version ``projects/P/secrets/S/versions/V`` holding the key (read by
            ``beam_dp.io.keys``; default None).
    """

    env_var: str | None = KEY_ENV_VAR
    key_file: str | None = None
    domain: str | None = None
    # a Secret Manager secret version ``projects/P/secrets/S/versions/V`` (read by beam_dp.io.keys)
    secret: str | None = None

    def __post_init__(self) -> None:
        if self.domain is not None and (not isinstance(self.domain, str) or not self.domain):
            raise ValueError(f"NoiseKey.domain must be a non-empty string or None, got {self.domain!r}")

    def load(self, fetch: Callable[[str | None, str | None, str | None], NoiseSource] | None = None,
             binding: str | None = None) -> NoiseSource:
        """The noise source of this key's domain under ``binding`` (read on the worker; never pickled).

        ``fetch(env_var, key_file, secret)`` reads the key where the engine can: the Beam shells pass
        ``beam_dp.io.keys.load_noise_source`` (files on any Beam filesystem, Secret Manager). Without it
        the key comes from a local file or the env var. ``binding``: the calibration the noise is bound
        to (``calibration_binding(params)``; transforms load through :func:`noise_source_of`, which
        passes it); None is the legacy derivation that ignores the parameters (``NoiseSource.for_domain``)."""
        if self.domain is None:
            raise ValueError(
                "this noise key has no noise domain: apply the params through a beam_dp transform (which "
                "binds its full label) or set NoiseKey(domain=...)"
            )
        if fetch is not None:
            return fetch(self.env_var, self.key_file, self.secret).for_domain(self.domain, binding)
        if self.secret:
            raise ValueError("a Secret Manager noise key is read by the Beam key loader (beam_dp.io.keys)")
        return NoiseSource.from_config(self.env_var, self.key_file).for_domain(self.domain, binding)


def noise_source_of(params: Any, fetch: Callable[[str | None, str | None, str | None], NoiseSource] | None = None
                    ) -> NoiseSource:
    """The noise source a transform draws from: its key's domain bound to its calibration
    (``calibration_binding(params)``, :mod:`beam_dp.core.noise_binding`), so a changed parameter under
    one key and domain draws independent noise and only an identical run reproduces it."""
    return params.noise_key.load(fetch, calibration_binding(params))


def legacy_noise_of(params: Any, fetch: Callable[[str | None, str | None, str | None], NoiseSource] | None = None
                    ) -> Callable[[], NoiseSource]:
    """A loader (read once, on first use) of the legacy noise source of ``params``' domain, the derivation
    that ignores the parameters: only for keys whose state was written before the binding
    (``StepDriver.legacy_noise``), which continue with the draws their earlier releases used."""
    loaded: list[NoiseSource] = []

    def load() -> NoiseSource:
        if not loaded:
            loaded.append(params.noise_key.load(fetch, None))
        return loaded[0]

    return load


def check_streams(params: Any) -> None:
    """Validate ``params.streams`` (``beam_dp.core.limits.check_streams``: None, or a non-empty tuple of
    non-empty UTF-8 strings) and store it as a de-duplicated tuple."""
    object.__setattr__(params, "streams", limits.check_streams(params.streams))


def check_schedule(clock: StepClock | None, block_size: Any, allowed_lateness: Any = 0.0) -> None:
    """Exactly one of ``clock`` and ``block_size``; ``block_size`` an integer >= 1; a grace in
    ``[0, MAX_ABS_SECONDS]`` seconds (event time only)."""
    if (clock is None) == (block_size is None):
        raise ValueError("give exactly one of clock (event-time steps) or block_size (count steps)")
    if block_size is not None:
        limits.check_count("block_size", block_size)
    limits.check_number("allowed_lateness", allowed_lateness, 0.0, limits.MAX_ABS_SECONDS)  # seconds
    if allowed_lateness and clock is None:
        raise ValueError("allowed_lateness applies to event-time steps (a clock) only")


def check_stream_groups(params: Any, mechanism: Any) -> None:
    """``params.stream_groups`` (None, or groups in ``[1, 2^20]``) needs event-time steps, no restored
    per-stream states and a mechanism that steps groups (``GroupSteppedSum``)."""
    if params.stream_groups is None:
        return
    from beam_dp.mechanisms.base import GroupSteppedSum
    from beam_dp.mechanisms.stream_groups import MAX_STREAM_GROUPS

    limits.check_count("stream_groups", params.stream_groups, 1, MAX_STREAM_GROUPS)
    if params.clock is None:
        raise ValueError("stream_groups needs event-time steps (a clock): count steps are per stream")
    if params.restore_states is not None:
        raise ValueError("stream_groups cannot restore per-stream states: leave stream_groups=None")
    if not isinstance(mechanism, GroupSteppedSum):
        raise ValueError(
            f"stream_groups needs a mechanism that steps groups of streams; {mechanism.name} does not "
            "(every counter and the window tree do; a granularity wraps them in snapping, which does not)")


def check_idle(params: Any, mechanism: Any) -> None:
    """``params.idle_steps`` k and ``params.idle_threshold`` τ (both or neither): a stream ends after its
    own step ``t >= k`` at which ``||release_t - release_{t-k}||_2 <= τ`` (the driver's idle rule, decided
    from released values only). Needs event-time steps, streams keyed alone (``stream_groups=None``: a
    group ends as a whole) and a prefix-sum mechanism (``ContinualSumMechanism``: every counter and the
    window tree release running totals, whose change over k steps is the noisy sum of those steps); a
    mechanism that releases something else has no such rule and is refused."""
    steps, threshold = getattr(params, "idle_steps", None), getattr(params, "idle_threshold", None)
    if steps is None and threshold is None:
        return
    if steps is None or threshold is None:
        raise ValueError("give both idle_steps and idle_threshold (in the releases' units), or neither")
    limits.check_count("idle_steps", steps, 1, limits.MAX_STEPS)
    limits.check_number("idle_threshold", threshold, 0.0, limits.MAX_SCALE)
    if params.clock is None:
        raise ValueError("idle_steps needs event-time steps (a clock): count steps only pass with data")
    if getattr(params, "stream_groups", None) is not None:
        raise ValueError("idle_steps ends one stream: key by stream (stream_groups=None); a group ends as a whole")
    from beam_dp.mechanisms.base import ContinualSumMechanism

    if not isinstance(mechanism, ContinualSumMechanism):
        raise ValueError(f"idle_steps is defined for prefix sums (a stream's running total); {mechanism.name} "
                         "releases something else")


@dataclass(frozen=True)
class StepParams:
    """Base of the continual transforms' params: steps, declared streams, noise key, restore, grid.

    Args:
        clock: event-time steps (:class:`~beam_dp.core.StepClock`; a batch replay needs its public ``end``).
            Exactly one of ``clock`` and ``block_size``; default None.
        block_size: count steps: blocks of ``block_size`` (>= 1) contributions in arrival order; an
            incomplete final block is never released. Default None.
        streams: stream ids (non-empty UTF-8 strings, de-duplicated) that release from step 1, data or not;
            default None. Public, like every stream id.
        noise_key: where workers read the secret noise key, and the noise domain (:class:`NoiseKey`; default
            ``NoiseKey()``: the env var ``KEY_ENV_VAR``).
        restore_states: ``(stream, encoded mechanism state)`` pairs to resume streams from (default None). A
            state holds un-noised sums: it is as sensitive as the raw data.
        granularity: release on the grid ``g = 2^k >= granularity`` (> 0, the values' units) with exact
            arithmetic and data-independent noise (``SnappedSum``), closing the floating-point channel; the
            mechanism is calibrated for the clip bound ``R + sqrt(dim)*g``. Default None: raw floats.
        budget: this transform's share of its job's budget (``JobBudget(...).split(...)[name]``, pass
            ``**share.params()``): refused at construction unless the mechanism fits it. Default None.
        allowed_lateness: the grace in seconds (event time only; default 0): a step closes when the watermark
            passes its end plus the grace, later data for it is dead-lettered whole (reason ``late``).
    """

    clock: StepClock | None = None
    block_size: int | None = None
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    # Encoded mechanism states to resume streams from (stream -> mechanism.encode_state(...)), e.g. a
    # snapshot taken mid-stream. A snapshot holds un-noised sums: it is as sensitive as the raw data.
    restore_states: tuple[tuple[str, bytes], ...] | None = None
    # Release on the grid g = 2^k (the power of two >= granularity) with exact arithmetic and
    # data-independent noise (beam_dp.mechanisms.sums.snapping.SnappedSum): closes the floating-point channel
    # of Mironov 2012; the mechanism is calibrated for the clip bound R + sqrt(dim)*g (see docs/reliability.md).
    granularity: float | None = None
    # this transform's share of its job's budget (JobBudget(...).split(...)[name]; pass **share.params()):
    # refused at construction unless the mechanism fits it; releases then report the job's spend
    budget: BudgetShare | None = None
    allowed_lateness: float = 0.0

    def _validate_steps(self) -> None:
        check_schedule(self.clock, self.block_size, self.allowed_lateness)
        limits.check_clock(self.clock, self.streams)
        if self.granularity is not None:
            limits.check_number("granularity", self.granularity, 0.0, limits.MAX_SCALE, low_open=True)
        if self.restore_states is not None:
            states = dict(self.restore_states)
            if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in states.items()):
                raise ValueError("restore_states must be (stream, encoded state bytes) pairs")
            object.__setattr__(self, "restore_states", tuple(sorted(states.items())))
        check_streams(self)

    @property
    def event_time(self) -> bool:
        return self.clock is not None
