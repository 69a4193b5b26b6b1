"""Every job reaches every file through Beam's FileSystems: run against ``memfs://`` (an in-memory
Beam FileSystem registered by tests/pipelines/memfs.py, standing in for ``gs://``), inputs, key
file, demo data, releases and dead letters all land there, and nothing is written to the local disk."""

from __future__ import annotations

import os

import numpy as np
import pytest

from beam_dp.io import read_releases
from beam_dp.io.manifest import MANIFEST_NAME
from pipelines import continual_stats, growing_db_queries, lifelong, model_release, online_learning
from tests.conftest import TEST_KEY
from tests.pipelines.memfs import MemFileSystem

pytestmark = pytest.mark.pipeline

OUT = "memfs://bucket/out"
EVENTS = "stream_id,timestamp,value\n" + "".join(
    f"s{i % 2},{i * 3.5:.1f},{(-1) ** i * 0.25 * (i % 5)}\n" for i in range(23))
SCHEDULE = ["--start=0", "--period=10", "--end=80"]


@pytest.fixture
def memfs(tmp_path, monkeypatch):
    """A clean ``memfs://`` and an empty working directory that must stay empty."""
    MemFileSystem.clear()
    monkeypatch.chdir(tmp_path)
    yield MemFileSystem.files
    assert sorted(os.listdir(tmp_path)) == [], "a job wrote to the local disk"
    MemFileSystem.clear()


def _put(path: str, data: bytes) -> None:
    MemFileSystem.files[path] = data


def _names(files: dict, folder: str = OUT) -> set[str]:
    """File names under ``folder``, shard numbers and bundle ids replaced by *."""
    import re

    return {re.sub(r"-\d{5}-of-\d{5}", "-*", p[len(folder) + 1:]) for p in files if p.startswith(folder + "/")}


PRIVATE = OUT + ".private"
RAW = {"dead_letter-*.jsonl", "README_RAW_DATA.txt"}  # raw data: never under --output


def test_continual_stats_reads_key_and_input_and_writes_everything_on_the_remote_filesystem(memfs, monkeypatch,
                                                                                             capsys):
    _put("memfs://bucket/in/events.csv", EVENTS.encode())
    _put("memfs://keys/noise.key", TEST_KEY.hex().encode())
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")  # the key can only come from memfs
    argv = ["--input=memfs://bucket/in/*.csv", f"--output={OUT}", "--count", "--window=4",
            "--noise-key-file=memfs://keys/noise.key", *SCHEDULE]
    assert continual_stats.main(argv) == 0
    out = capsys.readouterr().out
    assert f"releases written under {OUT}" in out and "sum: 16 releases" in out, out
    assert _names(memfs) == {"sum-*.parquet", "count-*.parquet", "windowed-*.parquet", MANIFEST_NAME}
    assert _names(memfs, PRIVATE) == RAW
    assert not [p for p in memfs if ".staging-" in p or ".previous-" in p]  # published, nothing left behind
    remote = read_releases(f"{OUT}/sum-*")
    assert [r["step"] for r in remote if r["stream"] == "s0"] == list(range(1, 9))

    # the same job with the same key from the env var, on local files: identical releases
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    _put("memfs://bucket/in2/events.csv", EVENTS.encode())
    assert continual_stats.main(["--input=memfs://bucket/in2/*.csv", "--output=memfs://bucket/out2", "--count",
                                 "--window=4", *SCHEDULE]) == 0
    again = read_releases("memfs://bucket/out2/sum-*")
    assert [r["value"] for r in again] == [r["value"] for r in remote]


def test_model_release_demo_writes_its_data_and_outputs_remotely(memfs, capsys):
    assert model_release.main([f"--output={OUT}", "--update-size=512", "--base-size=1024"]) == 0
    assert _names(memfs) == {"models-*.parquet", MANIFEST_NAME}
    assert _names(memfs, PRIVATE) == RAW | {"demo_digits.csv"}
    assert read_releases(f"{OUT}/models-*")


def test_growing_db_demo_writes_its_data_and_outputs_remotely(memfs, capsys):
    assert growing_db_queries.main([f"--output={OUT}", "--snapshots"]) == 0
    assert _names(memfs) == {"answers-*.parquet", "synthetic-*.parquet", MANIFEST_NAME}
    assert _names(memfs, PRIVATE) == RAW | {"demo_elements.csv", "demo_queries.jsonl"}
    assert len(read_releases(f"{OUT}/answers-*")) == 30


def test_online_learning_reads_remote_input(memfs, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 2)) / 3
    _put("memfs://bucket/in/r.csv", ("stream_id,x_0,x_1,label\n" + "".join(
        f"a,{u:.4f},{v:.4f},{1 if u > 0 else -1}\n" for u, v in x)).encode())
    assert online_learning.main(["--input=memfs://bucket/in/r.csv", f"--output={OUT}", "--window=4"]) == 0
    assert _names(memfs) == {"models-*.parquet", MANIFEST_NAME} and _names(memfs, PRIVATE) == RAW
    assert len(read_releases(f"{OUT}/models-*")) == 12


def test_lifelong_reads_remote_input_and_eval_rows(memfs, capsys):
    pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    rows = "".join(f"s,{t},{rng.normal():.3f},{rng.normal():.3f},{c}\n" for t in (0, 1) for c in (0, 1)
                   for _ in range(40))
    _put("memfs://bucket/in/tasks.csv", ("stream_id,task_id,x_0,x_1,label\n" + rows).encode())
    _put("memfs://bucket/in/eval.csv", ("stream_id,task_id,x_0,x_1,label\n" + rows).encode())
    assert lifelong.main(["--input=memfs://bucket/in/tasks.csv", "--eval-input=memfs://bucket/in/eval.csv",
                          f"--output={OUT}", "--tasks=0,1", "--classes=0,1", "--steps-per-task=1", "--task-size=80",
                          "--device=cpu", "--torch-threads=1"]) == 0
    assert _names(memfs) == {"models-*.parquet", MANIFEST_NAME} and _names(memfs, PRIVATE) == RAW
    assert [r["step"] for r in read_releases(f"{OUT}/models-*")] == [1, 2]


def test_dead_letter_file_exists_even_when_empty(memfs, capsys):
    _put("memfs://bucket/in/events.csv", EVENTS.encode())
    assert continual_stats.main(["--input=memfs://bucket/in/events.csv", f"--output={OUT}", *SCHEDULE]) == 0
    letters = [p for p in memfs if "/dead_letter-" in p]
    assert len(letters) == 1 and letters[0].endswith(".jsonl") and memfs[letters[0]] == b""
