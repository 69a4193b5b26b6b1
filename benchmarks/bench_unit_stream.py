"""Benchmark: the streaming unit stage's per-contribution cost. Run by hand (not a test):

    OMP_NUM_THREADS=1 python benchmarks/bench_unit_stream.py [--contributions 20000] [--units 2000]

Feeds ``--contributions`` contributions (one value each, d = 1) of ``--units`` units to ``--streams``
streams over ``--steps`` one-second steps, in step order, through what the Beam and Flink unit stages do
per element: decode the unit's state, :meth:`~beam_dp.core.unit_steps.UnitSteps.add` (fold the closed
steps, re-bound the open ones, the deltas), encode the state, its timer. The watermark trails by one
step, so each unit holds up to two open steps. Reports contributions per CPU second (one core).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beam_dp.core.clock import StepClock  # noqa: E402
from beam_dp.core.unit_steps import Contribution, UnitSteps  # noqa: E402
from beam_dp.core.units import UnitBounds, UnitKeys  # noqa: E402


def contributions_per_second(n: int, units: int, streams: int, steps: int, bounds: UnitBounds, seed: int = 0) -> float:
    """Contributions per CPU second of the per-element unit step logic on ``n`` random contributions."""
    rng = np.random.default_rng(seed)
    logic = UnitSteps(bounds, UnitKeys(bytes(range(32))), 1.0, StepClock(start=0, period=1))
    unit = rng.integers(0, units, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    step = np.sort(rng.integers(1, steps + 1, n))
    stream = [f"stream-{j}" for j in rng.integers(0, streams, n)]
    value = rng.normal(0.0, 0.5, n)
    state: dict[int, bytes] = {}
    cpu = time.process_time()
    for i in range(n):
        key = int(unit[i])
        added = logic.add(logic.state(state.get(key)), unit[i], Contribution(int(step[i]), stream[i], value[i:i + 1]),
                          max(1, int(step[i]) - 1))
        state[key] = added.state.encode()
        logic.timer(added.state)
    return n / (time.process_time() - cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contributions", type=int, default=20_000)
    parser.add_argument("--units", type=int, default=2_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--max-unit-steps", type=int, default=16)
    parser.add_argument("--max-streams-per-step", type=int, default=2)
    parser.add_argument("--max-contributions-per-step", type=int, default=4)
    args = parser.parse_args(argv)
    bounds = UnitBounds(args.max_streams_per_step, args.max_contributions_per_step, args.max_unit_steps)
    rate = contributions_per_second(args.contributions, args.units, args.streams, args.steps, bounds)
    print(f"{args.contributions:,} contributions of {args.units:,} units, {args.streams} streams x {args.steps} steps "
          f"(k = {args.max_unit_steps}, m = {args.max_streams_per_step}, c = {args.max_contributions_per_step}): "
          f"{rate:,.0f} contributions/s (CPU, one core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
