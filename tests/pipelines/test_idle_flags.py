"""``--idle-steps`` / ``--idle-threshold`` on continual_stats (pipelines/spec.py): they reach the sum's
params (keyed by stream: a stream ends alone), and a half-given rule is a one-line usage error."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import continual_stats

STREAMING = ["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=2",
             "--start=0", "--period=10", "--window=4"]


def test_the_flags_set_the_sum_s_idle_rule_and_key_it_by_stream(tmp_path):
    job = continual_stats.plan(PipelineOptions(STREAMING + ["--idle-steps=6", "--idle-threshold=0.5",
                                                            f"--output={tmp_path}"]))
    assert (job.params["sum"].idle_steps, job.params["sum"].idle_threshold) == (6, 0.5)  # parsed exactly
    assert job.params["windowed"].idle_steps == 6  # the windowed sum's releases are prefix sums too
    assert job.params["sum"].stream_groups is None and job.params["windowed"].stream_groups is None
    plain = continual_stats.plan(PipelineOptions(STREAMING + [f"--output={tmp_path}"]))
    assert plain.params["sum"].idle_steps is None and plain.params["sum"].stream_groups == 256


def test_idle_steps_without_a_threshold_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        continual_stats.main(STREAMING + ["--idle-steps=6", f"--output={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "idle_threshold" in err
