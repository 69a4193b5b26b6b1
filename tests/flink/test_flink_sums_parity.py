"""``python -m pipelines.flink_job --job continual_stats`` releases what the Beam batch job
``python -m pipelines.continual_stats`` releases on the same CSV, key and flags: the same params (the Beam
job's plan), noise domain and binding, so the same noise; the values within 1e-9 (the sums are added in
another order), every other column equal, at parallelism 1 and 4, keyed by stream groups (the batch
default) and by stream. Needs .venv-flink (skipped in the main venv); the Beam side runs in the main venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyflink")

from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.family_cases import assert_same_rows, letter_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = ["--start=1000", "--period=10", "--end=1100", "--streams=a,b,silent"]
FLAGS = {
    "groups-pure": ["--epsilon=1.0"],  # the batch default: 4 stream groups
    "streams-gaussian": ["--epsilon=0.7", "--delta=1e-6", "--noise=gaussian", "--counter=tree", "--stream-groups=0"],
}


def _events(path: Path) -> None:
    """A CSV as the Beam job reads it: 60 events of streams a, b and c (c undeclared) and a row with a NaN
    (release stage: non_finite)."""
    rng = np.random.default_rng(5)
    ts = np.sort(1000.0 + rng.random(60) * 75.0).tolist()
    ids = rng.choice(["a", "b", "b", "c"], 60).tolist()
    values = rng.normal(0, 0.8, (60, 2)).tolist()
    path.write_text("stream_id,timestamp,value_0,value_1\n" + "".join(
        f"{s},{t!r},{v[0]!r},{v[1]!r}\n" for s, t, v in zip(ids, ts, values)) + "a,1010.5,nan,0.0\n")


def _rows(folder: Path, pattern: str) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob(pattern)) for line in path.read_text().splitlines()
            if line.strip()]


@pytest.fixture(autouse=True)
def _job_env(monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def beam_side(tmp_path_factory) -> dict:
    """The Beam batch job's output folder per flag set (main venv: Beam 2.77), on one CSV."""
    python = ROOT / ".venv" / "bin" / "python"
    assert python.exists(), "the main venv (.venv) runs the Beam side: `make install-test` first"
    folder = tmp_path_factory.mktemp("beam")
    _events(folder / "events.csv")
    env = {**os.environ, "BEAM_DP_NOISE_KEY": TEST_KEY.hex()}
    outs = {}
    for name, flags in FLAGS.items():
        outs[name] = folder / name
        subprocess.run([str(python), "-m", "pipelines.continual_stats", f"--input={folder / 'events.csv'}",
                        *SCHEDULE, *flags, f"--output={outs[name]}", "--format=jsonl"],
                       cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    return {"input": folder / "events.csv", **outs}


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [1, 4])
@pytest.mark.parametrize("flags", list(FLAGS))
def test_the_flink_sums_equal_the_beam_batch_job(beam_side, tmp_path, flags, parallelism):
    from beam_dp.io.manifest import read_manifest
    from pipelines.flink_job import main

    beam_out, flink_out = beam_side[flags], tmp_path / "flink"
    assert main(["--job", "continual_stats", f"--parallelism={parallelism}", f"--input={beam_side['input']}",
                 *SCHEDULE, *FLAGS[flags], f"--output={flink_out}"]) == 0
    want = _rows(beam_out, "sum-*.jsonl")
    assert len(want) == 3 * 10, "the declared streams a, b and silent at each of the 10 steps (c undeclared)"
    assert_same_rows(_rows(flink_out, "sum/*/part-*"), want)
    beam_manifest, flink_manifest = read_manifest(str(beam_out)), read_manifest(str(flink_out))
    assert (flink_manifest.epsilon, flink_manifest.delta) == (beam_manifest.epsilon, beam_manifest.delta)
    declared = [(t.noise_domain, t.noise_binding, t.mechanism, t.composition, t.epsilon, t.delta)
                for t in flink_manifest.transforms]
    assert declared == [(t.noise_domain, t.noise_binding, t.mechanism, t.composition, t.epsilon, t.delta)
                        for t in beam_manifest.transforms]
    assert declared[0][0] == "ContinualSum" and declared[0][1]  # the Beam transform's domain, a binding
    assert letter_counts(_rows(Path(f"{flink_out}.private"), "*/part-*")) == letter_counts(
        _rows(Path(f"{beam_out}.private"), "*.jsonl"))


@pytest.mark.parametrize("flags, problem", [(["--count"], "--count run on Beam"),
                                            (["--window=3"], "--window run on Beam")])
def test_what_flink_does_not_release_is_refused_with_one_line(tmp_path, capsys, flags, problem):
    from pipelines.flink_job import main

    _events(tmp_path / "events.csv")
    assert main(["--job", "continual_stats", f"--input={tmp_path / 'events.csv'}", *SCHEDULE, *flags,
                 f"--output={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and "\n" not in err
