"""``python -m pipelines.run_yaml``: a YAML template runs quiet (one summary line, nothing on stderr),
``--verbose`` brings Beam's logs back, and a bad parameter is one line with exit code 2. Its outputs
are staged and published at success like the five jobs' (issue 25 item 1): a failing or interrupted
re-run keeps the previous output byte for byte, a second run while one holds the folder is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import tree, wait_for
from tests.templates.yaml_expectations import TEST_VARIABLES

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]


def _command(variables: dict, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.run_yaml", "--yaml_pipeline_file=continual_sum.yaml",
            f"--jinja_variables={json.dumps(variables)}", *extra]


def _env(key: str = TEST_KEY.hex()) -> dict:
    return dict(os.environ, BEAM_DP_NOISE_KEY=key, PYTHONPATH=str(ROOT))


def _run(tmp_path, variables: dict, *extra: str, key: str = TEST_KEY.hex()) -> subprocess.CompletedProcess:
    return subprocess.run(_command(variables, *extra), cwd=ROOT / "templates" / "yaml", env=_env(key),
                          capture_output=True, text=True, timeout=300)


def test_a_template_runs_quiet_and_verbose_brings_the_logs_back(tmp_path):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\n")
    variables = dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "out"))
    done = _run(tmp_path, variables)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout == "beam_dp yaml: ran continual_sum.yaml\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_beam_dp_manifest.json",  # beam_dp.verify reads it
                                                                    "sum-00000-of-00001.parquet"]
    assert sorted(p.name for p in (tmp_path / "out.private").iterdir()) == ["README_RAW_DATA.txt",
                                                                            "dead_letter-00000-of-00001.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "out", "out.private"]  # no staging, no lock
    loud = _run(tmp_path, dict(variables, output=str(tmp_path / "out2")), "--verbose")
    assert loud.returncode == 0 and "INFO" in loud.stderr


@pytest.mark.parametrize("change,fix", [({"epsilon": -1.0}, "epsilon must be"), ({"start": None}, "start"),
                                        ({"input": "/no/such/events.csv"}, "no files")])
def test_a_bad_parameter_is_one_line_with_exit_code_2(tmp_path, change, fix):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    variables = {**TEST_VARIABLES, "input": str(tmp_path / "e.csv"), "output": str(tmp_path / "out"), **change}
    variables = {k: v for k, v in variables.items() if v is not None}
    done = _run(tmp_path, variables)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("python -m pipelines.run_yaml: error:")
    assert fix in done.stderr.lower().replace("found no files", "no files")


# -- issue 25 item 1: staged outputs ---------------------------------------------------------------
def _first_run(tmp_path: Path) -> tuple[dict, dict]:
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\nb,99.0,0.5\n")
    variables = dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "out"))
    done = _run(tmp_path, variables)
    assert done.returncode == 0, done.stderr[-2000:]
    before = {name: tree(tmp_path / name) for name in ("out", "out.private")}
    assert "sum-00000-of-00001.parquet" in before["out"] and "dead_letter-00000-of-00001.jsonl" in before["out.private"]
    return variables, before


def test_a_failing_yaml_rerun_keeps_the_previous_output_byte_for_byte(tmp_path):
    variables, before = _first_run(tmp_path)
    done = _run(tmp_path, dict(variables, epsilon=0.5), key="abcd")  # a 2-byte key: refused when the pipeline is built
    assert done.returncode == 2 and "at least 64 hex digits" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert {name: tree(tmp_path / name) for name in ("out", "out.private")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "out", "out.private"]  # no staging, no lock


def test_a_yaml_pipeline_writing_files_outside_its_output_is_refused(tmp_path):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    variables = dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "out"),
                     dead_letter_output=str(tmp_path / "elsewhere"))
    os.symlink(ROOT / "templates" / "yaml" / "providers.yaml", tmp_path / "providers.yaml")
    text = (ROOT / "templates" / "yaml" / "continual_sum.yaml").read_text()
    (tmp_path / "t.yaml").write_text(text.replace("{{ dead_letter_output | default(output ~ '.private') }}",
                                                  str(tmp_path / "raw")))
    done = subprocess.run([sys.executable, "-m", "pipelines.run_yaml", f"--yaml_pipeline_file={tmp_path / 't.yaml'}",
                           f"--jinja_variables={json.dumps(variables)}"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr[-2000:]
    assert f"writes files under {tmp_path / 'raw'}, outside its output" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "providers.yaml", "t.yaml"]


@pytest.fixture
def big_variables(tmp_path) -> dict:
    """Events enough for a YAML run of several seconds (many streams and steps)."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 60_000
    ts = np.sort(rng.uniform(0, 200_000, n))
    (tmp_path / "big.csv").write_text("stream_id,timestamp,value_0\n" + "".join(
        f"s{s},{t:.3f},{v:.3f}\n" for s, t, v in zip(rng.integers(0, 200, n), ts, rng.normal(size=n))))
    return dict(TEST_VARIABLES, input=str(tmp_path / "big.csv"), output=str(tmp_path / "out"), start=0, period=1000,
                end=200_000)


