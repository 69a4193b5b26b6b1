"""Engine-neutral steps: the one step driver, its policies and the contracts every engine shares.

Imports neither Apache Beam nor PyFlink (a test checks this): the Beam DoFns and the Flink function
are thin shells over :class:`~beam_dp.steps.driver.StepDriver`.
"""

from beam_dp.steps.coder import KeyState
from beam_dp.steps.driver import RELEASE, SNAPSHOTS, Output, StepDriver
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, EventBatch, Reason
from beam_dp.steps.params import NoiseKey, StepParams, check_schedule, check_streams
from beam_dp.steps.policies import BlockPolicy, GrowingPolicy, TaskPolicy
from beam_dp.steps.schema import RELEASE_SCHEMA, ReleaseRow, release_to_row

__all__ = [
    "BlockPolicy", "DEAD_LETTER", "DeadLetter", "EventBatch", "GrowingPolicy", "KeyState", "NoiseKey", "Output",
    "RELEASE", "RELEASE_SCHEMA", "Reason", "ReleaseRow", "SNAPSHOTS", "StepDriver", "StepParams", "TaskPolicy",
    "check_schedule", "check_streams", "release_to_row",
]
