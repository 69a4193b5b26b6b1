"""Named noise key sources: one at most, and a named one that is missing or unusable is exit 2 at launch
for every command (the five jobs, the YAML provider, the Flink entry); the random key (with its warning)
only when no source is named. Key file format (``beam_dp.core.noise.load_key``): hex text of at least
64 hex digits (whitespace ignored) or at least 32 raw bytes; a file that reads as text must be hex.

Mutant checked: accepting printable text as a raw key (the former rule) makes the ``"z" * 80`` cases
pass the launch check and these tests fail."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from beam_dp.core.noise import KEY_ENV_VAR, NoiseSource, load_key
from pipelines import continual_stats, growing_db_queries, lifelong, model_release, online_learning
from pipelines.common import check_key_sources
from pipelines.runner import UsageError
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error

pytestmark = pytest.mark.pipeline

JOBS = {"continual_stats": continual_stats, "model_release": model_release,
        "growing_db_queries": growing_db_queries, "online_learning": online_learning, "lifelong": lifelong}


def _key_file(tmp_path, content: bytes, name: str = "noise.key") -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_named_env_var_that_is_not_set_is_exit_2_for_every_job(job, tmp_path, capsys):
    assert_usage_error(JOBS[job].main, f"python -m pipelines.{job}",
                       [f"--output={tmp_path / 'out'}", "--noise-key-env=NOPE_NOT_SET"],
                       "the env var NOPE_NOT_SET is not set", capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("job", sorted(JOBS))
def test_text_that_is_not_hex_is_refused_as_a_key_file_by_every_job(job, tmp_path, capsys):
    key = _key_file(tmp_path, b"z" * 80)
    assert_usage_error(JOBS[job].main, f"python -m pipelines.{job}",
                       [f"--output={tmp_path / 'out'}", f"--noise-key-file={key}"], "text but not hex", capsys)


@pytest.mark.parametrize("flags", [("file", "env"), ("secret", "file"), ("secret", "env")])
def test_two_key_sources_are_a_usage_error(tmp_path, capsys, flags):
    given = {"file": f"--noise-key-file={_key_file(tmp_path, TEST_KEY.hex().encode())}",
             "env": f"--noise-key-env={KEY_ENV_VAR}",
             "secret": "--noise-key-secret=projects/p/secrets/s/versions/1"}
    names = {"file": "--noise-key-file", "env": "--noise-key-env", "secret": "--noise-key-secret"}
    assert_usage_error(continual_stats.main, "python -m pipelines.continual_stats",
                       [f"--output={tmp_path / 'out'}", *(given[f] for f in flags)],
                       f"give one noise key source, not {' and '.join(names[f] for f in flags)}", capsys)


@pytest.mark.parametrize("content, fix", [
    (b"z" * 80, "text but not hex"),
    (b"correct horse battery staple, a long passphrase\n", "text but not hex"),
    (b"0" * 62, "has 62 hex digits"),
    (b"a" * 65, "has 65 hex digits"),
    (b"", "is empty"),
    (bytes(range(200, 231)), "has 31 raw bytes"),
])
def test_unusable_key_files_are_refused_with_the_rule(tmp_path, content, fix):
    with pytest.raises(ValueError, match=fix) as exc:
        load_key(None, _key_file(tmp_path, content))
    assert "at least 64 hex digits or at least 32 raw bytes" in str(exc.value)


@pytest.mark.parametrize("content", [
    TEST_KEY.hex().encode(),
    TEST_KEY.hex().upper().encode() + b"\r\n",
    TEST_KEY.hex()[:60].encode() + b"\n" + TEST_KEY.hex()[60:].encode() + b"\n",  # `xxd -p` wraps at 60 digits
    TEST_KEY,  # raw bytes
])
def test_hex_and_raw_key_files_are_read(tmp_path, content):
    assert load_key(None, _key_file(tmp_path, content)) == TEST_KEY


def test_a_named_source_never_falls_back_to_a_random_key(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(KEY_ENV_VAR)
    with pytest.raises(ValueError, match="NOPE_NOT_SET is not set"):
        NoiseSource.from_config("NOPE_NOT_SET")
    with pytest.raises(ValueError, match="cannot read the noise key file"):
        NoiseSource.from_config(None, str(tmp_path / "missing.key"))
    with caplog.at_level(logging.WARNING, logger="beam_dp.core.noise"):  # nothing named: random, said
        NoiseSource.from_config()
    assert "random key" in caplog.text


def test_the_launch_check_on_a_remote_runner_leaves_an_unset_env_var_to_the_workers(monkeypatch):
    monkeypatch.delenv(KEY_ENV_VAR)
    check_key_sources(None, None, "WORKER_KEY", local=False)
    with pytest.raises(UsageError, match="WORKER_KEY is not set"):
        check_key_sources(None, None, "WORKER_KEY", local=True)
    monkeypatch.setenv("WORKER_KEY", "ab" * 16)  # set here: checked, too short
    with pytest.raises(UsageError, match="has 32 hex digits"):
        check_key_sources(None, None, "WORKER_KEY", local=False)
    check_key_sources(None, None, None, local=True)  # nothing named: the random key, no error


def test_the_yaml_provider_refuses_two_sources_and_a_bad_key_file(tmp_path):
    from pipelines.yaml_transforms import ContinualSumYaml

    base = dict(epsilon=1.0, clip_bound=1.0, start=0, period=10, end=30)
    good = _key_file(tmp_path, TEST_KEY.hex().encode(), "good.key")
    with pytest.raises(ValueError, match="give one noise key source, not noise_key_file and noise_key_env"):
        ContinualSumYaml(**base, noise_key_file=good, noise_key_env="OTHER_KEY")
    with pytest.raises(ValueError, match="text but not hex"):
        ContinualSumYaml(**base, noise_key_file=_key_file(tmp_path, b"z" * 80))
    assert ContinualSumYaml(**base, noise_key_file=good) is not None


def test_the_flink_entry_refuses_a_bad_key_file_in_one_line(tmp_path, capsys):
    from beam_dp.flink import run

    (tmp_path / "e.csv").write_text("stream_id,timestamp,value\na,1,0.5\n")
    argv = [f"--input={tmp_path / 'e.csv'}", f"--output={tmp_path / 'out'}", "--start=0", "--period=10",
            "--end=30", f"--key-file={_key_file(tmp_path, b'z' * 80)}"]
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "text but not hex" in err, err


def test_a_key_file_wins_over_the_default_env_var_and_draws_its_noise(tmp_path, monkeypatch):
    """The default env var (set in the shell, not named) gives way to a named key file."""
    other = bytes(range(100, 132))
    monkeypatch.setenv(KEY_ENV_VAR, other.hex())
    from beam_dp.io.keys import load_noise_source

    source = load_noise_source(KEY_ENV_VAR, _key_file(tmp_path, TEST_KEY), None)
    draw = source.gaussian("s", "n", (1,), 1.0, 4)
    np.testing.assert_array_equal(draw, NoiseSource(TEST_KEY).gaussian("s", "n", (1,), 1.0, 4))
    assert os.environ[KEY_ENV_VAR] == other.hex()
