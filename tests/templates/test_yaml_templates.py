"""Beam YAML provider and templates: the provider exposes the registry, each template's ``tests:``
block holds the pure mechanism's releases and passes under ``python -m apache_beam.yaml.main --test``,
templates run end to end on CSV files, and the family wrappers map rows and refuse bad configs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import jinja2
import numpy as np
import pytest
import yaml

from beam_dp.io import load_model, read_releases
from pipelines import yaml_transforms
from tests.beam.collect import run
from tests.conftest import TEST_KEY
from tests.release_checks import assert_release_matches
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
    known = {**yaml_transforms.REGISTRY, **yaml_transforms.SINKS}
    assert set(transforms) == set(known)
    for name, target in transforms.items():
        module, _, attr = target.rpartition(".")
        assert module == "pipelines.yaml_transforms" and getattr(yaml_transforms, attr) is known[name]


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_expectations_are_the_pure_mechanisms_releases(template):
    spec = _render(template, expectations.variables(template))
    assert spec["providers"] == [{"include": "providers.yaml"}]
    assert spec["tests"] == expectations.tests_block(template), (
        "the template's tests: block is stale (a mechanism changed?): rewrite it with "
        "BEAM_DP_NOISE_KEY=000102...1f python -m tests.templates.yaml_expectations --write")


@pytest.mark.parametrize("template", TEMPLATES)
def test_templates_never_hold_a_key(template):
    text = (YAML_DIR / f"{template}.yaml").read_text()
    assert not re.search(r"[0-9a-fA-F]{32,}", text)
    spec = _render(template, expectations.variables(template))
    [config] = [t["config"] for t in spec["pipeline"]["transforms"] if t["type"] in yaml_transforms.REGISTRY]
    assert set(config) & {"noise_key", "key"} == set() and config["noise_key_env"] == "BEAM_DP_NOISE_KEY"


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES)
def test_yaml_tests_block_passes(template):
    done = _yaml_main([f"--yaml_pipeline_file={template}.yaml", "--test",
                       f"--jinja_variables={json.dumps(expectations.variables(template))}"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Ran 1 test" in done.stderr and "OK" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("template,prefix", [("continual_sum", "sum"), ("continual_count", "count"),
                                             ("windowed_sum", "windowed")])
def test_sum_template_runs_on_a_csv_file_and_releases_the_pure_mechanisms_releases(template, prefix, tmp_path):
    events = tmp_path / "events.csv"
    events.write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,12.0,0.25\na,15.5,-0.75\nb,21.0,1.5\n"
                      "a,33.0,nan\nb,99.0,0.5\n")
    variables = dict(TEST_VARIABLES, input=str(events), output=str(tmp_path / "out"))
    done = _yaml_main([f"--yaml_pipeline_file={YAML_DIR / f'{template}.yaml'}",
                       f"--jinja_variables={json.dumps(variables)}"])
    assert done.returncode == 0, done.stderr[-3000:]
    got = sorted(read_releases(str(tmp_path / "out" / f"{prefix}-*")), key=lambda r: (r["stream"], r["step"]))
    want, _ = expectations.expectations(template, domain=got[0]["noise_domain"])
    assert len(got) == len(want)
    for row, expected in zip(got, want):  # floats within tolerance (tests/release_checks.py), the rest exactly
        assert_release_matches(row, expected)
    assert max(r["epsilon_spent"] for r in got) <= expectations._params(template).epsilon
    dead = [json.loads(line) for f in (tmp_path / "out.private").glob("dead_letter*") for line in f.read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == sorted(["after_end"] + ([] if template == "continual_count" else ["bad_value"]))
    # named like every job's dead letters: one .jsonl file (written even when empty, see WriteDeadLettersYaml)
    assert [p.name for p in (tmp_path / "out.private").glob("dead_letter*")] == ["dead_letter-00000-of-00001.jsonl"]


def test_streaming_template_translates_to_pubsub_in_and_out(monkeypatch):
    """The streaming template expands into a streaming pipeline that reads and writes Pub/Sub
    (translated to the Runner API offline, never run)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.yaml import yaml_transform

    variables = dict(TEST_VARIABLES, subscription="projects/my-project/subscriptions/events",
                     releases_topic="projects/my-project/topics/releases",
                     dead_letter_topic="projects/my-project/topics/dead-letters",
                     noise_key_secret="projects/my-project/secrets/dp-key/versions/1")
    variables.pop("end")
    text = (YAML_DIR / "streaming_continual_sum.yaml").read_text().split(expectations.MARKER)[0]
    text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text).render(**variables)
    monkeypatch.chdir(YAML_DIR)  # the provider include is relative
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True))
    yaml_transform.expand_pipeline(pipeline, text)
    leaves = {t.unique_name: t.spec.urn for t in pipeline.to_runner_api().components.transforms.values()
              if not t.subtransforms}
    assert leaves["ReadEvents/ReadFromPubSub/Read"] == "beam:transform:pubsub_read:v1"
    for sink in ("WriteReleases", "WriteDeadLetters"):  # Beam's Pub/Sub sink (Dataflow swaps in its native one)
        assert f"{sink}/WriteToPubSub/ParDo(_PubSubWriteDoFn)" in leaves
    assert any(name.startswith("ContinualSum/") and "Release" in name for name in leaves)
    assert any(name.startswith("WithReleaseId/") for name in leaves)  # the (stream, step) id attribute
    # the template exposes the grace and the stream groups (256 by default: a group-keyed release stage)
    assert any(name.startswith("ContinualSum/") and "256 stream groups" in name for name in leaves)


