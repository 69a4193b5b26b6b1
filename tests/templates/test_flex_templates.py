"""Dataflow Flex Templates: metadata is generated from the job's parameter spec (and agrees with its
flags), parameter regexes accept good values and reject bad ones (Pub/Sub names as Beam parses them),
the one Dockerfile points at files that exist for every job, and the entry point runs locally as the
launcher would run it (``python main.py --param=value ...``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beam_dp.io import read_releases
from pipelines import spec
from pipelines.runner import options_class
from tests.pipelines.jobs_helpers import dead_letters

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
FLEX = ROOT / "templates" / "flex"
JOBS = sorted(spec.JOBS)

GOOD = {"input": "gs://my-bucket/events/*.csv", "output": "gs://my-bucket/out", "source": "pubsub", "epsilon": "0.5",
        "clip_bound": "2", "start": "1767225600", "period": "3600", "end": "1768435200", "window": "24",
        "dim": "3", "delta": "1e-6", "noise_key_file": "gs://my-bucket/keys/noise.key",
        "noise_key_env": "BEAM_DP_NOISE_KEY", "noise_key_secret": "projects/my-project/secrets/dp-key/versions/1",
        "pubsub_subscription": "projects/my-project/subscriptions/events-sub",
        "pubsub_topic": "projects/my-project/topics/events", "kafka_bootstrap_servers": "k1:9092,k2:9092",
        "streams": "shop-01,shop-02", "noise": "gaussian", "algorithm": "cocol", "classes": "a,b,c",
        "update_size": "64", "queries": "gs://my-bucket/queries.jsonl", "mechanism": "pmwg",
        "universe": '{"colour": ["red", "blue"]}', "learner": "regression", "tasks": "t0,t1", "sampling": "true",
        "eval_input": "gs://my-bucket/eval.csv", "device": "cpu", "constraint": "l1_ball", "counter": "blt",
        "streaming": "true", "verbose": "false", "allow_random_noise_key": "true", "xi_n": "0.5", "m": "8"}
BAD = {"input": "local/file.csv", "output": "s3://b/out", "source": "files;rm", "epsilon": "abc",
       "clip_bound": "abc", "start": "yesterday", "period": "0x10", "window": "0", "dim": "1.5",
       "noise_key_file": "key with spaces", "noise_key_env": "lower", "streams": ",",
       "noise_key_secret": "projects/p/secrets/s", "pubsub_subscription": "projects/p/topics/t",
       "pubsub_topic": "projects/Bad_Project/topics/t", "kafka_bootstrap_servers": "k1", "noise": "laplace",
       "algorithm": "sgd", "classes": "a,,b", "update_size": "-3", "queries": "queries.csv", "mechanism": "mwem",
       "universe": "colour=red", "learner": "deep", "tasks": "", "sampling": "yes", "eval_input": "e.csv",
       "device": "tpu", "constraint": "sphere", "counter": "fast", "streaming": "on", "m": "0"}
#: GOOD values that belong to another job's flag of the same name (e.g. ERM's --algorithm)
GOOD_ELSEWHERE = {("model_release", "algorithm"), ("lifelong", "learner")}


def _metadata(job: str) -> dict:
    return json.loads((FLEX / job / "metadata.json").read_text())


def _job_flags(job: str) -> set[str]:
    parser = argparse.ArgumentParser()
    options_class(job)._add_argparse_args(parser)  # pylint: disable=protected-access
    return {s for a in parser._actions for s in a.option_strings}  # pylint: disable=protected-access


@pytest.mark.parametrize("job", JOBS)
def test_metadata_file_is_the_one_generated_from_the_spec(job):
    import importlib

    description = importlib.import_module(f"pipelines.{job}").__doc__.split("\n\n")[0]
    assert _metadata(job) == spec.flex_metadata(job, description), "run: python -m pipelines.spec"


@pytest.mark.parametrize("job", JOBS)
def test_metadata_is_valid_and_every_parameter_is_a_flag_of_the_job(job):
    meta = _metadata(job)
    assert meta["name"] and meta["description"]
    assert meta["defaultStreamingMode"] in ("EXACTLY_ONCE", "AT_LEAST_ONCE")  # the documented values
    assert meta["supportsAtLeastOnce"] and meta["supportsExactlyOnce"]  # defaultStreamingMode needs both
    names = [p["name"] for p in meta["parameters"]]
    assert len(names) == len(set(names)) and "streaming" in names
    flags = _job_flags(job) | {"--streaming"}  # Beam's own flag; the runner accepts --streaming=true|false
    for param in meta["parameters"]:
        assert set(param) <= {"name", "label", "helpText", "isOptional", "regexes", "paramType"}
        assert re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_]*", param["name"]) and param["label"] and param["helpText"]
        assert isinstance(param["isOptional"], bool)
        assert f"--{param['name']}" in flags, f"{param['name']} is not a flag of {job}"
        assert param["regexes"] and all(re.compile(r) for r in param["regexes"])
        if "key" in param["name"]:  # the secret key travels by location only
            assert param["name"].endswith(("_file", "_env", "_secret", "random_noise_key"))


@pytest.mark.parametrize("job", JOBS)
def test_parameter_regexes_accept_good_values_and_reject_bad_ones(job):
    params = {p["name"]: p for p in _metadata(job)["parameters"]}
    checked = 0
    for name, value in GOOD.items():
        if name in params and (job, name) not in GOOD_ELSEWHERE:
            checked += 1
            assert all(re.fullmatch(r, value) for r in params[name]["regexes"]), (name, value)
    for name, value in BAD.items():
        if name in params:
            assert not all(re.fullmatch(r, value) for r in params[name]["regexes"]), (name, value)
    assert checked >= 8 and {"output", "epsilon", "noise_key_file", "noise_key_secret"} <= set(params)


@pytest.mark.parametrize("value", ["projects/my-project/topics/events", "projects/a-b:c.d9/topics/T.x~+%",
                                   "projects/p/topics/t", "projects/My-Project/topics/events",
                                   "projects/my-project/topics/", "projects/my-project/subscriptions/s-1",
                                   "projects/my-project/topics/a/b"])
def test_pubsub_regexes_accept_only_what_beam_accepts(value):
    from apache_beam.io.gcp.pubsub import parse_subscription, parse_topic

    params = {p["name"]: p["regexes"][0] for p in _metadata("continual_stats")["parameters"]}
    for name, parse in (("pubsub_topic", parse_topic), ("pubsub_subscription", parse_subscription)):
        if re.fullmatch(params[name], value):
            parse(value)  # raises ValueError if Beam would refuse what the template accepted


def test_one_dockerfile_serves_every_job():
    assert sorted(p.name for p in FLEX.glob("*/Dockerfile")) == []
    dockerfile = (FLEX / "Dockerfile").read_text()
    env = dict(re.findall(r'^ENV (\w+)="\$\{WORKDIR\}/([^"]+)"', dockerfile, flags=re.M))
    assert set(env) == {"FLEX_TEMPLATE_PYTHON_PY_FILE", "FLEX_TEMPLATE_PYTHON_REQUIREMENTS_FILE",
                        "FLEX_TEMPLATE_PYTHON_SETUP_FILE"}
    for job in JOBS:
        for path in env.values():
            assert (ROOT / path.replace("${JOB}", job)).is_file(), path
    import apache_beam

    pins = (FLEX / "requirements.txt").read_text()
    assert f"apache-beam[gcp]=={apache_beam.__version__}" in pins  # launcher and workers on the tested Beam
    assert "BEAM_DP_NOISE_KEY=" not in dockerfile and not re.search(r"[0-9a-f]{32,}", dockerfile)
    assert "--dockerfile" not in dockerfile  # current gcloud has no such flag (docs/engines.md)


def _launch(job: str, params: dict, tmp_path) -> subprocess.CompletedProcess:
    """Run the entry point as the Flex Template launcher does: ``python <py file> --name=value ...``."""
    args = [f"--{k}={v}" for k, v in params.items()]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(FLEX / job / "main.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_continual_stats_entry_point_runs_with_template_parameters(tmp_path):
    rng = np.random.default_rng(2)
    lines = ["stream_id,timestamp,value_0"] + [f"s{i % 2},{100 + 50 * rng.random()!r},{rng.normal()!r}"
                                                for i in range(40)] + ["s0,120.0,bad"]
    (tmp_path / "events.csv").write_text("\n".join(lines) + "\n")
    params = {"input": tmp_path / "events.csv", "output": tmp_path / "out", "epsilon": 1.0, "clip_bound": 1.0,
              "start": 100, "period": 5, "end": 150, "window": 4, "noise_key_env": "BEAM_DP_NOISE_KEY"}
    done = _launch("continual_stats", params, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sum: 20 releases" in done.stdout and "windowed: 20 releases" in done.stdout
    assert len(read_releases(str(tmp_path / "out" / "sum-*"))) == 20
    assert dead_letters(tmp_path / "out") == {"read:malformed": 1}  # in out.private, never in the summary
    assert "malformed" not in done.stdout


def test_model_release_entry_point_runs_with_template_parameters(tmp_path):
    rng = np.random.default_rng(3)
    lines = ["stream_id,x_0,x_1,label"] + [f"s{i % 2},{rng.normal()!r},{rng.normal()!r},{'ab'[i % 3 == 0]}"
                                           for i in range(40)] + ["s0,0.1,0.2,z"]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    params = {"input": tmp_path / "train.csv", "output": tmp_path / "out", "epsilon": 1.0, "classes": "a,b",
              "algorithm": "sliding", "block_size": 4, "window": 12, "clip_bound": 1.0}
    done = _launch("model_release", params, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "models: 6 releases" in done.stdout and "bad_label" not in done.stdout
    assert dead_letters(tmp_path / "out") == {"models:bad_label": 1}
    assert len(read_releases(str(tmp_path / "out" / "models-*"))) == 6


@pytest.mark.parametrize("job", sorted(JOBS))
def test_unknown_template_parameter_is_a_one_line_error_with_exit_code_2(job, tmp_path):
    done = _launch(job, {"output": tmp_path, "epsilon": 1.0, "epsilonn": 2}, tmp_path)
    assert done.returncode == 2
    err = [line for line in done.stderr.splitlines() if "apitools" not in line]
    assert err == [f"python -m pipelines.{job}: error: unknown flag --epsilonn (see --help for this "
                   "job's flags; any Apache Beam pipeline option is accepted too)"]
