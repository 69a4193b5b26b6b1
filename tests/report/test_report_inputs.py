"""The report's inputs and outputs: a job folder (through its manifest), a glob over one, ``--out`` an
existing file, captions naming the drawn streams, Ctrl-C, progress; and its aggregates against a
straightforward computation on the same small folder (Parquet in several batches and JSON lines)."""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.io import RELEASE_SCHEMA, read_releases
from beam_dp.io.manifest import JobManifest, ManifestTransform, write_manifest
from beam_dp.report import aggregate as aggregate_module
from beam_dp.report import sources
from beam_dp.report.__main__ import main
from beam_dp.report.aggregate import accuracy, aggregate_files, noise_std
from beam_dp.report.progress import ReadProgress


def _rows(streams, steps, mechanism="kary_tree", dim=2, seed=0, delta=0.0, meta=None):
    """Release rows (dicts of RELEASE_SCHEMA) of ``streams`` x ``steps``; spend differs per stream; ``meta``:
    the meta of a step (default: a noise std and an accuracy growing with the step)."""
    meta = meta or (lambda step: {"noise_std": 0.5 + step, "accuracy": 0.01 * step})
    rng = np.random.default_rng(seed)
    rows = []
    for i, stream in enumerate(streams):
        for step in steps:
            rows.append({"stream": stream, "step": step, "mechanism": mechanism,
                         "value": rng.normal(size=dim).tolist(), "shape": [dim], "parts": "",
                         "epsilon_spent": 0.1 * (1 + i % 3) * step / max(steps), "delta_spent": delta * step,
                         "epsilon_budget": 1.0, "delta_budget": 1e-3, "window": None, "step_start": None,
                         "step_end": None, "meta": json.dumps(meta(step)),
                         "noise_domain": "Sum", "composition": "pure", "purpose": "", "noise": ""})
    return rows


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows, schema=RELEASE_SCHEMA), path)


def _job_folder(folder, streams=("b", "a", "c"), steps=range(1, 9)):
    """A job folder: release files of the declared prefix ``sum``, its manifest, a JSON summary, an
    unrelated file and a dead-letter file."""
    rows = _rows(list(streams), list(steps))
    _parquet(folder / "sum-00000-of-00001.parquet", rows)
    write_manifest(str(folder), JobManifest("job", 1.0, 0.0, (ManifestTransform("Sum", "kary_tree", "pure", 1.0, 0.0,
                                                                                  ("sum",)),)))
    (folder / "summary.json").write_text('{"not": "releases"}\n')
    (folder / "notes.txt").write_text("not releases\n")
    (folder / "dead_letter-00000-of-00001.jsonl").write_text('{"reason": "late"}\n')
    return len(rows)