def _start(variables: dict) -> subprocess.Popen:
    return subprocess.Popen(_command(variables), cwd=ROOT / "templates" / "yaml", env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_an_interrupted_yaml_rerun_keeps_the_previous_output_and_a_second_run_is_refused(tmp_path, big_variables):
    _, before = _first_run(tmp_path)
    proc = _start(big_variables)
    wait_for("out.staging-*", tmp_path, proc)
    second = _run(tmp_path, dict(big_variables, epsilon=0.5))  # while the first holds the folder
    assert second.returncode == 2, second.stderr[-2000:]
    assert "held by a running job" in second.stderr and len(second.stderr.strip().splitlines()) == 1, second.stderr
    time.sleep(1.0)  # inside the run
    assert proc.poll() is None, "the run ended before it could be interrupted: give it more events"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        f"python -m pipelines.run_yaml: interrupted; the previous output under {tmp_path / 'out'} is kept unchanged"]
    assert {name: tree(tmp_path / name) for name in ("out", "out.private")} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out", "out.private"]


@pytest.mark.parametrize("flags,fix", [(["--jinja_variables={"], "invalid loads value"),
                                       (["--jinja_variables=[1]"], "must be a JSON object"),
                                       (["--yaml_pipeline_file"], "expected one argument")])
def test_a_bad_runner_flag_is_one_line_not_a_usage_block(flags, fix, capsys):
    """Found by the fuzz campaign (seed 11): Beam's argparse printed its usage block. Mutant checked:
    without ``_argparse_errors`` the first case prints three lines."""
    from pipelines.run_yaml import main

    with pytest.raises(SystemExit) as ended:
        main(["--yaml_pipeline_file=continual_sum.yaml", '--jinja_variables={"output": "/x"}', *flags])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m pipelines.run_yaml: error:") and fix in err, err


@pytest.mark.parametrize("flags,staged", [([], True), (["--runner=FnApiRunner"], True), (["--runner=DirectRunner"], True),
                                          (["--runner=DataflowRunner"], False), (["--streaming"], False)])
def test_a_local_batch_run_is_staged_and_others_write_in_place(flags, staged):
    """No runner named is Beam's local default: staged too (mutant checked: without the ``None`` case
    a template with no runner wrote in place)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.run_yaml import _staged

    assert _staged(PipelineOptions(flags)) is staged


# -- rejected input: a warning, and --fail-on-rejected exit 3 (as the five jobs) --------------------------
def test_a_yaml_run_whose_input_was_all_rejected_warns_and_fail_on_rejected_exits_3(tmp_path):
    variables, before = _first_run(tmp_path)
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,99.0,0.5\nb,98.0,0.25\na,abc,0.5\n")
    warned = _run(tmp_path, dict(variables, output=str(tmp_path / "other")))
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert warned.stderr.splitlines() == [
        "warning: 3 of 3 input rows were rejected (raw-data count, not private); dead letters under "
        f"{tmp_path / 'other.private'}"]
    failed = _run(tmp_path, variables, "--fail-on-rejected", "0.5")
    assert failed.returncode == 3, failed.stderr[-2000:]
    assert failed.stderr.splitlines() == [
        "python -m pipelines.run_yaml: error: 3 of 3 input rows were rejected (raw-data count, not private), more "
        f"than --fail-on-rejected 0.5: this run's releases were not published, its dead letters are under "
        f"{tmp_path / 'out.private'}; the previous output under {tmp_path / 'out'} is kept unchanged"]
    assert tree(tmp_path / "out") == before["out"]  # the releases of the previous run stay
    letters = (tmp_path / "out.private" / "dead_letter-00000-of-00001.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["reason"] for line in letters) == ["after_end", "after_end", "bad_timestamp"]
    kept = _run(tmp_path, variables, "--fail-on-rejected=1")  # at most the fraction allowed: a success
    assert kept.returncode == 0 and kept.stderr.startswith("warning: 3 of 3 input rows"), kept.stderr[-2000:]


@pytest.mark.parametrize("flags,fix", [(["--fail-on-rejected=2"], "must be a fraction from 0 to 1, got 2"),
                                       (["--fail-on-rejected=0.1", "--streaming"], "needs a local batch run (")])
def test_fail_on_rejected_outside_a_fraction_or_a_local_batch_run_is_one_line_with_exit_code_2(tmp_path, flags, fix):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\n")
    done = _run(tmp_path, dict(TEST_VARIABLES, input=str(tmp_path / "e.csv"), output=str(tmp_path / "out")), *flags)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"python -m pipelines.run_yaml: error: --fail-on-rejected {fix}")
    assert not (tmp_path / "out").exists()
