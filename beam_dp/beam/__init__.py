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
    "IncrementalRegression": "beam_dp.beam.online",
    "IncrementalRegressionParams": "beam_dp.beam.online",
    "OnlineLearner": "beam_dp.beam.online",
    "OnlineLearnerParams": "beam_dp.beam.online",
    "LifelongLearner": "beam_dp.beam.lifelong",
    "LifelongParams": "beam_dp.beam.lifelong",
    "ContinualCount": "beam_dp.beam.sums",
    "ContinualOutputs": "beam_dp.beam.shell.outputs",
    "ContinualSum": "beam_dp.beam.sums",
    "WindowedSum": "beam_dp.beam.sums",
    "ContinualCountParams": "beam_dp.beam.sums",
    "ContinualSumParams": "beam_dp.beam.sums",
    "NoiseKey": "beam_dp.beam.sums",
    "PrivacyUnit": "beam_dp.beam.sums",
    "WindowedSumParams": "beam_dp.beam.sums",
    "DeadLetter": "beam_dp.steps.events",
    "EventBatch": "beam_dp.steps.events",
    "Reason": "beam_dp.steps.events",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