@pytest.mark.parametrize("inputs", [["{d}"], ["{d}/"], ["{d}/*"], ["{d}/_beam_dp_manifest.json"]])
def test_a_job_folder_or_a_glob_over_it_reads_only_its_release_files(inputs, tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    n = _job_folder(job)
    assert main([i.format(d=job) for i in inputs] + ["--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"beam_dp report: {n} release rows from 1 files; 3 streams, steps released up to 8")
    assert "dead letters: 1" in out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["rows"] == n and summary["files"] == 1


def test_a_declared_transform_without_files_is_a_note_not_a_failure(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    n = _job_folder(job)
    write_manifest(str(job), JobManifest("job", 1.0, 0.0, (
        ManifestTransform("Sum", "kary_tree", "pure", 0.5, 0.0, ("sum",)),
        ManifestTransform("Windowed", "window_tree", "pure", 0.5, 0.0, ("windowed",)))))
    assert main([str(job), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"beam_dp report: {n} release rows from 1 files")
    assert "  note: transform 'Windowed'" in out and "windowed-* are missing" in out


def test_captions_and_stdout_say_which_streams_of_how_many_are_drawn(tmp_path, capsys):
    _parquet(tmp_path / "sum-00000-of-00001.parquet", _rows(["s3", "s1", "s2"], range(1, 6)))
    out = tmp_path / "report"
    assert main([str(tmp_path / "sum-*"), "--out", str(out), "--max-streams", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["drawn"] == {"kary_tree": ["s1", "s2"]} and summary["streams"] == 3
    caption = summary["captions"]["values_kary_tree.png"]
    assert caption.startswith("2 of 3 streams drawn") and "s1, s2" in caption
    assert f"  values_kary_tree.png: {caption}" in lines
    assert "drawing 2 of 3 streams" in lines[0]
    assert "all 15 releases of 3 streams" in summary["captions"]["privacy_spend.png"]


@pytest.mark.parametrize("make_out", ["file", "file_parent"])
def test_out_an_existing_file_is_a_one_line_error_with_exit_code_2(make_out, tmp_path, capsys):
    _parquet(tmp_path / "sum-00000-of-00001.parquet", _rows(["a"], range(1, 3)))
    existing = tmp_path / "existing"
    existing.write_text("keep me\n")
    out = existing if make_out == "file" else existing / "report"
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "sum-*"), "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m beam_dp.report: error:") and "--out" in err
    assert existing.read_text() == "keep me\n"


def test_a_corrupt_release_file_in_a_glob_is_a_one_line_error_with_exit_code_2(tmp_path, capsys):
    _parquet(tmp_path / "sum-00000-of-00002.parquet", _rows(["a"], range(1, 3)))
    (tmp_path / "sum-00001-of-00002.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "sum-*"), "--out", str(tmp_path / "report")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sum-00001-of-00002.parquet is not a beam_dp release file" in err


def test_ctrl_c_is_one_line_and_exit_code_130(tmp_path, capsys, monkeypatch):
    _parquet(tmp_path / "sum-00000-of-00001.parquet", _rows(["a"], range(1, 3)))

    def interrupted(path):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(aggregate_module, "iter_batches", interrupted)
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "sum-*"), "--out", str(tmp_path / "report")])
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == "python -m beam_dp.report: interrupted"


def test_progress_is_a_redrawn_line_on_a_terminal_and_log_lines_otherwise(caplog):
    screen = io.StringIO()
    progress = ReadProgress(4, stream=screen, after=0.0, every=0.0, terminal=True)
    progress.update(1, 65_536)
    progress.update(2, 131_072)
    progress.close()
    text = screen.getvalue()
    assert "\rbeam_dp report: read 1/4 files, 65,536 releases" in text and "read 2/4 files, 131,072" in text
    assert text.endswith("\r") and text.split("\r")[-2].strip() == ""  # erased at the end
    with caplog.at_level(logging.INFO, logger="beam_dp.report"):
        logged = ReadProgress(4, stream=io.StringIO(), after=0.0, every=0.0)
        assert not logged.terminal
        logged.update(3, 10)
    messages = [r.getMessage() for r in caplog.records if r.name == "beam_dp.report"]
    assert messages == ["read 3/4 files, 10 releases, 0 s"]
    quiet = ReadProgress(4, stream=io.StringIO(), after=3600.0, terminal=True)
    quiet.update(1, 1)
    assert quiet.stream.getvalue() == ""  # nothing in the first seconds


def test_the_aggregates_equal_a_straightforward_computation(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_BATCH_ROWS", 16)  # many batches per file
    # the first file holds the largest stream names: the drawn streams change as the read goes on
    first = _rows(["z1", "y2", "x3", "w4"], range(1, 21), seed=1)
    second = _rows(["c5", "a6", "b7"], range(3, 25), seed=2)
    # a K-norm model release: its noise std depends on the value's length (here 3)
    snapshots = _rows(["m1", "a6"], range(1, 5), mechanism="model_snapshot", dim=3, seed=3, delta=1e-6,
                      meta=lambda step: {"law": "gamma", "noise_scale": 0.5, "accuracy": {"t1": 0.5, "t2": step / 4}})
    _parquet(tmp_path / "r-00000-of-00003.parquet", first)
    _parquet(tmp_path / "r-00001-of-00003.parquet", second)
    (tmp_path / "r-00002-of-00003.jsonl").write_text("".join(json.dumps(r) + "\n" for r in snapshots))
    paths, _ = sources.release_files([str(tmp_path / "r-*")])
    assert len(paths) == 3
    got = aggregate_files(paths, max_streams=3)
    rows = read_releases(str(tmp_path / "r-*"))

    assert got.rows == len(rows) == len(first) + len(second) + len(snapshots)
    assert got.stream_count() == len({r["stream"] for r in rows}) == 8
    assert got.last_step == max(r["step"] for r in rows) == 24
    assert got.has_delta
    for name in ("kary_tree", "model_snapshot"):
        mine = [r for r in rows if r["mechanism"] == name]
        m = got.mechanisms[name]
        streams = sorted({r["stream"] for r in mine})
        assert m.rows == len(mine) and m.streams == set(streams)
        assert m.drawn == streams[:3]
        assert m.kept_rows == sum(r["stream"] in streams[:3] for r in mine)  # displaced streams' rows let go
        steps = sorted({r["step"] for r in mine})
        np.testing.assert_array_equal(m.spend.steps, steps)
        for column, reduce, got_values in (("epsilon_spent", max, m.spend.epsilon_max),
                                           ("epsilon_spent", min, m.spend.epsilon_min),
                                           ("delta_spent", max, m.spend.delta_max)):
            want = [reduce(r[column] for r in mine if r["step"] == s) for s in steps]
            np.testing.assert_allclose(got_values, want, rtol=1e-12, atol=0)
        for series in m.series():
            own = sorted((r for r in mine if r["stream"] == series.stream), key=lambda r: r["step"])
            np.testing.assert_array_equal(series.steps, [r["step"] for r in own])
            np.testing.assert_allclose(series.first, [r["value"][0] for r in own], rtol=1e-12, atol=0)
            assert list(series.dims) == [len(r["value"]) for r in own]
            np.testing.assert_allclose(series.noise_std, [noise_std(r["meta"], len(r["value"])) for r in own],
                                       rtol=1e-12, atol=0)
            np.testing.assert_allclose(series.accuracy, [accuracy(r["meta"]) for r in own], rtol=1e-12, atol=0)
            np.testing.assert_allclose(series.epsilon_spent, [r["epsilon_spent"] for r in own], rtol=1e-12, atol=0)


def test_a_drawn_release_whose_meta_is_not_a_json_object_is_a_one_line_error(tmp_path, capsys):
    rows = _rows(["a"], range(1, 3))
    rows[1]["meta"] = "[1, 2]"
    _parquet(tmp_path / "sum-00000-of-00001.parquet", rows)
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "sum-*"), "--out", str(tmp_path / "report")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "release of stream 'a' at step 2 (kary_tree) has a meta that is not" in err
