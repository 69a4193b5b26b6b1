"""``run_yaml``: the ``output`` folder holds beam_dp releases only. A YAML pipeline writing dead
letters, the raw input, or raw rows mapped to look like releases under ``output`` is refused before
it runs (exit 2, one line, nothing written); every shipped template passes the same check."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import TEST_KEY
from tests.templates.yaml_expectations import TEMPLATES
from tests.templates.yaml_expectations import variables as variables_for

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "templates" / "yaml"
SUM = (YAML / "continual_sum.yaml").read_text()
DEAD = "{{ dead_letter_output | default(output ~ '.private') }}/dead_letter"

#: name -> the continual_sum template edited to write something other than releases under {{ output }}
RAW_UNDER_OUTPUT = {
    "dead_letters_by_beam_dp_sink": SUM.replace(DEAD, "{{ output }}/dead_letter"),
    "dead_letters_as_json": SUM.replace("""    - type: WriteDeadLetters
      name: WriteDeadLetters""", """    - type: WriteToJson
      name: WriteDeadLetters""").replace(DEAD, "{{ output }}/dead_letter"),
    "raw_input_as_csv": SUM.replace("""providers:""", """    - type: WriteToCsv
      name: CopyInput
      input: ReadEvents
      config:
        path: "{{ output }}/copy"
providers:"""),
    "raw_rows_mapped_like_releases": SUM.replace("""providers:""", """    - type: MapToFields
      name: LookLikeReleases
      input: ReadEvents
      config:
        language: python
        fields:
          stream: stream_id
          step: "1"
          value: "[value_0]"
    - type: WriteToParquet
      name: WriteFake
      input: LookLikeReleases
      config:
        path: "{{ output }}/fake"
        file_name_suffix: .parquet
providers:"""),
}


def _refusal(tmp_path: Path, text: str, variables: dict) -> subprocess.CompletedProcess:
    (tmp_path / "providers.yaml").symlink_to(YAML / "providers.yaml")
    (tmp_path / "t.yaml").write_text(text)
    return subprocess.run([sys.executable, "-m", "pipelines.run_yaml", f"--yaml_pipeline_file={tmp_path / 't.yaml'}",
                           f"--jinja_variables={json.dumps(variables)}"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, BEAM_DP_NOISE_KEY=TEST_KEY.hex(), PYTHONPATH=str(ROOT)), timeout=300)


def test_dead_letters_under_output_are_refused_before_running(tmp_path):
    (tmp_path / "e.csv").write_text("stream_id,timestamp,value_0\na,1.0,0.5\nb,99.0,0.5\n")
    variables = dict(variables_for("continual_sum"), input=str(tmp_path / "e.csv"), output=str(tmp_path / "out"))
    done = _refusal(tmp_path, RAW_UNDER_OUTPUT["dead_letters_by_beam_dp_sink"], variables)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert done.stderr.startswith("python -m pipelines.run_yaml: error: WriteDeadLetters")
    assert "holds the releases only" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.csv", "providers.yaml", "t.yaml"]  # nothing written


def _inputs(text: str, folder: Path) -> dict:
    """The template's mocked reads (its ``tests:`` block) written as CSV files: ``{variable: path}``."""
    mocks = yaml.safe_load(text[text.index("\ntests:"):])["tests"][0]["mock_outputs"]
    found = {}
    for mock in mocks:
        variable = re.search(rf'name: {mock["name"]}\n\s+config:\n\s+path: "{{{{ (\w+) }}}}"', text).group(1)
        rows = mock["elements"]
        columns = list(dict.fromkeys(k for row in rows for k in row))
        path = folder / f"{variable}.csv"
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, columns)
            writer.writeheader()
            writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
        found[variable] = str(path)
    return found


def _check(text: str, variables: dict, cwd: Path) -> None:
    """The launch check of run_yaml: build the plan pipeline (never run), then the location rules."""
    from pipelines.run_yaml import _jinja_variables, _locations, _plan, _with

    old = os.getcwd()
    os.chdir(cwd)
    try:
        argv, variables = _jinja_variables([f"--yaml_pipeline_file={text}",
                                            f"--jinja_variables={json.dumps(variables)}"])
        _, _, folders, raw = _plan(_with(argv, variables))
        _locations(variables, folders, raw)
    finally:
        os.chdir(old)


@pytest.mark.parametrize("name", sorted(RAW_UNDER_OUTPUT))
def test_each_raw_under_output_pipeline_is_refused(tmp_path, name, monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    (tmp_path / "providers.yaml").symlink_to(YAML / "providers.yaml")
    (tmp_path / "t.yaml").write_text(RAW_UNDER_OUTPUT[name])
    variables = dict(variables_for("continual_sum"), output=str(tmp_path / "out"), **_inputs(SUM, tmp_path))
    with pytest.raises(ValueError, match="holds the releases only"):
        _check(str(tmp_path / "t.yaml"), variables, tmp_path)
    # the same pipeline writing that data under dead_letter_output instead passes the check
    moved = RAW_UNDER_OUTPUT[name].replace("{{ output }}/dead_letter", DEAD).replace(
        "{{ output }}/copy", DEAD + "_copy").replace("{{ output }}/fake", DEAD + "_fake")
    (tmp_path / "t.yaml").write_text(moved)
    _check(str(tmp_path / "t.yaml"), variables, tmp_path)


@pytest.mark.parametrize("template", [t for t in TEMPLATES if not t.startswith("streaming")])
def test_every_shipped_template_passes_the_check(template, tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    inputs = _inputs((YAML / f"{template}.yaml").read_text(), tmp_path)
    _check(f"{template}.yaml", dict(variables_for(template), output=str(tmp_path / "out"), **inputs), YAML)
