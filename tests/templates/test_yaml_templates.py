"""Beam YAML provider and templates: the provider exposes the registry, each template's ``tests:``
block holds the pure mechanism's releases and passes under ``python -m apache_beam.yaml.main --test``,
and a template runs end to end on a CSV file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest
import yaml

from beam_dp.io import read_releases
from pipelines import yaml_transforms
from tests.conftest import TEST_KEY
from tests.templates import yaml_expectations as expectations
from tests.templates.yaml_expectations import TEST_VARIABLES

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
YAML_DIR = ROOT / "templates" / "yaml"
TEMPLATES = list(expectations.TEMPLATES)


def _render(template: str, variables: dict) -> dict:
    text = (YAML_DIR / f"{template}.yaml").read_text()
    return yaml.safe_load(jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text).render(**variables))


def _yaml_main(args: list[str]) -> subprocess.CompletedProcess:
    """``python -m apache_beam.yaml.main`` from templates/yaml (Beam resolves a provider ``include``
    against the working directory in --test mode and against the pipeline file otherwise)."""
    env = dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "apache_beam.yaml.main", *args], cwd=YAML_DIR, env=env,
                          capture_output=True, text=True, timeout=300)


def test_provider_exposes_every_registered_transform_in_process():
    providers = yaml.safe_load((YAML_DIR / "providers.yaml").read_text())
    assert len(providers) == 1
    provider = providers[0]
    assert provider["type"] == "python" and "packages" not in provider  # in-process: no run-time installs
    transforms = provider["transforms"]
    assert set(transforms) == set(yaml_transforms.REGISTRY)
    for name, target in transforms.items():
        module, _, attr = target.rpartition(".")
        assert module == "pipelines.yaml_transforms" and getattr(yaml_transforms, attr) is yaml_transforms.REGISTRY[name]


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_expectations_are_the_pure_mechanisms_releases(template):
    spec = _render(template, TEST_VARIABLES)
    assert spec["providers"] == [{"include": "providers.yaml"}]
    assert spec["tests"] == expectations.tests_block(template), (
        "the template's tests: block is stale (a mechanism changed?): rewrite it with "
        "BEAM_DP_NOISE_KEY=000102...1f python -m tests.templates.yaml_expectations --write")


@pytest.mark.parametrize("template", TEMPLATES)
def test_templates_never_hold_a_key(template):
    text = (YAML_DIR / f"{template}.yaml").read_text()
    assert not re.search(r"[0-9a-fA-F]{32,}", text)
    spec = _render(template, TEST_VARIABLES)
    config = spec["pipeline"]["transforms"][1]["config"]
    assert set(config) & {"noise_key", "key"} == set() and config["noise_key_env"] == "BEAM_DP_NOISE_KEY"


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES)
def test_yaml_tests_block_passes(template):
    done = _yaml_main([f"--yaml_pipeline_file={template}.yaml", "--test",
                       f"--jinja_variables={json.dumps(TEST_VARIABLES)}"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Ran 1 test" in done.stderr and "OK" in done.stderr


@pytest.mark.slow
def test_continual_sum_template_runs_on_a_csv_file(tmp_path):
    events = tmp_path / "events.csv"
    events.write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\na,15.5,-0.75\nb,21.0,1.5\n"
                      "a,33.0,nan\nb,99.0,0.5\n")
    variables = dict(TEST_VARIABLES, input=str(events), output=str(tmp_path / "out"))
    done = _yaml_main([f"--yaml_pipeline_file={YAML_DIR / 'continual_sum.yaml'}",
                       f"--jinja_variables={json.dumps(variables)}"])
    assert done.returncode == 0, done.stderr[-3000:]
    got = read_releases(str(tmp_path / "out" / "sum-*"))
    want = expectations.tests_block("continual_sum")[0]["expected_inputs"][0]["elements"]
    assert [(r["stream"], r["step"]) for r in got] == [(r["stream"], r["step"]) for r in want]
    np.testing.assert_array_equal([r["value"] for r in got], [r["value"] for r in want])
    assert [r["epsilon_spent"] for r in got] == [r["epsilon_spent"] for r in want]
    assert max(r["epsilon_spent"] for r in got) <= expectations._params("continual_sum").epsilon
    dead = [json.loads(line) for f in (tmp_path / "out").glob("dead_letter*") for line in f.read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == ["after_end", "bad_value"]
