"""The verifier on every YAML template's honest output (issue 23, "Done when"): ``python -m
pipelines.run_yaml`` writes the job's manifest beside the releases of each file-writing template, and
``python -m beam_dp.verify <folder>`` passes on it; a doctored YAML output fails. The streaming
template writes to Pub/Sub only: no folder, so no manifest (tested on its built graph)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from beam_dp.io.manifest import MANIFEST_NAME, read_manifest
from beam_dp.verify import main as verify_main
from pipelines.run_yaml import main as run_yaml
from tests.conftest import TEST_KEY
from tests.templates import yaml_expectations as expectations
from tests.verify.test_verify_doctored import _doctor

pytestmark = pytest.mark.pipeline

YAML_DIR = Path(__file__).resolve().parents[2] / "templates" / "yaml"

#: template -> (rows of its CSV input, the file prefix its releases are written to)
SUM_EVENTS = [{k: ("nan" if v is None else v) for k, v in row.items()} for row in expectations.EVENTS]
TEMPLATES = {
    "continual_sum": (SUM_EVENTS, "sum"),
    "continual_count": (SUM_EVENTS, "count"),
    "windowed_sum": (SUM_EVENTS, "windowed"),
    "model_release": (expectations.EXAMPLES, "models"),
    "online_learner": (expectations.ONLINE_ROWS, "models"),
    "incremental_regression": (expectations.REGRESSION_ROWS, "models"),
    "growing_db_queries": (expectations.DB_ELEMENTS, "answers"),
}


def _csv(path: Path, rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, columns)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return str(path)


def _run_template(template: str, tmp_path: Path, monkeypatch) -> Path:
    rows, _ = TEMPLATES[template]
    out = tmp_path / "out"
    variables = dict(expectations.variables(template), input=_csv(tmp_path / "input.csv", rows), output=str(out))
    if template == "growing_db_queries":
        variables["queries"] = _csv(tmp_path / "queries.csv", expectations.DB_QUERIES)
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    monkeypatch.chdir(YAML_DIR)  # the templates include providers.yaml by a relative path
    assert run_yaml([f"--yaml_pipeline_file={template}.yaml", f"--jinja_variables={json.dumps(variables)}"]) == 0
    return out


def _verdict(folder: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = verify_main([str(folder)])
    return code, capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_each_templates_honest_output_has_a_manifest_and_verifies(template, tmp_path, monkeypatch, capsys):
    out = _run_template(template, tmp_path, monkeypatch)
    manifest = read_manifest(str(out))
    assert manifest.job == template and len(manifest.transforms) == 1
    assert manifest.transforms[0].files == (TEMPLATES[template][1],)
    code, said = _verdict(out, capsys)
    assert code == 0 and said.rstrip().endswith("verified: within the job's total"), said


def test_a_doctored_yaml_output_fails(tmp_path, monkeypatch, capsys):
    """The continual_sum template's honest folder verifies; with every ``epsilon_spent`` set to 0 (the
    noise declaration still says what was drawn) or its release file removed, it does not."""
    out = _run_template("continual_sum", tmp_path, monkeypatch)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("dead_letter")) == [
        MANIFEST_NAME, "sum-00000-of-00001.parquet"]
    assert _verdict(out, capsys)[0] == 0
    _doctor(str(out), "sum", "epsilon_spent", 0.0)
    code, said = _verdict(out, capsys)
    assert code == 1 and "below the spend recomputed from its noise declaration" in said, said
    (out / "sum-00000-of-00001.parquet").unlink()
    code, said = _verdict(out, capsys)
    assert code == 1 and "release files" in said and "are missing" in said, said


def test_releases_to_several_folders_are_refused(tmp_path, monkeypatch, capsys):
    """One manifest declares one folder's files: a pipeline writing its releases to two folders is
    refused before it runs (exit 2, nothing written)."""
    text = (YAML_DIR / "continual_sum.yaml").read_text().split(expectations.MARKER)[0]
    text = text.replace("""    - type: WriteDeadLetters""", """    - type: WriteToJson
      name: WriteCopy
      input: ContinualSum.releases
      config:
        path: "{{ output }}2/sum"
    - type: WriteDeadLetters""")
    (tmp_path / "two.yaml").write_text(text.replace("include: providers.yaml", f"include: {YAML_DIR / 'providers.yaml'}"))
    variables = dict(expectations.TEST_VARIABLES, input=_csv(tmp_path / "input.csv", SUM_EVENTS),
                     output=str(tmp_path / "out"))
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    with pytest.raises(SystemExit) as ended:  # one line, exit 2 (beam_dp.cli.guarded)
        run_yaml([f"--yaml_pipeline_file={tmp_path / 'two.yaml'}", f"--jinja_variables={json.dumps(variables)}"])
    assert ended.value.code == 2 and "several folders" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
