"""Apache Beam adapter: the generic stateful DoFn and the public transforms."""

from beam_dp.beam.events import DeadLetter, EventBatch, Reason
from beam_dp.beam.params import ContinualCountParams, ContinualSumParams, NoiseKey, WindowedSumParams
from beam_dp.beam.transforms import ContinualCount, ContinualOutputs, ContinualSum, WindowedSum

__all__ = [
    "ContinualCount",
    "ContinualCountParams",
    "ContinualOutputs",
    "ContinualSum",
    "ContinualSumParams",
    "DeadLetter",
    "EventBatch",
    "NoiseKey",
    "Reason",
    "WindowedSum",
    "WindowedSumParams",
]
