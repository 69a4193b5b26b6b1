"""``python -m pipelines.demo_data --out DIR`` writes every input the README's job commands read, under the names
they use, and each job accepts its file (the header checks of every job's plan, and a tiny run of one)."""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys

import pytest

from pipelines.demo_data import EXAMPLE_FILES, main
from tests.docs.blocks import ROOT, all_blocks
from tests.docs.shell import commands, not_here

JOBS = ("continual_stats", "model_release", "growing_db_queries", "online_learning", "lifelong")
INPUT_FLAGS = ("--input", "--queries", "--eval-input")


def _readme_job_commands() -> dict[str, list[str]]:
    """The README's runnable command of each job, as argv after ``python -m pipelines.<job>``."""
    found: dict[str, list[str]] = {}
    for block in all_blocks("bash"):
        if block.path.name != "README.md":
            continue
        for command in commands(block):
            argv = shlex.split(command)
            if argv[:2] == ["python", "-m"] and argv[2].removeprefix("pipelines.") in JOBS and not not_here(command) \
                    and "--input" in argv:
                found.setdefault(argv[2].removeprefix("pipelines."), argv[3:])
    return found


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples") / "inputs"
    assert main(["--out", str(folder)]) == 0
    return folder


def test_every_listed_file_is_written(examples, capsys):
    names = [name for names in EXAMPLE_FILES for name in names.split(", ")]
    assert len(names) == 9
    assert [n for n in names if not (examples / n).is_file() or not (examples / n).stat().st_size] == []


def test_the_readme_commands_read_files_it_writes(examples):
    jobs = _readme_job_commands()
    assert set(jobs) == set(JOBS), jobs
    for job, argv in jobs.items():
        inputs = [argv[i + 1] for i, a in enumerate(argv) if a in INPUT_FLAGS]
        assert inputs, job
        for pattern in inputs:
            assert list(examples.glob(pattern)), f"{job}: {pattern} is not written by pipelines.demo_data"


@pytest.mark.parametrize("job", JOBS)
def test_each_job_accepts_its_example_file(job, examples, tmp_path, monkeypatch):
    """The job's plan (flags, header and column checks, eval sets) accepts the README's command on the files."""
    from pipelines.runner import parse

    module = importlib.import_module(f"pipelines.{job}")
    monkeypatch.chdir(examples)
    argv = [*_readme_job_commands()[job], f"--output={tmp_path / 'out'}"]
    argv = [a for i, a in enumerate(argv) if not (a == "--output" or (i and argv[i - 1] == "--output"))]
    planned = module.plan(parse(argv, module.JOB))  # a header the job refuses: UsageError here
    assert planned.demo is False and str(planned.out_dir).rstrip("/").endswith("out")


def test_a_tiny_run_of_one_job_on_its_example_file(examples, tmp_path):
    argv = _readme_job_commands()["growing_db_queries"]
    result = subprocess.run([sys.executable, "-m", "pipelines.growing_db_queries", *argv,
                             f"--output={tmp_path / 'answers'}"], cwd=examples, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # the demo's schedule and universe: each of its 30 queries answered, no element or query refused
    assert "answers: 30 releases, 2 streams" in result.stdout and "Traceback" not in result.stderr
    letters = [f.read_text() for f in (tmp_path / "answers.private").glob("dead_letter-*")]
    assert letters and not "".join(letters).strip()


def test_an_unwritable_folder_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["--out", str(tmp_path / "file" / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m pipelines.demo_data: error: cannot write")
