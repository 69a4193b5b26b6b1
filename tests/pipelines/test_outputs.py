"""What a job leaves on disk (issue 23 item 4, issue 25 items 1-3): ``--output`` holds the releases
only, raw data goes to ``<output>.private``; a failed, interrupted or concurrent run never damages or
mixes the previous output; bad locations, keys and inputs are one line at launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import continual_stats, growing_db_queries, lifelong, model_release, online_learning
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error, tree, wait_for

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m pipelines.continual_stats"
MARKER = "zq7Xmarker"  # a value only a bad row holds
SCHEDULE = ["--start=0", "--period=10", "--end=40"]


def _holds(folder: Path, text: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _events(path: Path, rows: int = 23, bad: str = "") -> Path:
    path.write_text("stream_id,timestamp,value\n" + "".join(
        f"s{i % 2},{i * 1.5:.1f},{(-1) ** i * 0.25 * (i % 5)}\n" for i in range(rows)) + bad)
    return path


def _examples(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


# -- item 23.4: raw data never under --output ------------------------------------------------------
def _marker_cases(tmp: Path) -> dict[str, tuple]:
    bad = f"a,1,2,3,4,{MARKER}"  # more fields than any header here: malformed, its text is the dead letter
    xy = [f"s,{0.1 * i:.2f},{-0.05 * i:.2f}" for i in range(12)]
    labelled = [f"{r},{'a' if i % 2 else 'b'}" for i, r in enumerate(xy)]
    signed = [f"{r},{1 if i % 2 else -1}" for i, r in enumerate(xy)]
    tasks = [f"s,{t},{0.1 * i:.2f},0.5,{i % 2}" for t in (0, 1) for i in range(8)]
    files = {
        "e": _events(tmp / "e.csv", bad=bad + "\n"),
        "m": _examples(tmp / "m.csv", "stream_id,x_0,x_1,label", labelled + [bad]),
        "o": _examples(tmp / "o.csv", "stream_id,x_0,x_1,label", signed + [bad]),
        "g": _examples(tmp / "g.csv", "stream_id,timestamp,color", [f"s,{i},red" for i in range(1, 30)] + [bad]),
        "q": _examples(tmp / "q.csv", "stream_id,query_id,t,predicate,indices", ['s,q,2,,"[0]"']),
        "l": _examples(tmp / "l.csv", "stream_id,task_id,x_0,x_1,label", tasks + [bad]),
    }
    return {
        "continual_stats": (continual_stats.main, [f"--input={files['e']}", *SCHEDULE]),
        "model_release": (model_release.main, [f"--input={files['m']}", "--classes=a,b", "--update-size=2",
                                               "--base-size=4"]),
        "online_learning": (online_learning.main, [f"--input={files['o']}", "--window=4"]),
        "growing_db_queries": (growing_db_queries.main, [f"--input={files['g']}", f"--queries={files['q']}",
                                                         '--universe={"color": ["red", "blue"]}', "--n=5", *SCHEDULE]),
        "lifelong": (lifelong.main, [f"--input={files['l']}", "--tasks=0,1", "--classes=0,1", "--steps-per-task=1", "--task-size=8",
                                     "--device=cpu", "--torch-threads=1"]),
    }


@pytest.mark.parametrize("job", ["continual_stats", "model_release", "online_learning", "growing_db_queries",
                                 "lifelong"])
def test_a_dead_lettered_value_is_never_under_output_only_under_the_private_folder(job, tmp_path, capsys):
    if job == "lifelong":
        pytest.importorskip("torch")
    main, argv = _marker_cases(tmp_path)[job]
    out = tmp_path / "out"
    assert main([*argv, f"--output={out}", "--print-exact-counts"]) == 0
    said = capsys.readouterr()
    assert not _holds(out, MARKER) and MARKER not in said.out + said.err
    assert _holds(tmp_path / "out.private", MARKER)  # the raw row is kept, in the raw-data folder
    assert "NOT private" in said.out  # the exact counts say what they are
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out", "out.private"]


def test_dead_letter_output_names_the_private_folder_and_must_differ(tmp_path, capsys):
    events = _events(tmp_path / "e.csv", bad=f"a,1,2,{MARKER}\n")
    out, raw = tmp_path / "releases", tmp_path / "raw"
    assert continual_stats.main([f"--input={events}", f"--output={out}", f"--dead-letter-output={raw}",
                                 *SCHEDULE]) == 0
    capsys.readouterr()
    assert _holds(raw, MARKER) and not _holds(out, MARKER) and not (tmp_path / "releases.private").exists()
    assert_usage_error(continual_stats.main, PROG, [f"--input={events}", f"--output={out}",
                                                    f"--dead-letter-output={out}/", *SCHEDULE], "must differ", capsys)


# -- item 25.1: atomic outputs ---------------------------------------------------------------------
def test_a_failing_rerun_keeps_the_previous_output_byte_for_byte(tmp_path, capsys, monkeypatch):
    events = _events(tmp_path / "e.csv")
    argv = [f"--input={events}", f"--output={tmp_path / 'out'}", *SCHEDULE]
    assert continual_stats.main(argv) == 0
    before = {name: tree(tmp_path / name) for name in ("out", "out.private")}
    assert any(n.startswith("sum-") for n in before["out"])
    capsys.readouterr()

    import pipelines.common

    def broken(*args, **kwargs):  # fails after the pipeline wrote everything into staging
        raise RuntimeError("disk full")

    monkeypatch.setattr(pipelines.common, "output_summary", broken)
    with pytest.raises(SystemExit) as exc:
        continual_stats.main([*argv, "--count"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "RuntimeError: disk full" in err and "kept unchanged" in err, err
    assert {name: tree(tmp_path / name) for name in ("out", "out.private")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "out", "out.private"]  # no staging, no lock


def test_a_bad_key_on_rerun_is_one_line_at_launch_and_keeps_the_output(tmp_path, capsys):
    events = _events(tmp_path / "e.csv")
    argv = [f"--input={events}", f"--output={tmp_path / 'out'}", *SCHEDULE]
    assert continual_stats.main(argv) == 0
    before = tree(tmp_path / "out")
    capsys.readouterr()
    for i, (content, fix) in enumerate(((b"", "is empty"), (b"abcd", "has 4 hex digits"),
                                        (None, "is a folder"))):
        key = tmp_path / f"key{i}"
        if content is None:
            key.mkdir()
        else:
            key.write_bytes(content)
        assert_usage_error(continual_stats.main, PROG, [*argv, f"--noise-key-file={key}"], fix, capsys)
        assert tree(tmp_path / "out") == before


def test_a_run_is_refused_while_another_holds_the_folder_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    import json
    import socket

    events = _events(tmp_path / "e.csv")
    argv = [f"--input={events}", f"--output={tmp_path / 'out'}", *SCHEDULE]
    lock = tmp_path / "out.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run": "x"}))  # alive: this process
    assert_usage_error(continual_stats.main, PROG, argv, "held by a running job", capsys)
    assert not (tmp_path / "out").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "run": "x"}))
    assert continual_stats.main(argv) == 0
    assert not lock.exists() and (tmp_path / "out").is_dir()


def test_a_folder_beam_dp_did_not_write_is_never_replaced(tmp_path, capsys):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("years of work")
    assert_usage_error(continual_stats.main, PROG, [f"--input={_events(tmp_path / 'e.csv')}",
                                                    f"--output={tmp_path / 'home'}", *SCHEDULE],
                       "holds files beam_dp did not write ('thesis.tex')", capsys)
    assert (tmp_path / "home" / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("where, fix", [
    ("file", "is a file: give a folder"),
    ("under_file", "is a file, not a folder"),
    ("gs://bucket/out", "pip install 'apache-beam[gcp]'"),
    ("s3://bucket/out", "pip install 'apache-beam[aws]'"),
])
def test_an_unusable_output_location_is_one_line(where, fix, tmp_path, capsys):
    if where.startswith("gs://"):
        try:
            import apache_beam.io.gcp.gcsfilesystem  # noqa: F401
            pytest.skip("the gcp extra is installed here")
        except ImportError:
            pass
    if where.startswith("s3://"):
        try:
            import boto3  # noqa: F401
            pytest.skip("the aws extra is installed here")
        except ImportError:
            pass
    (tmp_path / "f").write_text("x")
    path = {"file": str(tmp_path / "f"), "under_file": str(tmp_path / "f" / "out")}.get(where, where)
    assert_usage_error(continual_stats.main, PROG, [f"--output={path}", *SCHEDULE], fix, capsys)


# -- item 25.2: inputs checked at launch -----------------------------------------------------------
def test_a_glob_of_files_with_different_headers_is_refused_naming_the_file(tmp_path, capsys):
    _events(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("stream_id,timestamp,value_0,value_1\n" + "s,1,0.5,0.5\n" * 5000)
    assert_usage_error(continual_stats.main, PROG, [f"--input={tmp_path / '*.csv'}", f"--output={tmp_path / 'o'}",
                                                    *SCHEDULE], f"{tmp_path / 'b.csv'} does not match", capsys)


def test_a_repeated_column_is_refused_by_name_and_a_bom_is_dropped(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("stream_id,timestamp,value,value\ns,1,0.5,0.5\n")
    assert_usage_error(continual_stats.main, PROG, [f"--input={tmp_path / 'd.csv'}", f"--output={tmp_path / 'o'}",
                                                    *SCHEDULE], "column 'value' appears more than once", capsys)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + _events(tmp_path / "plain.csv").read_bytes())
    assert continual_stats.main([f"--input={bom}", f"--output={tmp_path / 'o'}", "--print-exact-counts",
                                 *SCHEDULE]) == 0
    assert " 0 dead letters" in capsys.readouterr().out  # every row read: the BOM was not part of a name


# -- subprocess runs: Ctrl-C and two runs at once --------------------------------------------------
def _start(tmp_path: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    return subprocess.Popen([sys.executable, "-m", "pipelines.continual_stats", f"--input={tmp_path / 'big.csv'}",
                             f"--output={out}", "--start=0", "--period=1000", "--end=200000",
                             *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _big_csv(folder: Path, n: int) -> None:
    """``n`` events over 200 streams and 200 steps, as ``big.csv`` (what :func:`_start` reads)."""
    import numpy as np

    rng = np.random.default_rng(0)
    ts = np.sort(rng.uniform(0, 200_000, n))
    (folder / "big.csv").write_text("stream_id,timestamp,value\n" + "".join(
        f"s{s},{t:.3f},{v:.3f}\n" for s, t, v in zip(rng.integers(0, 200, n), ts, rng.normal(size=n))))


@pytest.fixture
def big_input(tmp_path):
    """Events enough for a run of several seconds (many streams and steps)."""
    _big_csv(tmp_path, 60_000)
    return tmp_path


def test_ctrl_c_keeps_the_previous_output_byte_for_byte_and_exits_130(tmp_path, capsys):
    out = tmp_path / "out"
    assert continual_stats.main([f"--input={_events(tmp_path / 'e.csv')}", f"--output={out}", *SCHEDULE]) == 0
    before = {name: tree(tmp_path / name) for name in ("out", "out.private")}
    # several seconds of work after staging begins: keyed by stream, 40,000 releases at a few hundred µs each
    # (by stream groups, 600k events once ended within the 1.5 s)
    _big_csv(tmp_path, 600_000)
    proc = _start(tmp_path, out, "--stream-groups=0")
    wait_for("out.staging-*", tmp_path, proc)
    time.sleep(1.5)  # inside the run
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr[-3000:])
    assert stderr.strip().splitlines() == [f"{PROG}: interrupted; the previous output under {out} is kept unchanged"]
    assert {name: tree(tmp_path / name) for name in ("out", "out.private")} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out", "out.private"]


def test_two_runs_into_one_folder_never_mix(big_input, tmp_path):
    """The second run is refused while the first holds the folder, or (a slow start) runs after it
    and replaces the whole output: either way every file comes from one run."""
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    first = _start(tmp_path, out, "--epsilon=1")
    wait_for("out.lock", tmp_path, first)
    second = _start(tmp_path, out, "--epsilon=0.5", "--count")
    _, err2 = second.communicate(timeout=300)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-3000:]
    if second.returncode == 2:
        assert "held by a running job" in err2 and len(err2.strip().splitlines()) == 1, err2
    else:
        assert second.returncode == 0, err2[-3000:]
    totals = {t for f in out.glob("*.parquet") for t in pq.read_table(f, columns=["job_epsilon_budget"]).column(0)
              .to_pylist()}
    assert totals == ({1.0} if second.returncode == 2 else {0.5})  # one run's files only
    assert bool(list(out.glob("count-*"))) == (second.returncode == 0)
