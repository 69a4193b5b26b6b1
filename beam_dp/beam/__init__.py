"""Apache Beam adapter: the generic stateful DoFn and the public transforms.

Exports are loaded on first use (``beam_dp.lazy``): importing the package imports none of its modules.
"""

from beam_dp.lazy import lazy_exports

_EXPORTS = {
    "ContinualModelRelease": "beam_dp.beam.erm",
    "ContinualModelParams": "beam_dp.beam.erm",
    "MultiResolutionRelease": "beam_dp.beam.erm",
    "MultiResolutionParams": "beam_dp.beam.erm",
    "SlidingWindowModelRelease": "beam_dp.beam.erm",
    "SlidingWindowModelParams": "beam_dp.beam.erm",
    "GrowingDatabaseOutputs": "beam_dp.beam.growing_db",
    "GrowingDatabaseParams": "beam_dp.beam.growing_db",
    "GrowingDatabaseQueries": "beam_dp.beam.growing_db",
    "IncrementalRegression": "beam_dp.beam.learners",
    "IncrementalRegressionParams": "beam_dp.beam.learners",
    "OnlineLearner": "beam_dp.beam.learners",
    "OnlineLearnerParams": "beam_dp.beam.learners",
    "LifelongLearner": "beam_dp.beam.lifelong",
    "LifelongParams": "beam_dp.beam.lifelong",
    "ContinualCount": "beam_dp.beam.transforms",
    "ContinualOutputs": "beam_dp.beam.transforms",
    "ContinualSum": "beam_dp.beam.transforms",
    "WindowedSum": "beam_dp.beam.transforms",
    "ContinualCountParams": "beam_dp.beam.params",
    "ContinualSumParams": "beam_dp.beam.params",
    "NoiseKey": "beam_dp.beam.params",
    "WindowedSumParams": "beam_dp.beam.params",
    "DeadLetter": "beam_dp.steps.events",
    "EventBatch": "beam_dp.steps.events",
    "Reason": "beam_dp.steps.events",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
