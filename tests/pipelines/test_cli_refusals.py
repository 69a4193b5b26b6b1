"""Issue 25.8: the CLI refuses what the API refuses. The cross-flag rules live in the one params spec
(``pipelines.spec.RULES``, checked before anything runs, so the Flex templates that launch the same
CLI refuse too); each rule is mirrored by an API refusal here, so a rule cannot drift from the API.
Mutant checked: emptying ``RULES["continual_stats"]`` lets ``--delta 0.5`` run (the job reported a
job budget (1, 0.5)) and fails the first test."""

from __future__ import annotations

import argparse

import pytest

from beam_dp.beam import ContinualModelParams, ContinualSumParams, OnlineLearnerParams
from beam_dp.core import StepClock
from pipelines import continual_stats, model_release, online_learning, spec
from tests.pipelines.jobs_helpers import assert_usage_error

pytestmark = pytest.mark.pipeline

SCHEDULE = ["--start=0", "--period=10", "--end=40"]


def test_pure_noise_with_a_delta_is_refused_by_the_cli_as_by_the_api(tmp_path, capsys):
    with pytest.raises(ValueError, match="delta"):
        ContinualSumParams(dim=1, clip_bound=1.0, epsilon=1.0, delta=0.5, noise="gamma", clock=StepClock(0, 10, end=40))
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1,0.5\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", *SCHEDULE, "--delta=0.5"]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv,
                       "--delta must be 0 with --noise gamma", capsys)
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize("job,api", [
    ("continual_stats", lambda d: ContinualSumParams(dim=1, clip_bound=1.0, epsilon=1.0, delta=d, noise="gamma",
                                                     clock=StepClock(0, 10, end=40))),
    ("model_release", lambda d: ContinualModelParams(n_features=2, classes=(0, 1), epsilon=1.0, delta=d,
                                                     noise="gamma", update=4, base=8)),
    ("online_learning", lambda d: OnlineLearnerParams(dim=2, constraint="simplex", epsilon=1.0, delta=d,
                                                      noise="gamma", window=4)),
])
def test_every_rule_mirrors_an_api_refusal(job, api):
    opts = argparse.Namespace(noise="gamma", delta=0.3, learner="online")
    with pytest.raises(ValueError, match="--delta must be 0"):
        spec.validate(job, opts)
    with pytest.raises(ValueError):
        api(0.3)
    api(0.0)  # and the accepted combination is accepted by both
    spec.validate(job, argparse.Namespace(noise="gamma", delta=0.0, learner="online"))
    spec.validate(job, argparse.Namespace(noise="gaussian", delta=0.3, learner="online"))


def test_the_regression_learner_keeps_its_delta():
    spec.validate("online_learning", argparse.Namespace(noise="gamma", delta=1e-6, learner="regression"))


def test_model_release_and_online_learning_refuse_pure_noise_with_a_delta(tmp_path, capsys):
    (tmp_path / "m.csv").write_text("stream_id,x_0,label\na,0.5,0\n")
    argv = [f"--input={tmp_path / 'm.csv'}", f"--output={tmp_path / 'out'}", "--classes=0,1", "--delta=0.1"]
    assert_usage_error(model_release.main, "python -m pipelines.model_release", argv, "--noise gamma", capsys)
    (tmp_path / "r.csv").write_text("stream_id,x_0,label\na,0.5,1\n")
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={tmp_path / 'out'}", "--delta=0.1"]
    assert_usage_error(online_learning.main, "python -m pipelines.online_learning", argv, "--noise gamma", capsys)
