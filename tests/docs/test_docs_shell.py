"""Every shell command of README.md and docs/*.md that needs no network runs as shown, block by block in a fresh
folder (later commands of a block read what earlier ones wrote), on small example inputs under the names the
docs use (made from the jobs' public default datasets by ``tests.docs.shell.write_inputs``). The others are
skipped for a reason of ``tests.docs.shell.NOT_HERE``: cloud, brokers, a Flink cluster, a package index,
the demo (run by test_readme_shell.py), benchmarks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.docs.blocks import ROOT, all_blocks
from tests.docs.shell import NOT_HERE, TEST_KEY, commands, not_here, script, shell_blocks, write_inputs

BLOCKS = shell_blocks()
RUN_HERE = [b for b in BLOCKS if any(not not_here(c) for c in commands(b))]
#: the blocks that run the lifelong job or five jobs in a row (about 40-60 s each on 2 shared cores)
#: blocks of a minute or more (every job's example command, the lifelong one included), known by what they run
#: (not by line: lines move as the docs grow)
SLOW = ("python -m pipelines.lifelong --input tasks.csv",)


def test_every_command_runs_here_or_has_a_stated_reason():
    runnable = [c for b in BLOCKS for c in commands(b) if not not_here(c)]
    assert len(runnable) >= 15, runnable  # the jobs, the YAML templates, the `cd`s they need
    assert not [c for c in runnable if " ..." in c or c.endswith("...")], "a literal ... the reader cannot run"
    first_words = {c.split()[0] for c in runnable}
    assert first_words <= {"python", "cd", "BEAM_DP_NOISE_KEY=" + TEST_KEY}, first_words
    used = {reason for c in (c for b in BLOCKS for c in commands(b)) if (reason := not_here(c))}
    assert used == {reason for _, reason in NOT_HERE}, "a reason no command needs any more"


def test_no_command_hides_in_an_unlabelled_block():
    """Unlabelled blocks are output or text; a command there would escape the test above."""
    starts = ("python ", "make ", "pip ", "nice ", "OMP_NUM_THREADS", "cd ", "gcloud ", "docker ", "flink ")
    hidden = [b.id for b in all_blocks("") if b.code.lstrip().startswith(starts)]
    assert not hidden, hidden


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow]
                                                 if any(text in b.code for text in SLOW) else [], id=b.id)
                                   for b in RUN_HERE])
def test_shell_block_runs_as_shown(block, tmp_path):
    shutil.copytree(ROOT / "templates", tmp_path / "templates")  # the blocks `cd templates/yaml`
    for folder in (tmp_path, tmp_path / "templates" / "yaml"):
        write_inputs(folder)
    (tmp_path / "secrets").mkdir()
    for name in ("beam_dp.key", "key"):
        (tmp_path / "secrets" / name).write_text(TEST_KEY)
    (tmp_path / "bin").mkdir()
    shim = tmp_path / "bin" / "python"  # `python` is this interpreter, as in an activated venv
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", script(block, tmp_path / "secrets")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{block.id} exit {result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    left = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("beam-*temp*")]
    assert not left, f"{block.id} left Beam's temporary folders: {left}"
    print(f"{block.id}: {time.monotonic() - started:.0f} s")
