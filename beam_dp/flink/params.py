"""Parameters of a Flink release job: the shared step-params contract plus a mechanism factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from beam_dp.steps.params import StepParams, check_idle, check_stream_groups

__all__ = ["FlinkReleaseParams", "check_timers"]


def check_timers(params: Any) -> None:
    """Refuse (``ValueError``) a schedule Flink timers cannot keep: ``params.clock``'s step start and period
    and ``params.allowed_lateness`` must be whole milliseconds."""
    clock = getattr(params, "clock", None)
    if clock is not None and (clock.period_micros % 1000 or clock.start_micros % 1000):
        raise ValueError("Flink timers are in milliseconds: the step start and period must be whole ms")
    if round(getattr(params, "allowed_lateness", 0.0) * 1_000_000) % 1000:
        raise ValueError("Flink timers are in milliseconds: allowed_lateness must be whole ms")


@dataclass(frozen=True)
class FlinkReleaseParams(StepParams):
    """What :class:`~beam_dp.flink.job.ContinualReleaseFunction` needs: :class:`~beam_dp.steps.params.StepParams`
    (schedule, declared streams, grace, noise key location, restore) and ``build``, a picklable
    zero-argument factory of the mechanism (e.g. ``functools.partial(make_tree_sum, dim=2, epsilon=1.0,
    clip_bound=1.0)``), called on each worker. ``noise_key.domain`` is bound when the function joins a
    job (:func:`~beam_dp.flink.job.release_stream`: its ``uid`` unless set here; no default domain, see
    :mod:`beam_dp.flink.domains`). Flink timers are in milliseconds, so the step start, the period and
    the grace must be whole milliseconds. A Beam params object of the continual sums works in its place.
    ``stream_groups``: key the function by this many groups of streams (event time, a mechanism that
    steps groups; see ``beam_dp.mechanisms.stream_groups``); None keys by stream. ``idle_steps`` /
    ``idle_threshold``: the idle rule of a prefix sum, as on ``ContinualSumParams``. ``step_records``: one
    release record per key and step (the step's JSON rows joined by newlines: a file sink writes the same
    lines) instead of one per row (a Kafka topic's records).
    """

    build: Callable[[], Any] | None = None
    stream_groups: int | None = None
    idle_steps: int | None = None
    idle_threshold: float | None = None
    step_records: bool = False

    def __post_init__(self) -> None:
        if not callable(self.build):
            raise ValueError("build must be a zero-argument factory of the mechanism")
        self._validate_steps()
        check_timers(self)
        mechanism = self.build()  # invalid privacy parameters fail here, before a job is submitted
        if self.stream_groups is not None:
            check_stream_groups(self, mechanism)
        check_idle(self, mechanism)

    def build_mechanism(self) -> Any:
        return self.build()
