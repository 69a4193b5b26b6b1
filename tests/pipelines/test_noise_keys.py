"""Noise keys in production: from Secret Manager (a fake client here), a file on any Beam filesystem or
an env var; never in the graph, the options or the logs; streaming and remote jobs refuse to start
without a fixed key unless --allow-random-noise-key."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from beam_dp.beam import NoiseKey
from beam_dp.core import NoiseSource
from beam_dp.io import keys
from pipelines import continual_stats
from pipelines.runner import UsageError, check_noise_key
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import FakeSecretManager, assert_usage_error, user_functions
from tests.pipelines.memfs import MemFileSystem

pytestmark = pytest.mark.pipeline

PROG = "python -m pipelines.continual_stats"
SECRET = "projects/my-project/secrets/beam-dp-noise-key/versions/3"
STREAM = ["--source=pubsub", "--streaming", "--pubsub-topic=projects/my-project/topics/events", "--dim=1",
          "--start=0", "--period=10"]


def _draw(source: NoiseSource) -> np.ndarray:
    return source.gaussian("s", "node", (1, 2), 1.0, 4)


@pytest.mark.parametrize("payload", [TEST_KEY, TEST_KEY.hex().encode() + b"\n"])
def test_secret_manager_key_is_the_secret_payload(monkeypatch, payload):
    fake = FakeSecretManager(payload)
    monkeypatch.setattr(keys, "secret_manager_client", lambda: fake)
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    source = NoiseKey(secret=SECRET, domain="job/Sum").load(keys.load_noise_source)
    assert fake.asked == [SECRET]
    np.testing.assert_array_equal(_draw(source), _draw(NoiseSource(TEST_KEY).for_domain("job/Sum")))


def test_secret_wins_over_file_and_env(monkeypatch):
    other = bytes(range(100, 132))
    monkeypatch.setattr(keys, "secret_manager_client", lambda: FakeSecretManager(TEST_KEY))
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", other.hex())
    MemFileSystem.files["memfs://k/other"] = other
    source = NoiseKey(key_file="memfs://k/other", secret=SECRET, domain="d").load(keys.load_noise_source)
    np.testing.assert_array_equal(_draw(source), _draw(NoiseSource(TEST_KEY).for_domain("d")))
    MemFileSystem.clear()


def test_key_file_on_a_remote_filesystem(monkeypatch):
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    MemFileSystem.files["memfs://k/key"] = TEST_KEY.hex().encode()
    np.testing.assert_array_equal(_draw(NoiseKey(key_file="memfs://k/key", domain="d").load(keys.load_noise_source)),
                                  _draw(NoiseSource(TEST_KEY).for_domain("d")))
    MemFileSystem.clear()


@pytest.fixture
def without_google_cloud(monkeypatch):
    """Importing ``google.cloud.*`` fails, as without the ``gcp`` extra."""
    import builtins

    real_import = builtins.__import__

    def no_google(name, *args, **kwargs):
        if name.startswith("google.cloud"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_google)


@pytest.mark.usefixtures("without_google_cloud")
def test_secret_manager_without_the_gcp_extra_says_what_to_install():
    with pytest.raises(ImportError, match=r"beam_dp\[gcp\]"):
        keys.read_secret(SECRET)


class NotFound(Exception):
    """Stands for google.api_core.exceptions.NotFound (a secret version that does not exist)."""


class MissingSecret(FakeSecretManager):
    def access_secret_version(self, request):
        self.asked.append(request["name"])
        raise NotFound(f"Secret [{request['name']}] not found or has no versions.")


def _job(tmp_path) -> list[str]:
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1,0.5\nb,12,0.25\n")
    return [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", "--start=0", "--period=10", "--end=30",
            f"--noise-key-secret={SECRET}"]


@pytest.mark.parametrize("client,fix", [(FakeSecretManager(b"abcd"), "at least 64 hex digits"),
                                        (MissingSecret(b""), f"cannot read --noise-key-secret {SECRET}: NotFound")])
def test_a_missing_or_short_secret_is_one_line_at_launch(tmp_path, monkeypatch, capsys, client, fix):
    """Read at launch, as the workers would read it: exit 2 and one line before the pipeline starts
    (a worker's failure would be exit 1), the payload never shown."""
    monkeypatch.setattr(keys, "secret_manager_client", lambda: client)
    assert_usage_error(continual_stats.main, PROG, _job(tmp_path), fix, capsys)
    assert client.asked == [SECRET] and not (tmp_path / "out").exists()


@pytest.mark.usefixtures("without_google_cloud")
def test_a_secret_without_the_gcp_extra_is_one_line_naming_the_extra(tmp_path, capsys):
    assert_usage_error(continual_stats.main, PROG, _job(tmp_path), "pip install 'beam_dp[gcp]'", capsys)


def test_a_good_secret_is_read_at_launch_and_by_the_workers(tmp_path, monkeypatch, capsys):
    fake = FakeSecretManager(TEST_KEY.hex().encode())
    monkeypatch.setattr(keys, "secret_manager_client", lambda: fake)
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    assert continual_stats.main(_job(tmp_path)) == 0
    assert len(fake.asked) >= 2 and set(fake.asked) == {SECRET}  # the launch check, then each worker's setup
    assert TEST_KEY.hex() not in capsys.readouterr().out


def test_a_bad_secret_name_is_a_usage_error(capsys):
    assert_usage_error(continual_stats.main, PROG, ["--noise-key-secret=projects/p/secrets/s"], "versions/V", capsys)


def test_a_missing_key_file_is_a_usage_error(capsys):
    assert_usage_error(continual_stats.main, PROG, ["--noise-key-file=memfs://nowhere/key"], "does not exist",
                       capsys)


def test_streaming_job_without_a_key_refuses_to_start(monkeypatch, capsys):
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    assert_usage_error(continual_stats.main, PROG, STREAM, "--allow-random-noise-key", capsys)


def test_remote_runner_without_a_key_refuses_even_with_a_local_env_var(capsys):
    # the env var set here says nothing about the workers of a remote runner
    assert_usage_error(continual_stats.main, PROG, ["--runner=DataflowRunner", "--output=memfs://b/out"],
                       "a job on DataflowRunner needs a fixed noise key", capsys)


def _opts(**flags):
    base = dict(allow_random_noise_key=False, noise_key_secret=None, noise_key_file=None, noise_key_env=None)
    return SimpleNamespace(**{**base, **flags})


@pytest.mark.parametrize("runner", ["FnApiRunner", "DirectRunner", "BundleBasedDirectRunner"])
def test_local_batch_runs_need_no_key(monkeypatch, runner):
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    check_noise_key(_opts(), runner, streaming=False)


@pytest.mark.parametrize("flags", [dict(allow_random_noise_key=True), dict(noise_key_secret=SECRET),
                                   dict(noise_key_file="gs://b/key"), dict(noise_key_env="WORKER_KEY")])
def test_a_remote_job_starts_with_a_key_location_or_the_waiver(monkeypatch, flags):
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    check_noise_key(_opts(**flags), "DataflowRunner", streaming=True)


@pytest.mark.parametrize("runner,streaming", [("DataflowRunner", False), ("FlinkRunner", True),
                                              ("BundleBasedDirectRunner", True)])
def test_no_key_no_waiver_refused(monkeypatch, runner, streaming):
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    with pytest.raises(UsageError, match="needs a fixed noise key"):
        check_noise_key(_opts(), runner, streaming)


def test_the_key_never_enters_the_graph_the_options_or_the_logs(tmp_path, monkeypatch, capsys, caplog):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    key_file = tmp_path / "noise.key"
    key_file.write_bytes(TEST_KEY.hex().encode())
    monkeypatch.delenv("BEAM_DP_NOISE_KEY")
    events = tmp_path / "events.csv"
    events.write_text("stream_id,timestamp,value\na,1,0.5\nb,12,0.25\n")
    argv = [f"--input={events}", f"--output={tmp_path / 'out'}", "--start=0", "--period=10", "--end=30",
            f"--noise-key-file={key_file}", "--verbose"]
    options = PipelineOptions(argv)
    job = continual_stats.plan(options)
    pipeline = beam.Pipeline(options=options)
    continual_stats.build(pipeline, job, options.view_as(continual_stats.ContinualStatsOptions))
    graph = user_functions(pipeline.to_runner_api())
    secrets = (TEST_KEY, TEST_KEY.hex().encode(), TEST_KEY.hex().upper().encode())
    assert str(key_file).encode() in graph and not any(s in graph for s in secrets)
    assert not any(s.decode("latin-1") in str(options.get_all_options()) for s in secrets)
    with caplog.at_level(logging.DEBUG):
        assert continual_stats.main(argv) == 0
    said = capsys.readouterr()
    assert TEST_KEY.hex() not in said.out + said.err + caplog.text


def test_core_reads_the_key_file_through_the_reader_it_is_given(tmp_path):
    from beam_dp.core.noise import load_key

    asked = []
    assert load_key(None, "gs://b/k", read=lambda path: asked.append(path) or TEST_KEY.hex().encode()) == TEST_KEY
    assert asked == ["gs://b/k"]
    (tmp_path / "k").write_bytes(TEST_KEY)  # default reader: a local file (engine code without Beam, e.g. Flink)
    assert load_key(None, str(tmp_path / "k")) == TEST_KEY


def test_the_engine_independent_core_does_not_import_beam():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, beam_dp.core, beam_dp.core.noise, beam_dp.mechanisms; "
            "assert 'apache_beam' not in sys.modules, 'beam_dp.core imports Beam'")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
