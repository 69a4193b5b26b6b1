"""Real local Flink jobs (PyFlink MiniCluster) over the step driver. Needs .venv-flink (``make flink-test``);
skipped in the main venv. Each job costs several seconds of start-up, so there are three."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from beam_dp.core import StepClock  # noqa: E402
from beam_dp.flink.blocks import file_splits  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, block_events, local_environment, release_stream, to_event  # noqa: E402
from beam_dp.flink.params import FlinkReleaseParams  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402
from beam_dp.steps.driver import END_RUNG  # noqa: E402
from tests.flink.cases import (  # noqa: E402
    BAD,
    BUILD,
    CLOCK,
    DOMAIN,
    STREAMS,
    assert_rows_equal,
    csv_lines,
    entry_args,
    expected_rows,
    good_events,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _run(params, events, parallelism=2, replay=True, csv=None):
    """The job's release rows and dead letters; with ``csv`` (a path) ``events`` go through that file
    and the block input (``block_events``), else one record each (``from_collection``)."""
    env = local_environment(parallelism, replay=replay)
    if csv is None:
        source, parse_dead = env.from_collection([to_event(*e) for e in events], type_info=EVENT_TYPE), None
    else:
        csv.write_text(csv_lines(events))
        source, parse_dead = block_events(env, file_splits(str(csv)), params)
    releases, dead = release_stream(env, source, params, uid=DOMAIN)
    dead = dead if parse_dead is None else dead.union(parse_dead)
    tagged = releases.map(lambda j: "release\t" + j).union(dead.map(lambda j: "dead\t" + j))
    with tagged.execute_and_collect() as results:
        outputs = [r.split("\t", 1) for r in results]
    return ([json.loads(j) for kind, j in outputs if kind == "release"],
            [json.loads(j) for kind, j in outputs if kind == "dead"])


def _beam_path(tmp_path) -> dict:
    """The Beam path's outputs on the same events and key, from the main venv (Beam 2.77; this venv's
    PyFlink pins an older Beam): ``make flink-test`` builds it first."""
    python = ROOT / ".venv" / "bin" / "python"
    assert python.exists(), "the main venv (.venv) runs the Beam side: `make install-test` first"
    out = tmp_path / "beam.json"
    subprocess.run([str(python), "-m", "tests.flink.beam_reference", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    return json.loads(out.read_text())


def test_parallelism_2_and_the_beam_path_equal_the_pure_replay_and_bad_rows_are_dead_letters(tmp_path):
    """The same events (good and bad rows) and key through Flink at parallelism 2 and through the Beam
    transform (``ContinualSum`` on the FnApiRunner): each equals the pure replay of the same mechanism
    within float summation tolerance, under its own noise binding (the engines' params are different
    objects, so their noise is independent), and the same dead-letter reasons. Flink reads them as a
    file replay does: CSV lines in blocks (``block_events``)."""
    events = good_events()
    stream = sorted(events + [e for e, _ in BAD], key=lambda e: e[1])
    rows, dead = _run(FlinkReleaseParams(build=BUILD, clock=CLOCK, streams=STREAMS), stream, csv=tmp_path / "in.csv")
    beam = _beam_path(tmp_path)
    assert len(beam["releases"]) == len(STREAMS) * CLOCK.last_step
    assert_rows_equal(beam["releases"], expected_rows(events, binding=beam["binding"]))
    assert_rows_equal(rows, expected_rows(events))
    assert {r["stream"] for r in rows} == set(STREAMS) and max(r["step"] for r in rows) == CLOCK.last_step
    assert sorted(d["reason"] for d in dead) == sorted(d["reason"] for d in beam["dead"]) == sorted(r for _, r in BAD)


def test_a_refusal_at_the_horizon_ends_the_stream_not_the_job():
    build = functools.partial(make_tree_sum, horizon=3, dim=2, epsilon=1.0, clip_bound=1.0)  # 3 of 10 steps
    rows, dead = _run(FlinkReleaseParams(build=build, clock=CLOCK, streams=("a",)), [("a", 1001.0, [0.1, 0.2])])
    assert sorted(r["step"] for r in rows) == [1, 2, 3]
    assert [d["reason"] for d in dead] == ["stream_ended"]  # the stream ends at the horizon


def test_streaming_with_an_open_clock_ends_at_the_end_of_input():
    """Watermark at +infinity with no public end: the job finishes; each stream releases consecutive
    steps from 1 and none after the end rule's step: the first multiple of 16 after the first step the
    last finite watermark (<= the latest event time) had not closed."""
    clock = StepClock(start=CLOCK.start, period=CLOCK.period)
    events = good_events()
    rows, dead = _run(FlinkReleaseParams(build=BUILD, clock=clock), events, replay=False)
    last_event_step = int(clock.step_of(max(e[1] for e in events)))
    for stream in {r["stream"] for r in rows}:
        steps = sorted(r["step"] for r in rows if r["stream"] == stream)
        assert steps == list(range(1, len(steps) + 1)) and steps[-1] <= (last_event_step // END_RUNG + 1) * END_RUNG
    assert {d["reason"] for d in dead} <= {"unclosed"}


MARKER = 987654.321  # a raw value only a dead-lettered line holds


def _entry_args(tmp_path, *extra) -> list[str]:
    return entry_args(tmp_path / "in", tmp_path / "out", *extra)


def test_the_submittable_entry_point_keeps_raw_data_out_of_the_output(tmp_path, capsys):
    """``python -m beam_dp.flink.run`` (what ``flink run --python beam_dp/flink/run.py`` executes) on CSV
    files: releases under --output, dead letters (raw values) only under the default sibling
    ``<output>.private``, checkpoints under ``<output>.checkpoints`` (RocksDB), exact counts only on request."""
    from beam_dp.flink.run import main

    events = good_events(20)
    (tmp_path / "in").mkdir()
    lines = ["a,not-a-time,1,2", "b,1001.0,x,y", f"zz,1002.0,{MARKER!r},0.5"]  # the last: an undeclared stream
    (tmp_path / "in" / "events.csv").write_text(csv_lines(events) + "\n".join(lines) + "\n")
    assert main(_entry_args(tmp_path, "--parallelism", "2", "--checkpoint-ms", "500", "--print-exact-counts")) == 0

    def files(folder):
        return [f for f in sorted((tmp_path / folder).rglob("*")) if f.is_file() and not f.name.startswith(".")
                and f.name != "_beam_dp_manifest.json"]  # the job's manifest (tests/flink/test_flink_manifest.py)

    def read(folder):
        return [json.loads(line) for f in files(folder) for line in f.read_text().splitlines() if line]

    assert_rows_equal(read("out"), expected_rows(events, "continual-sums"))  # counter "tree": BUILD's hybrid tree
    assert sorted(d["reason"] for d in read("out.private")) == ["bad_timestamp", "bad_value", "undeclared_stream"]
    assert any(repr(MARKER) in f.read_text() for f in files("out.private"))
    assert not any(repr(MARKER) in f.read_text() for f in (tmp_path / "out").rglob("*") if f.is_file())
    assert list((tmp_path / "out.checkpoints").iterdir())  # checkpoints went to files, not the JobManager heap
    printed = capsys.readouterr().out
    assert "NOT private" in printed and "23 input lines read, 3 dead letters" in printed


def test_the_entry_point_refuses_raw_data_inside_the_output(tmp_path, capsys):
    from beam_dp.flink.run import main

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text("")  # so that a job that did start would end, not retry
    for flag, inside in (("--dead-letter-output", "out/dead"), ("--checkpoint-dir", "out"),
                         ("--dead-letter-output", ".")):
        with pytest.raises(SystemExit) as exit_:
            main(_entry_args(tmp_path, flag, str(tmp_path / inside)))
        assert exit_.value.code == 2 and "overlaps --output" in capsys.readouterr().err


def test_keyed_by_stream_groups_releases_what_keyed_by_stream_releases():
    """Two groups of streams at parallelism 2 (declared streams as carried items, a group stepped in one
    numpy operation) against the same job keyed by stream: the same rows within summation tolerance."""
    from beam_dp.mechanisms.sums import BLTSum

    build = functools.partial(BLTSum, horizon=CLOCK.last_step, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0,
                              noise="gaussian")
    events = sorted(good_events() + [e for e, _ in BAD], key=lambda e: e[1])
    by_stream, dead_by_stream = _run(FlinkReleaseParams(build=build, clock=CLOCK, streams=STREAMS), events)
    grouped, dead_grouped = _run(FlinkReleaseParams(build=build, clock=CLOCK, streams=STREAMS, stream_groups=2), events)
    assert len(grouped) == len(STREAMS) * CLOCK.last_step
    assert_rows_equal(grouped, sorted(by_stream, key=lambda r: (r["stream"], r["step"])))
    assert sorted(d["reason"] for d in dead_grouped) == sorted(d["reason"] for d in dead_by_stream)
