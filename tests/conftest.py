import os
import tempfile
from pathlib import Path

import pytest

TEST_KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _noise_key_env(monkeypatch):
    """Every test sees the same secret noise key in the env var the workers read."""
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    yield


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory):
    """What the suite and the commands it starts put in the temporary folder (Beam's folder of a pipeline
    a test builds but never runs, spill files) goes under pytest's base folder, which pytest rotates
    (three runs kept): a run of the suite leaves nothing behind in the system's temporary folder."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = folder, folder
    yield
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]


def pytest_configure(config):
    os.environ.setdefault("PYTHONHASHSEED", "0")


#: node ids of the runs that would break CI's time budget (``make test`` leaves them out, ``make test-long``)
LONG = frozenset(line for line in (Path(__file__).parent / "long.txt").read_text().splitlines()
                 if line and not line.startswith("#"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in LONG:
            item.add_marker(pytest.mark.long)

try:  # Beam's TestStream is a class named Test*: keep pytest from collecting it
    from apache_beam.testing.test_stream import TestStream

    TestStream.__test__ = False
except ImportError:  # pragma: no cover
    pass
