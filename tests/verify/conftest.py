"""Fixtures shared by the verifier tests."""

from __future__ import annotations

import pytest

from tests.conftest import TEST_KEY


@pytest.fixture(scope="session")
def job(tmp_path_factory):
    """One honest run of the main job with a count (kary_tree sum and count, window_tree windowed),
    shared by the session: read-only, a test that doctors it works on a copy."""
    from pipelines.continual_stats import main

    out = str(tmp_path_factory.mktemp("job") / "out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
        assert main(["--output", out, "--count"]) == 0
    return out
