import os

import pytest

TEST_KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _noise_key_env(monkeypatch):
    """Every test sees the same secret noise key in the env var the workers read."""
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    yield


def pytest_configure(config):
    os.environ.setdefault("PYTHONHASHSEED", "0")

try:  # Beam's TestStream is a class named Test*: keep pytest from collecting it
    from apache_beam.testing.test_stream import TestStream

    TestStream.__test__ = False
except ImportError:  # pragma: no cover
    pass
