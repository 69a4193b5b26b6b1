"""The CI-sized run of the jobs' fuzz campaign (``tests/reliability/fuzz_jobs.py``; the full campaign
is run by hand, its numbers in docs/reliability.md): random flags, input files, keys and output locations
for all five jobs, each ending as "would run" or one line with exit 2 within seconds, never touching a
previous output or leaving a staging folder or lock; plus one real run and one interrupted run."""

from __future__ import annotations

import pytest

from tests.reliability.fuzz_jobs import campaign

pytestmark = pytest.mark.pipeline


def test_random_job_launches_are_one_line_errors_or_valid_and_keep_previous_outputs(tmp_path):
    tally = campaign(launch=300, full=0, interrupted=0, seed=7, root=tmp_path)
    assert not tally.failures, tally.failures[:5]
    assert tally.kinds["launch"] == 300
    assert tally.outcomes["usage error"] > 50 and tally.outcomes["would run"] > 10, tally.outcomes  # both reached


@pytest.mark.slow
def test_a_real_and_an_interrupted_run_end_cleanly(tmp_path):
    tally = campaign(launch=0, full=1, interrupted=1, seed=3, root=tmp_path)
    assert not tally.failures, tally.failures
    assert tally.kinds == {"full": 1, "interrupted": 1}
