"""A whole input rejected for one structural cause (a missing column, a value column of lists) fails
fast with one line and exit code 2, whether the launcher sees it in the first file's header or a
worker meets it in a later file, instead of thousands of dead letters and exit 0."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import continual_stats, growing_db_queries, lifelong, model_release, online_learning
from tests.pipelines.jobs_helpers import assert_usage_error

pytestmark = pytest.mark.pipeline

SCHEDULE = ["--start=0", "--period=10", "--end=40"]


def test_event_file_without_timestamp(tmp_path, capsys):
    (tmp_path / "e.csv").write_text("stream_id,value\na,0.5\n")
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats",
                       [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", *SCHEDULE],
                       "--input has no column 'timestamp'", capsys)


def test_a_later_event_file_without_stream_id_is_caught_at_launch_or_on_the_worker(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.csv").write_text("stream_id,timestamp,value\na,1,0.5\n")
    (tmp_path / "b.csv").write_text("sid,timestamp,value\na,2,0.5\n")
    argv = [f"--input={tmp_path / '*.csv'}", f"--output={tmp_path / 'out'}", *SCHEDULE]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv,
                       f"{tmp_path / 'b.csv'} does not match {tmp_path / 'a.csv'}: it has 'sid'", capsys)
    import pipelines.common  # a file changed after the launch checked it: the worker finds it

    monkeypatch.setattr(pipelines.common, "file_header", lambda path, flag: (["stream_id", "timestamp", "value"], {}))
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv, "structural input error",
                       capsys)


def test_parquet_value_column_of_lists(tmp_path, capsys):
    table = pa.table({"stream_id": ["a", "b"], "timestamp": [1.0, 2.0], "value": [[0.1, 0.2], [0.3, 0.4]]})
    pq.write_table(table, tmp_path / "e.parquet")
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats",
                       [f"--input={tmp_path / 'e.parquet'}", f"--output={tmp_path / 'out'}", *SCHEDULE],
                       "value column 'value' holds lists (list<", capsys)
    # the same file after a good one: the launch check compares the files
    pq.write_table(table, tmp_path / "f.parquet")
    (tmp_path / "a.csv").write_text("stream_id,timestamp,value\na,1,0.5\n")
    argv = [f"--input={tmp_path / '*'}", f"--output={tmp_path / 'out'}", *SCHEDULE]
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats", argv, "does not match", capsys)


def test_growing_db_elements_without_a_universe_field(tmp_path, capsys):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,colour\na,1,red\n")
    (tmp_path / "q.csv").write_text("stream_id,query_id,t,indices\na,q,1,[0]\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--queries={tmp_path / 'q.csv'}", f"--output={tmp_path / 'out'}",
            '--universe={"colour": ["red"], "size": {"range": 3}}', *SCHEDULE]
    assert_usage_error(growing_db_queries.main, "python -m pipelines.growing_db_queries", argv,
                       "--input has no column 'size'", capsys)


@pytest.mark.parametrize("module,flags,missing", [
    (model_release, [], "label"),
    (online_learning, [], "label"),
    (online_learning, ["--learner=regression", *SCHEDULE], "timestamp"),
    (lifelong, ["--tasks=0", "--classes=0,1"], "task_id"),
])
def test_examples_without_a_needed_column(tmp_path, capsys, module, flags, missing):
    header = [c for c in ("stream_id", "task_id", "x_0", "label") if c != missing]
    (tmp_path / "r.csv").write_text(",".join(header) + "\n" + ",".join("1" for _ in header) + "\n")
    if missing == "timestamp":
        (tmp_path / "r.csv").write_text("stream_id,x_0,label\na,0.1,1\n")
    assert_usage_error(module.main, f"python -m pipelines.{module.NAME}",
                       [f"--input={tmp_path / 'r.csv'}", f"--output={tmp_path / 'out'}", *flags],
                       f"--input has no column '{missing}'", capsys)


def test_parquet_value_column_of_structs_is_reported_as_structs(tmp_path, capsys):
    """Issue 25.8: a struct column is named as such (it used to be reported as "holds lists")."""
    table = pa.table({"stream_id": ["a"], "timestamp": [1.0], "value": [{"x": 0.1, "y": 0.2}]})
    pq.write_table(table, tmp_path / "e.parquet")
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats",
                       [f"--input={tmp_path / 'e.parquet'}", f"--output={tmp_path / 'out'}", *SCHEDULE],
                       "value column 'value' holds structs (struct<x: double, y: double>)", capsys)


def test_a_header_with_a_byte_order_mark_is_shown_escaped(tmp_path, capsys):
    """Issue 25.8: the message shows the BOM as \\ufeff, not as an invisible character (where the
    reader keeps it)."""
    from pipelines.rows import require_columns
    from pipelines.runner import UsageError

    with pytest.raises(UsageError) as exc:
        require_columns(["\ufeffstream_id", "timestamp"], ("stream_id", "timestamp"), "--input")
    assert "'\\ufeffstream_id'" in str(exc.value) and "byte-order mark" in str(exc.value)
    assert "\ufeff" not in str(exc.value)
