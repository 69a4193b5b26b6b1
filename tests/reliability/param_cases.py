"""Every public params class with small valid settings, the numeric fields a user sets, and the extreme
values the parameter fuzz puts in them (one, two or three fields at a time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from beam_dp.beam import (
    ContinualCountParams,
    ContinualModelParams,
    ContinualSumParams,
    GrowingDatabaseParams,
    IncrementalRegressionParams,
    LifelongParams,
    MultiResolutionParams,
    OnlineLearnerParams,
    SlidingWindowModelParams,
    WindowedSumParams,
)
from beam_dp.core import StepClock
from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe

#: extreme values for every numeric field: zero, signs, subnormals, float limits, non-finite, int64
#: and beyond, wrong types (text, bool, None)
EXTREMES: tuple = (
    0, 0.0, -0.0, -1, -1e-300, 5e-324, 1e-320, 1e-300, 1e-12, 1e-9, 0.5, 1, 2, 3.5, 1e6, 1e12, 1e100, 1e200, 1e308,
    1.7976931348623157e308, math.inf, -math.inf, math.nan, 2**31, 2**53 + 1, 2**62, 2**63, 2**64, 10**30, -(2**63),
    10**400, np.float32(1e38), np.int64(2**62), np.float64(1e-310), True, False, None, "1", "", b"\x80", [1.0],
)

CLOCK = StepClock(start=0, period=10, end=50)
UNIVERSE = Universe([Categorical("colour", ("red", "green")), Bucketed("size", (0, 1, 2))])


def _lifelong(**fields):
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    learner_fields = {k: v for k, v in fields.items() if k != "torch_threads"}
    config = BoundedAGEMConfig(**{**dict(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=4,
                                         task_ids=("t0", "t1"), device="cpu", epsilon=1.0, delta=1e-5, task_size=8),
                                  **learner_fields})
    return LifelongParams(config, torch_threads=fields.get("torch_threads"))


@dataclass(frozen=True)
class ParamsCase:
    name: str
    make: Callable[..., Any]  # make(**overrides) -> params
    fields: tuple[str, ...]  # numeric fields fuzzed


def _with(cls, **base) -> Callable[..., Any]:
    return lambda **overrides: cls(**{**base, **overrides})


CASES = [
    ParamsCase("ContinualSumParams", _with(ContinualSumParams, clock=CLOCK, dim=2),
               ("dim", "epsilon", "clip_bound", "delta", "horizon", "granularity")),
    ParamsCase("ContinualSumParams(gaussian)", _with(ContinualSumParams, clock=CLOCK, dim=2, noise="gaussian", delta=1e-6),
               ("dim", "epsilon", "clip_bound", "delta", "horizon", "granularity")),
    ParamsCase("ContinualSumParams(block_size)", _with(ContinualSumParams, block_size=4, dim=2, counter="tree"),
               ("block_size", "epsilon", "clip_bound", "horizon")),
    ParamsCase("ContinualCountParams", _with(ContinualCountParams, clock=CLOCK), ("epsilon", "delta", "granularity", "horizon")),
    ParamsCase("WindowedSumParams", _with(WindowedSumParams, clock=CLOCK, dim=2, window=4),
               ("dim", "epsilon", "clip_bound", "window", "granularity")),
    ParamsCase("WindowedSumParams(gaussian)", _with(WindowedSumParams, clock=CLOCK, dim=2, window=4, noise="gaussian",
                                                    delta=1e-6), ("epsilon", "clip_bound", "window", "delta")),
    ParamsCase("MultiResolutionParams", _with(MultiResolutionParams, n_features=2, classes=(0, 1), block=4),
               ("n_features", "lam", "epsilon", "clip_bound", "block", "max_level", "granularity")),
    ParamsCase("ContinualModelParams", _with(ContinualModelParams, n_features=2, classes=(0, 1), update=2, base=4),
               ("n_features", "lam", "epsilon", "clip_bound", "update", "base", "base_fraction")),
    ParamsCase("SlidingWindowModelParams", _with(SlidingWindowModelParams, n_features=2, classes=None, window=6, block=2,
                                                 noise="gaussian", delta=1e-6),
               ("n_features", "lam", "epsilon", "delta", "clip_bound", "huber", "window", "block")),
    ParamsCase("OnlineLearnerParams", _with(OnlineLearnerParams, dim=2, constraint="simplex", epsilon=1.0, window=4),
               ("dim", "epsilon", "window", "mu", "delta", "beta")),
    ParamsCase("IncrementalRegressionParams", _with(IncrementalRegressionParams, dim=2, epsilon=1.0, delta=1e-6,
                                                    clock=CLOCK), ("dim", "epsilon", "delta", "horizon", "release_every")),
    ParamsCase("GrowingDatabaseParams", _with(GrowingDatabaseParams, universe=UNIVERSE, n=4, epsilon=1.0, clock=CLOCK),
               ("n", "epsilon", "alpha", "delta", "a", "xi_n", "beta")),
    ParamsCase("GrowingDatabaseParams(bbscheduler)", _with(GrowingDatabaseParams, universe=UNIVERSE, n=4, epsilon=1.0,
                                                           clock=CLOCK, mechanism="bbscheduler"),
               ("n", "epsilon", "delta", "beta", "gamma")),
    ParamsCase("LifelongParams", _lifelong, ("epsilon", "delta", "clip_norm", "memory_uses", "batch_size",
                                             "learning_rate", "input_dim", "torch_threads")),
]
