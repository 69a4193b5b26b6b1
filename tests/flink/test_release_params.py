"""``release_stream`` runs the continual sums of vectors only: another family's params are refused with one
line when the job is built, not with an error on every element. Needs .venv-flink (``make flink-test``)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("pyflink")

from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams  # noqa: E402
from beam_dp.beam.growing_db import GrowingDatabaseParams  # noqa: E402
from beam_dp.core import StepClock  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream, to_event  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from beam_dp.mechanisms.growing_db.universe import Categorical, Universe  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402

CLOCK = StepClock(start=0.0, period=10.0, end=100.0)


@pytest.fixture(scope="module")
def job():
    env = local_environment(1)
    return env, env.from_collection([to_event("a", 1.0, [0.5])], type_info=EVENT_TYPE)


@pytest.mark.parametrize("params", [
    ContinualCountParams(clock=CLOCK),  # a count: its events carry no value to sum
    GrowingDatabaseParams(universe=Universe([Categorical("colour", ("red", "blue"))]), n=8, epsilon=1.0, clock=CLOCK),
], ids=lambda p: type(p).__name__)
def test_another_familys_params_are_refused_when_the_job_is_built(job, params):
    env, events = job
    with pytest.raises(ValueError, match=f"continual sums of vectors .*not {type(params).__name__}$"):
        release_stream(env, events, params, uid=type(params).__name__)


@pytest.mark.parametrize("params", [
    FlinkReleaseParams(build=functools.partial(make_tree_sum, horizon=10, dim=1, epsilon=1.0, clip_bound=1.0),
                       clock=CLOCK),
    ContinualSumParams(dim=1, clock=CLOCK),
    WindowedSumParams(window=4, dim=1, clock=CLOCK),
], ids=lambda p: type(p).__name__)
def test_the_continual_sums_params_are_accepted(job, params):
    env, events = job
    releases, dead = release_stream(env, events, params, uid=type(params).__name__, stamp=False)
    assert releases is not None and dead is not None
