"""The lifelong job's ``--accountant`` flag: PLD by default, RDP on request, anything else a usage error."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("apache_beam")

from pipelines import lifelong as job  # noqa: E402
from tests.pipelines.jobs_helpers import assert_usage_error  # noqa: E402


def _learner(tmp_path, *flags):
    from apache_beam.options.pipeline_options import PipelineOptions

    return job.plan(PipelineOptions([f"--output={tmp_path}", *flags])).params.learner


def test_accountant_flag_reaches_the_learner_config(tmp_path):
    assert _learner(tmp_path).accountant == "pld"
    assert _learner(tmp_path, "--accountant=rdp").accountant == "rdp"
    assert _learner(tmp_path, "--learner=naive_gaussian", "--accountant=rdp").accountant == "rdp"


def test_an_unknown_accountant_is_a_one_line_usage_error(tmp_path, capsys):
    assert_usage_error(job.main, job.PROG, [f"--output={tmp_path}", "--accountant=moments"], "--accountant", capsys)
