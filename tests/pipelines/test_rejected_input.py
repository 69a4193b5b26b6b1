"""A run whose input was all, or mostly, rejected does not look like a success: it ends with a warning
counting the rejected rows, labelled as a raw-data count; ``--fail-on-rejected FRACTION`` makes more
than that fraction exit code 3, with the dead letters published (they say why) and the previous
releases kept.

Mutant checked: comparing with ``>=`` instead of ``>`` (or counting the rows of every transform, not
the most one transform saw) fails the boundary and the three-transform cases."""

from __future__ import annotations

import pytest

from pipelines import continual_stats
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters, tree

pytestmark = pytest.mark.pipeline

PROG = "python -m pipelines.continual_stats"
SCHEDULE = ["--start=0", "--period=10", "--end=100"]


def _events(path, good: int, nan: int = 0, wide: int = 0):
    """``good`` rows, ``nan`` rows with a NaN value (rejected by the transforms), ``wide`` rows with a
    field too many (rejected when read)."""
    rows = ([f"s{i % 3},{i},0.5" for i in range(good)] + [f"s{i % 3},{i},nan" for i in range(nan)]
            + [f"s{i % 3},{i},1,2" for i in range(wide)])
    path.write_text("stream_id,timestamp,value\n" + "\n".join(rows) + "\n")
    return path


def test_all_rows_rejected_ends_with_a_raw_data_warning(tmp_path, capsys):
    events = _events(tmp_path / "e.csv", 0, wide=100)
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={events}", f"--output={out}", "--streams=s0,s1,s2", *SCHEDULE]) == 0
    said = capsys.readouterr()
    assert said.err.strip().splitlines()[-1] == (
        f"warning: 100 of 100 input rows were rejected (raw-data count, not private); dead letters under "
        f"{tmp_path / 'out.private'}")
    assert "input rows were rejected" not in said.out  # the summary (stdout) holds public values only


def test_the_count_is_of_rows_not_of_transforms(tmp_path, capsys):
    """Three transforms see the same rows: 5 rejected when read, 5 more by the value transforms."""
    events = _events(tmp_path / "e.csv", 90, nan=5, wide=5)
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={events}", f"--output={out}", "--count", "--window=4", *SCHEDULE]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "warning: 10 of 100 input rows were rejected (raw-data count, not private)")
    assert dead_letters(out)["read:malformed"] == 5


def test_a_clean_input_has_no_warning(tmp_path, capsys):
    assert continual_stats.main([f"--input={_events(tmp_path / 'e.csv', 30)}", f"--output={tmp_path / 'out'}",
                                 *SCHEDULE]) == 0
    assert "warning" not in capsys.readouterr().err


def test_more_rejected_than_the_flag_allows_is_exit_3_and_keeps_the_previous_releases(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [f"--output={out}", *SCHEDULE, "--fail-on-rejected=0.5"]
    assert continual_stats.main([f"--input={_events(tmp_path / 'good.csv', 30)}", *argv]) == 0
    before = tree(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        continual_stats.main([f"--input={_events(tmp_path / 'bad.csv', 40, wide=60)}", *argv])
    assert exc.value.code == 3
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        f"{PROG}: error: 60 of 100 input rows were rejected (raw-data count, not private), more than "
        f"--fail-on-rejected 0.5: this run's releases were not published, its dead letters are under "
        f"{tmp_path / 'out.private'}; the previous output under {out} is kept unchanged"]
    assert tree(out) == before
    assert dead_letters(out)["read:malformed"] == 60  # the dead letters of the refused run
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out", "out.private"]


def test_exactly_the_fraction_passes(tmp_path, capsys):
    events = _events(tmp_path / "e.csv", 50, wide=50)
    assert continual_stats.main([f"--input={events}", f"--output={tmp_path / 'out'}", *SCHEDULE,
                                 "--fail-on-rejected=0.5"]) == 0
    assert "50 of 100 input rows were rejected" in capsys.readouterr().err


@pytest.mark.parametrize("flags, fix", [
    (["--fail-on-rejected=1.5"], "must be a fraction from 0 to 1"),
    (["--fail-on-rejected=0.1", "--streaming", "--source=pubsub", "--pubsub-topic=projects/p/topics/events",
      "--dim=1", "--allow-random-noise-key"], "needs a local batch run"),
])
def test_bad_uses_of_the_flag_are_usage_errors(tmp_path, capsys, flags, fix):
    assert_usage_error(continual_stats.main, PROG, [f"--output={tmp_path / 'out'}", "--start=0", "--period=10",
                                                    *flags], fix, capsys)
