"""A YAML pipeline's job budget (issue 23, item 3): two beam_dp transforms at epsilon 1 each under a
declared total of 1 are refused when the pipeline is built; under a total of 2 every row carries the
job's true spend (2 at the end) and total; two transforms without a declared total are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_dp.io import read_releases
from beam_dp.io.manifest import read_manifest
from beam_dp.verify import main as verify_main
from beam_dp.verify import verify_job
from pipelines.run_yaml import main as run_yaml
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

PROVIDERS = Path(__file__).resolve().parents[2] / "templates" / "yaml" / "providers.yaml"


def _pipeline(tmp_path: Path, total: float | None, sum_epsilon: float = 1.0, count: bool = True) -> list[str]:
    """The arguments running a pipeline of a sum and (``count``) a count writing under ``tmp_path/out``
    (its Jinja variable ``output``: ``run_yaml`` stages what is written there)."""
    options = "  runner: FnApiRunner\n" + (f"  job_epsilon: {total}\n" if total is not None else "")
    text = f"""pipeline:
  transforms:
    - type: Create
      name: Events
      config:
        elements:
          - {{stream_id: a, timestamp: 1.0, value: 0.5}}
          - {{stream_id: a, timestamp: 12.0, value: 0.25}}
          - {{stream_id: b, timestamp: 15.0, value: -0.5}}
    - type: ContinualSum
      name: Sum
      input: Events
      config: {{dim: 1, epsilon: {sum_epsilon}, clip_bound: 1.0, start: 0, period: 10, end: 40}}
    - type: ContinualCount
      name: Count
      input: Events
      config: {{epsilon: 1.0, start: 0, period: 10, end: 40}}
    - type: WriteToJson
      name: WriteSum
      input: Sum.releases
      config: {{path: "{{{{ output }}}}/sum"}}
    - type: WriteToJson
      name: WriteCount
      input: Count.releases
      config: {{path: "{{{{ output }}}}/count"}}
providers:
  - include: {PROVIDERS}
options:
{options}"""
    if not count:  # the sum alone
        text = text.replace(text[text.index("    - type: ContinualCount"):text.index("    - type: WriteToJson")], "")
        text = text[:text.index("    - type: WriteToJson\n      name: WriteCount")] + text[text.index("providers:"):]
    path = tmp_path / "two.yaml"
    path.write_text(text)
    return [f"--yaml_pipeline_file={path}", f"--jinja_variables={json.dumps({'output': str(tmp_path / 'out')})}"]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())


def test_two_transforms_over_the_declared_total_are_refused_at_build(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:  # one line, exit 2 (beam_dp.cli.guarded)
        run_yaml(_pipeline(tmp_path, 1.0))
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "compose to epsilon 2" in err and "more than the job's total epsilon 1" in err, err
    assert not (tmp_path / "out").exists()


def test_two_transforms_without_a_declared_total_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        run_yaml(_pipeline(tmp_path, None))
    assert ended.value.code == 2
    assert "declare the job's total" in capsys.readouterr().err


def test_under_a_total_of_two_every_row_carries_the_jobs_spend(tmp_path):
    assert run_yaml(_pipeline(tmp_path, 2.0)) == 0
    rows = read_releases(str(tmp_path / "out" / "*-0*"))  # the release files, not the manifest beside them
    assert {r["noise_domain"] for r in rows} == {"Sum/Release", "Count/Release/Sum"}
    assert {(r["job_epsilon_budget"], r["job_delta_budget"]) for r in rows} == {(2.0, 0.0)}
    # each transform spends its whole epsilon 1 by the last step; composed with the other's full share
    # the job's worst spend is 2 (pure epsilons add exactly up to float rounding: tolerance 1e-9)
    assert max(r["job_epsilon_spent"] for r in rows) == pytest.approx(2.0, rel=1e-9)
    assert all(r["epsilon_spent"] + 1.0 == pytest.approx(r["job_epsilon_spent"], rel=1e-9) for r in rows)
    verdict = verify_job(rows)
    assert verdict.ok and verdict.worst_epsilon == pytest.approx(2.0, rel=1e-9), verdict.problems
    # the manifest beside them declares both transforms, their files (YAML JSON writers) and the total
    manifest = read_manifest(str(tmp_path / "out"))
    assert (manifest.epsilon, manifest.delta) == (2.0, 0.0)
    assert {(t.noise_domain, t.files) for t in manifest.transforms} == {("Sum/Release", ("sum",)),
                                                                         ("Count/Release/Sum", ("count",))}
    assert verify_main([str(tmp_path / "out")]) == 0


def test_plain_beam_yaml_refuses_two_transforms_it_cannot_budget(tmp_path):
    from apache_beam.yaml import main as yaml_main

    with pytest.raises(ValueError, match="run it with python -m pipelines.run_yaml"):
        yaml_main.run(_pipeline(tmp_path, 2.0))


def test_one_transform_above_the_declared_total_is_refused_by_plain_beam_yaml_too(tmp_path):
    from apache_beam.yaml import main as yaml_main

    with pytest.raises(ValueError, match="more than the job's total epsilon 1"):
        yaml_main.run(_pipeline(tmp_path, 1.0, sum_epsilon=2.0, count=False))
