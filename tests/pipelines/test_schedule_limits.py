"""Issue 25.4: the jobs refuse a schedule above the public size caps with one line and exit 2 (before
any pipeline starts), and --max-steps / --max-stream-steps raise the caps."""

from __future__ import annotations

import pytest

from pipelines import continual_stats, growing_db_queries, online_learning
from tests.pipelines.jobs_helpers import assert_usage_error

pytestmark = pytest.mark.pipeline

HUGE = ["--start=0", "--period=1e-6", "--end=1e12"]


def test_continual_stats_refuses_1e18_steps(tmp_path, capsys):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1,0.5\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", *HUGE]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv,
                       "1,000,000,000,000,000,000 steps per stream", capsys)
    argv = [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", "--start=0", "--period=10",
            "--end=1e6", "--streams=a,b,c", "--max-stream-steps=1000"]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv,
                       "300,000 stream-steps, above the limit of 1,000", capsys)


def test_growing_db_and_online_learning_refuse_1e18_steps(tmp_path, capsys):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,colour\na,1,red\n")
    (tmp_path / "q.csv").write_text("stream_id,query_id,t,indices\na,q,1,[0]\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--queries={tmp_path / 'q.csv'}", f"--output={tmp_path / 'out'}",
            '--universe={"colour": ["red", "blue"]}', "--n=1", *HUGE]
    assert_usage_error(growing_db_queries.main, "python -m pipelines.growing_db_queries", argv, "--max-steps", capsys)
    (tmp_path / "r.csv").write_text("stream_id,timestamp,x_0,label\na,1,0.5,1\n")
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={tmp_path / 'out'}", "--learner=regression", *HUGE]
    assert_usage_error(online_learning.main, "python -m pipelines.online_learning", argv, "--max-steps", capsys)
