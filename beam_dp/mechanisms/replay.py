"""Drive a continual-sum mechanism over an in-memory event table, without any engine.

This is the reference the Beam adapter must agree with (same steps, same clipping, same noise
keys) and the "pure mechanism loop" of the benchmarks. Vectorised: one clip-and-group pass over
all events, then one ``step`` per stream per step.
"""

from __future__ import annotations

import numpy as np

from beam_dp.core.clock import StepClock
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism

__all__ = ["replay_event_time"]


def replay_event_time(
    mechanism: ContinualSumMechanism,
    stream_ids: np.ndarray,
    timestamps: np.ndarray,
    values: np.ndarray,
    clock: StepClock,
    noise: NoiseSource,
    streams: tuple[str, ...] | None = None,
) -> dict[str, list[Release]]:
    """Releases per stream for steps ``1..clock.last_step`` of valid, in-schedule events.

    ``timestamps`` in seconds; events outside the schedule or of undeclared streams are ignored
    (the adapter dead-letters them). ``streams`` declares streams that release even without data.
    """
    last = clock.last_step
    if last is None:
        raise ValueError("replay needs a clock with a public end")
    stream_ids = np.asarray(stream_ids).astype(str)
    micros = np.round(np.asarray(timestamps, dtype=np.float64) * 1e6).astype(np.int64)
    keep = clock.classify_micros(micros) == 0
    if streams is not None:
        keep &= np.isin(stream_ids, np.asarray(streams, dtype=str))
    names, stream_idx = np.unique(stream_ids[keep], return_inverse=True)
    steps = clock.step_of_micros(micros[keep])
    groups = stream_idx.astype(np.int64) * last + (steps - 1)
    sums, counts, clipped = mechanism.clip_and_sum_groups(np.asarray(values)[keep], groups, len(names) * last)
    all_streams = sorted(set(names.tolist()) | set(streams or ()))
    out: dict[str, list[Release]] = {}
    for stream in all_streams:
        row = np.searchsorted(names, stream)
        has_data = row < len(names) and names[row] == stream
        state = mechanism.init_state(stream)
        releases: list[Release] = []
        for step in range(1, last + 1):
            g = row * last + step - 1
            block = ClippedSum(sums[g], int(counts[g]), int(clipped[g])) if has_data else None
            state, rel = mechanism.step(state, block, noise)
            releases.extend(rel)
        out[stream] = releases
    return out