@pytest.mark.slow
def test_model_release_template_writes_models_that_load_back(tmp_path):
    rows = expectations.EXAMPLES
    lines = ["stream_id,x_0,x_1,label"] + [
        ",".join("" if r[k] is None else str(r[k]) for k in ("stream_id", "x_0", "x_1", "label")) for r in rows]
    (tmp_path / "examples.csv").write_text("\n".join(lines) + "\n")
    variables = dict(expectations.variables("model_release"), input=str(tmp_path / "examples.csv"),
                     output=str(tmp_path / "out"))
    done = _yaml_main([f"--yaml_pipeline_file={YAML_DIR / 'model_release.yaml'}",
                       f"--jinja_variables={json.dumps(variables)}"])
    assert done.returncode == 0, done.stderr[-3000:]
    got = read_releases(str(tmp_path / "out" / "models-*"))
    want, _ = expectations.expectations("model_release", domain=got[0]["noise_domain"])
    assert [(r["stream"], r["step"]) for r in got] == [(r["stream"], r["step"]) for r in want]
    for g, w in zip(got, want):  # one flat schema: parts name the model's arrays inside value
        np.testing.assert_allclose(g["value"], w["value"], rtol=1e-9, atol=1e-12)  # solver + libm: last bits
        assert g["parts"] == w["parts"] and g["shape"] == []
        assert g["epsilon_spent"] == w["epsilon_spent"] <= variables["epsilon"]
    model = load_model(got[-1])
    assert set(model.predict(np.array([[0.5, 0.25], [-0.5, 0.5]]))) <= {"a", "b", "c"}
    dead = [json.loads(line) for f in (tmp_path / "out.private").glob("dead_letter*") for line in f.read_text().splitlines()]
    assert len(dead) == 3 and "bad_label" in {d["reason"] for d in dead}  # CSV blanks read as NaN: non_finite


def test_growing_db_takes_one_input_split_by_query_id():
    """The single-input form (e.g. one Pub/Sub topic): rows with a query_id are queries."""
    nulls = {"query_id": None, "t": None, "predicate": None, "indices": None, "timestamp": None, "colour": None,
             "size": None}
    rows = [dict(nulls, **r) for r in expectations.DB_ELEMENTS + expectations.DB_QUERIES]
    v = expectations.variables("growing_db_queries")
    config = {k: v[k] for k in ("universe", "n", "epsilon", "start", "period", "end")}
    got = run(lambda p: (p | beam.Create(rows) | yaml_transforms.GrowingDatabaseQueriesYaml(**config))["releases"])
    want, _ = expectations.expectations("growing_db_queries", domain=got[0].noise_domain)
    got = sorted((r._asdict() for r in got), key=lambda r: (r["stream"], r["step"], r["meta"]))
    assert [dict(g, value=None) for g in got] == [dict(w, value=None) for w in want]
    np.testing.assert_allclose([g["value"] for g in got], [w["value"] for w in want], rtol=1e-12, atol=1e-12)


def test_growing_db_refuses_badly_named_inputs():
    v = expectations.variables("growing_db_queries")
    config = {k: v[k] for k in ("universe", "n", "epsilon", "start", "period", "end")}
    with pytest.raises(ValueError, match="elements and queries"):
        with beam.Pipeline() as p:
            rows = p | beam.Create([{"stream_id": "a"}])
            _ = {"elements": rows, "asks": rows} | yaml_transforms.GrowingDatabaseQueriesYaml(**config)


@pytest.mark.parametrize("name,config,match", [
    ("ContinualModelRelease", dict(dim=2, epsilon=1.0, update_size=2, base_size=3), "multiple"),
    ("ContinualModelRelease", dict(dim=2, epsilon=-1.0, update_size=2, base_size=4), "epsilon"),
    ("ContinualModelRelease", dict(dim=2, n_features=2, epsilon=1.0, update_size=2, base_size=4), "n_features"),
    ("OnlineLearner", dict(dim=2, epsilon=1.0, window=4, constraint="cube"), "cube"),
    ("IncrementalRegression", dict(dim=2, epsilon=1.0, delta=1e-6), "block_size"),
    ("GrowingDatabaseQueries", dict(universe="{not json", n=4, epsilon=1.0, start=0, period=10, end=40), "universe"),
    ("GrowingDatabaseQueries", dict(universe={"colour": "red"}, n=4, epsilon=1.0, start=0, period=10), "colour"),
])
def test_family_wrappers_refuse_invalid_configs(name, config, match):
    with pytest.raises(ValueError, match=match):
        yaml_transforms.REGISTRY[name](**config)


@pytest.mark.parametrize("name", sorted(yaml_transforms.REGISTRY))
def test_beam_yaml_reads_each_wrappers_config_schema(name):
    from apache_beam.yaml.yaml_provider import InlineProvider

    factory = yaml_transforms.REGISTRY[name]
    schema = InlineProvider.config_schema_from_callable(factory)
    names = [f.name for f in schema.fields]
    assert "noise_key_env" in names and "noise_key_file" in names and not {"noise_key", "key"} & set(names)
    documented = {f.name for f in schema.fields if f.description}
    assert documented == set(names), f"{name}: undocumented config {set(names) - documented}"
