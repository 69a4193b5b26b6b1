"""Parameters of a Flink release job: the same contract as the Beam adapter's params objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from beam_dp.core.clock import StepClock
from beam_dp.core.noise import KEY_ENV_VAR, NoiseSource

__all__ = ["FlinkReleaseParams"]


@dataclass(frozen=True)
class FlinkReleaseParams:
    """What :class:`~beam_dp.flink.job.ContinualReleaseFunction` needs.

    ``build``: a picklable zero-argument factory of the mechanism (e.g. ``functools.partial(
    make_tree_sum, dim=2, epsilon=1.0, clip_bound=1.0)``); it is called on each worker. Steps come
    from exactly one of ``clock`` (event-time steps, closed by event-time timers; a bounded input
    needs its public ``end``) or ``block_size`` (count steps). ``streams`` declares streams that
    release from step 1 whether or not they see data. The noise key is read on the workers from
    ``key_file`` or the env var ``key_env``; only those locations travel with the job.

    Any object with ``build_mechanism()``, ``clock``, ``block_size``, ``streams`` and a
    ``noise_key.load()`` (the Beam params objects) works in its place.
    """

    build: Callable[[], Any]
    clock: StepClock | None = None
    block_size: int | None = None
    streams: tuple[str, ...] | None = None
    key_env: str | None = KEY_ENV_VAR
    key_file: str | None = None
    # the noise domain of this release function (one per operator of a job): every draw is keyed by
    # (key, domain, stream, purpose, index), so two operators under one key never share noise
    domain: str = "flink/ContinualRelease"

    def __post_init__(self) -> None:
        if (self.clock is None) == (self.block_size is None):
            raise ValueError("give exactly one of clock (event-time steps) or block_size (count steps)")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.clock is not None and self.clock.period_micros % 1000:
            raise ValueError("Flink timers are in milliseconds: the step period must be a whole number of ms")
        if self.streams is not None:
            object.__setattr__(self, "streams", tuple(dict.fromkeys(self.streams)))
        self.build()  # invalid privacy parameters fail here, before a job is submitted

    def build_mechanism(self) -> Any:
        return self.build()

    @property
    def noise_key(self) -> "FlinkReleaseParams":
        return self

    def load(self) -> NoiseSource:
        return NoiseSource.from_config(self.key_env, self.key_file).for_domain(self.domain)
