"""Apache Beam adapter: the generic stateful DoFn and the public transforms."""

from beam_dp.beam.erm import (
    ContinualModelRelease,
    ContinualModelParams,
    MultiResolutionRelease,
    MultiResolutionParams,
    SlidingWindowModelRelease,
    SlidingWindowModelParams,
)
from beam_dp.steps.events import DeadLetter, EventBatch, Reason
from beam_dp.beam.learners import (
    IncrementalRegression,
    IncrementalRegressionParams,
    OnlineLearner,
    OnlineLearnerParams,
)
from beam_dp.beam.lifelong import LifelongLearner, LifelongParams
from beam_dp.beam.growing_db import GrowingDatabaseOutputs, GrowingDatabaseParams, GrowingDatabaseQueries
from beam_dp.beam.params import ContinualCountParams, ContinualSumParams, NoiseKey, WindowedSumParams
from beam_dp.beam.transforms import ContinualCount, ContinualOutputs, ContinualSum, WindowedSum

__all__ = [
    "ContinualModelRelease",
    "ContinualModelParams",
    "GrowingDatabaseOutputs",
    "GrowingDatabaseParams",
    "GrowingDatabaseQueries",
    "IncrementalRegression",
    "IncrementalRegressionParams",
    "LifelongLearner",
    "LifelongParams",
    "MultiResolutionRelease",
    "MultiResolutionParams",
    "SlidingWindowModelRelease",
    "SlidingWindowModelParams",
    "ContinualCount",
    "ContinualCountParams",
    "ContinualOutputs",
    "ContinualSum",
    "ContinualSumParams",
    "DeadLetter",
    "EventBatch",
    "NoiseKey",
    "OnlineLearner",
    "OnlineLearnerParams",
    "Reason",
    "WindowedSum",
    "WindowedSumParams",
]
