"""A Flink job resumed (or re-run) into an output whose manifest declares other privacy parameters is
refused at start with one line (exit 2); a change that touches neither the state nor the noise resumes.
Runs without PyFlink: the refusal comes before the job is built."""

from __future__ import annotations

import pytest

from beam_dp.flink.run import _args, _params, job_manifest, main, resume_problem
from beam_dp.io.manifest import write_manifest
from tests.flink.cases import entry_args


def _manifest(tmp_path, *extra):
    return job_manifest(_params(_args(entry_args(tmp_path / "in.csv", tmp_path / "out", *extra))))


@pytest.mark.parametrize("changed", [("--epsilon", "2"), ("--clip-bound", "2"), ("--counter", "auto"),
                                     ("--noise-domain", "other"), ("--delta", "1e-6", "--noise", "gaussian"),
                                     ("--end", "1090"), ("--dim", "3")])
def test_a_changed_privacy_parameter_is_refused_with_one_line(tmp_path, capsys, changed):
    write_manifest(str(tmp_path / "out"), _manifest(tmp_path))  # the first run's
    (tmp_path / "in.csv").write_text("a,1001.0,0.5,0.5\n")
    assert main(entry_args(tmp_path / "in.csv", tmp_path / "out", *changed)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "other privacy parameters" in err and "\n" not in err


@pytest.mark.parametrize("same", [(), ("--checkpoint-ms", "500"), ("--split-mib", "2"), ("--parallelism", "2")])
def test_a_change_that_does_not_touch_state_or_noise_resumes(tmp_path, same):
    write_manifest(str(tmp_path / "out"), _manifest(tmp_path))
    assert resume_problem(str(tmp_path / "out"), _manifest(tmp_path, *same)) is None


def test_a_fresh_output_and_a_legacy_manifest(tmp_path):
    assert resume_problem(str(tmp_path / "none"), _manifest(tmp_path)) is None
    import dataclasses

    old = _manifest(tmp_path)
    legacy = dataclasses.replace(old, transforms=tuple(dataclasses.replace(t, noise_binding=None)
                                                       for t in old.transforms))
    write_manifest(str(tmp_path / "out"), legacy)  # written before the binding: its declaration is compared
    assert resume_problem(str(tmp_path / "out"), old) is None
    assert resume_problem(str(tmp_path / "out"), _manifest(tmp_path, "--epsilon", "2")) is not None
