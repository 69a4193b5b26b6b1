"""The idle-stream case shared by the Beam and Flink tests: the events, the params, and the idle rule
recomputed from release rows alone (what anyone holding only the output can do)."""

from __future__ import annotations

import math

import numpy as np

IDLE_STEPS, IDLE_THRESHOLD, EPSILON = 4, 2.0, 1000.0  # a large epsilon: noise small beside the threshold
PERIOD, STEPS = 10.0, 30  # open clock; the watermark stops at the end of step 30; the end rule: through step 32
# "busy" contributes 1.0 (the clip bound) at every step it releases, so its sum moves by 4 every 4 steps;
# "idle" contributes at steps 1-2 only, then its sum moves by noise alone
EVENTS = ([("busy", PERIOD * (s - 1) + 1.0, [1.0]) for s in range(1, STEPS + 3)]
          + [("idle", 1.0, [1.0]), ("idle", 11.0, [1.0])])


def margin_holds(mechanism) -> bool:
    """The test's two outcomes are 6 noise standard deviations from the threshold: the difference of
    two releases has noise variance <= 2 max_t var(t), and the busy change is IDLE_STEPS (clip bound 1
    per step), so idle streams end and busy ones do not except with probability < 1e-8 (and the test
    key fixes the draw)."""
    std = math.sqrt(2 * max(mechanism.noise_var(t) for t in range(1, STEPS + 1)))
    return IDLE_THRESHOLD >= 6 * std and IDLE_STEPS - IDLE_THRESHOLD >= 6 * std


def idle_end_from_rows(rows) -> int | None:
    """The step after which the idle rule ends this stream's rows (``stream``, ``step``, ``value``),
    recomputed from the rows alone: the first own step t >= k with ||v_t - v_{t-k}||_2 <= tau, v_0 = 0."""
    rows = sorted(rows, key=lambda r: r[0])
    values = [np.zeros(len(rows[0][1]))] + [np.asarray(v, dtype=np.float64) for _, v in rows]
    for t in range(IDLE_STEPS, len(values)):
        if float(np.linalg.norm(values[t] - values[t - IDLE_STEPS])) <= IDLE_THRESHOLD:
            return rows[t - 1][0]
    return None
