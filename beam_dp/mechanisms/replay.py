"""Drive a continual-sum mechanism over an in-memory event table, without any engine.

This is the reference the Beam adapter must agree with (same steps, same clipping, same noise
keys) and the "pure mechanism loop" of the benchmarks. Events are sorted by step once; each step is
one vectorised clip-and-sum over that step's events, then one group step per group of streams
(:class:`~beam_dp.mechanisms.base.GroupSteppedSum`; other mechanisms step stream by stream). Each
step's releases go to a ``sink`` as they are made, so memory is the events plus one step's state and
releases (flat in the number of steps). Noise cells are keyed per stream: releases do not depend on
the group size. :func:`replay_learner` does the same for the online learners, whose streams take one
record per step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from beam_dp.core.clock import StepClock
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism, GroupSteppedSum
from beam_dp.mechanisms.online.learners import WDPCOCOL, WDPCOCOP

__all__ = ["replay_batches", "replay_event_time", "replay_learner"]


def replay_batches(
    mechanism: ContinualSumMechanism,
    stream_ids: np.ndarray,
    timestamps: np.ndarray,
    values: np.ndarray,
    clock: StepClock,
    noise: NoiseSource,
    sink: Callable[[ReleaseBatch], None],
    streams: tuple[str, ...] | None = None,
    group_size: int | None = None,
) -> None:
    """Release every stream at steps ``1..clock.last_step``, step by step, into ``sink``.

    ``timestamps`` in seconds; events outside the schedule or of undeclared streams are ignored
    (the adapter dead-letters them). ``streams`` declares streams that release even without data.
    Streams (sorted by name) are stepped in groups of ``group_size`` (default: one group); ``sink``
    gets one :class:`ReleaseBatch` per group and step, in step order.
    """
    last = clock.last_step
    if last is None:
        raise ValueError("replay needs a clock with a public end")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size!r}")
    stream_ids = np.asarray(stream_ids).astype(str)
    micros = np.round(np.asarray(timestamps, dtype=np.float64) * 1e6).astype(np.int64)
    keep = clock.classify_micros(micros) == 0
    if streams is not None:
        keep &= np.isin(stream_ids, np.asarray(streams, dtype=str))
    all_streams = np.unique(np.concatenate([stream_ids[keep], np.asarray(streams or (), dtype=str)]))
    rows = np.searchsorted(all_streams, stream_ids[keep])
    steps = clock.step_of_micros(micros[keep])
    order = np.argsort(steps, kind="stable")
    kept_values = np.asarray(values)[keep][order]
    rows, bounds = rows[order], np.searchsorted(steps[order], np.arange(1, last + 2))
    names = all_streams.tolist()
    size = group_size or max(len(names), 1)
    spans = [(lo, min(lo + size, len(names))) for lo in range(0, len(names), size)]
    grouped = isinstance(mechanism, GroupSteppedSum)
    states = [mechanism.init_group(names[lo:hi]) for lo, hi in spans] if grouped else [mechanism.init_state(s) for s in names]
    for step in range(1, last + 1):
        lo_ev, hi_ev = bounds[step - 1], bounds[step]
        sums, counts, clipped = mechanism.clip_and_sum_groups(
            kept_values[lo_ev:hi_ev].reshape(-1, mechanism.dim), rows[lo_ev:hi_ev], len(names)
        )
        if grouped:
            for g, (lo, hi) in enumerate(spans):
                states[g], batch = mechanism.step_group(states[g], sums[lo:hi], counts[lo:hi], noise)
                sink(batch)
            continue
        for i in range(len(names)):
            states[i], releases = mechanism.step(states[i], ClippedSum(sums[i], int(counts[i]), int(clipped[i])), noise)
            for r in releases:
                sink(ReleaseBatch((r.stream,), r.step, r.mechanism, r.value[None, :], r.epsilon_spent, r.delta_spent, r.meta,
                                  noise=r.noise))


def replay_event_time(
    mechanism: ContinualSumMechanism,
    stream_ids: np.ndarray,
    timestamps: np.ndarray,
    values: np.ndarray,
    clock: StepClock,
    noise: NoiseSource,
    streams: tuple[str, ...] | None = None,
) -> dict[str, list[Release]]:
    """Releases per stream (sorted by name), in step order: :func:`replay_batches` collected in memory."""
    out: dict[str, list[Release]] = {}

    def collect(batch: ReleaseBatch) -> None:
        for release in batch.rows():
            out.setdefault(release.stream, []).append(release)

    replay_batches(mechanism, stream_ids, timestamps, values, clock, noise, collect, streams)
    return dict(sorted(out.items()))


def replay_learner(
    learner: WDPCOCOP | WDPCOCOL,
    streams: tuple[str, ...],
    features: np.ndarray,
    labels: np.ndarray,
    noise: NoiseSource,
    sink: Callable[[ReleaseBatch], None],
    group_size: int | None = None,
) -> None:
    """Step the online learner ``learner`` (WDP-COCOP/COCOL) over ``T`` steps of ``S`` streams, one record
    per stream and step: ``features (T, S, d)``, ``labels (T, S)`` (``[t, i]`` is stream ``i``'s record
    at step ``t + 1``). The streams, in the given order, are stepped in groups of ``group_size``
    (default: one group), one ``step_group`` per group and step; ``sink`` gets each
    :class:`ReleaseBatch` in step order. A bad record raises ``ValueError`` (``record``'s reasons)."""
    features, labels = np.asarray(features, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if features.ndim != 3 or features.shape[1:] != (len(streams), learner.dim) or labels.shape != features.shape[:2]:
        raise ValueError(f"expected features (T, {len(streams)}, {learner.dim}) and labels (T, {len(streams)}), "
                         f"got {features.shape} and {labels.shape}")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size!r}")
    size = group_size or max(len(streams), 1)
    spans = [(lo, min(lo + size, len(streams))) for lo in range(0, len(streams), size)]
    groups = [learner.init_group(streams[lo:hi]) for lo, hi in spans]
    for t in range(features.shape[0]):
        for g, (lo, hi) in enumerate(spans):
            groups[g], batch = learner.step_group(groups[g], features[t, lo:hi], labels[t, lo:hi], noise)
            sink(batch)
