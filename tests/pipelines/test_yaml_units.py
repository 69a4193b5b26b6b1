"""Privacy units in Beam YAML: the sums' transforms take the job's unit parameters (pipelines/spec.py), and a
unit-level YAML pipeline releases what the pure bounding and mechanism release on the same events."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core import StepClock
from beam_dp.core.units import UnitLedger, bound_block, unit_hash
from beam_dp.io import read_releases
from pipelines import run_yaml, spec, yaml_transforms
from tests.beam.helpers import expected_rows
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
START, PERIOD, END = 0.0, 10.0, 60.0  # 6 steps
UNIT = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=2, max_steps=2, min_separation=2)
CONFIG = dict(epsilon=1.0, clip_bound=1.0, start=START, period=PERIOD, end=END, noise="gaussian", delta=1e-6,
              privacy_unit_column="user", max_unit_steps=2, min_separation=2, max_contributions_per_step=2)

PIPELINE = """\
pipeline:
  transforms:
    - type: ReadFromCsv
      name: ReadEvents
      config:
        path: "{input}"
    - type: ContinualSum
      name: UnitSum
      input: ReadEvents
      config: {config}
    - type: WriteToParquet
      name: WriteReleases
      input: UnitSum.releases
      config:
        path: "{{{{ output }}}}/sum"
        file_name_suffix: .parquet
    - type: WriteDeadLetters
      name: WriteDeadLetters
      input: UnitSum.dead_letter
      config:
        path: "{{{{ dead_letter_output | default(output ~ '.private') }}}}/dead_letter"
providers:
  - include: {providers}
options:
  runner: FnApiRunner
"""


def _events(n: int = 120, seed: int = 0):
    rng = np.random.default_rng(seed)
    users = rng.choice(["ann", "bob", "cy"], n, p=[0.6, 0.3, 0.1])  # ann and bob send more than the bounds keep
    streams = rng.choice(["a", "b"], n)
    ts = (START + rng.random(n) * (END - START)).round(3)
    return users, streams, ts, rng.normal(0.0, 1.0, n).round(6)


def _bounded(users, streams, ts, values, params):
    """The kept (stream, step, sum) of each unit alone, by the pure bounding (core.units)."""
    clock = params.clock
    steps = clock.step_of_micros(np.round(ts * 1e6).astype(np.int64))
    clipped, _ = params.build_mechanism().clip_rows(values[:, None])
    kept = []
    for user in sorted(set(users)):
        rows = np.flatnonzero(users == user)
        ledger, h = UnitLedger.empty(params.unit_bounds()), unit_hash(TEST_KEY, [user])[0]
        for step in sorted(set(steps[rows].tolist())):
            mine = rows[steps[rows] == step]
            block = bound_block(ledger, step, np.full(len(mine), h, np.uint64), streams[mine].tolist(), clipped[mine],
                                params.unit_bounds(), TEST_KEY, clip_bound=params.clip_bound)
            ledger = block.ledger
            kept += [(str(s), step, float(v[0])) for s, v in zip(block.streams, block.sums)]
    return kept


def test_a_unit_level_yaml_sum_releases_the_bounded_replay(tmp_path):
    users, streams, ts, values = _events()
    lines = ["stream_id,timestamp,value,user"] + [f"{s},{t!r},{v!r},{u}" for u, s, t, v in
                                                 zip(users, streams, ts.tolist(), values.tolist())]
    (tmp_path / "e.csv").write_text("\n".join(lines + ["a,5.0,1.0,"]) + "\n")  # the last: no unit id
    out = tmp_path / "out"
    (tmp_path / "p.yaml").write_text(PIPELINE.format(input=tmp_path / "e.csv", config=json.dumps(CONFIG),
                                                     providers=ROOT / "templates" / "yaml" / "providers.yaml"))
    assert run_yaml.main([f"--yaml_pipeline_file={tmp_path / 'p.yaml'}",
                          f"--jinja_variables={json.dumps({'output': str(out)})}"]) == 0
    params = ContinualSumParams(clip_bound=1.0, clock=StepClock(START, PERIOD, END), noise="gaussian", delta=1e-6,
                                epsilon=1.0).with_privacy_unit(UNIT)
    kept = _bounded(users, streams, ts, values, params)
    assert 0 < len(kept) < len(users)  # the heavy units were bounded
    got = sorted(read_releases(str(out / "sum*")), key=lambda r: (r["stream"], r["step"]))
    want = sorted(expected_rows(params, [s for s, _, _ in kept], [START + (t - 0.5) * PERIOD for _, t, _ in kept],
                                [v for _, _, v in kept], domain=got[0]["noise_domain"]),
                  key=lambda r: (r.stream, r.step))
    assert [(r["stream"], r["step"]) for r in got] == [(r.stream, r.step) for r in want] and len(got) == 2 * 6
    for g, w in zip(got, want):  # the unit-level noise on the bounded sums, the unit declared in every row
        assert np.allclose(g["value"], w.value, rtol=1e-9, atol=1e-9)
        meta = json.loads(g["meta"]) if isinstance(g["meta"], str) else g["meta"]
        assert meta == {**json.loads(w.meta), **params.unit_declaration()}
    letters = [json.loads(line) for f in out.with_name("out.private").glob("dead_letter*")
               for line in f.read_text().splitlines()]
    assert [d["reason"] for d in letters] == ["bad_unit_id"]


@pytest.mark.parametrize("transform", ["ContinualSum", "ContinualCount", "WindowedSum"])
def test_every_sum_transform_takes_the_unit_parameters(transform):
    names = set(yaml_transforms.REGISTRY[transform].__signature__.parameters)
    assert set(yaml_transforms._UNIT) <= names
    assert all({p.name: p for p in spec.JOBS["continual_stats"]}[name].yaml for name in yaml_transforms._UNIT)
    config = {k: v for k, v in CONFIG.items() if k != "clip_bound" or transform != "ContinualCount"}
    config.update(window=4) if transform == "WindowedSum" else None
    built = yaml_transforms.REGISTRY[transform](**config)
    unit = getattr(built.transform, "privacy_unit", None) or built.transform.params.privacy_unit
    assert unit == UNIT


@pytest.mark.parametrize("change, fix", [
    ({"privacy_unit_column": None}, "max_unit_steps, min_separation, max_contributions_per_step bound privacy units"),
    ({"max_unit_steps": None}, "needs max_unit_steps"),
    ({"max_unit_steps": 0}, "max_steps"),
])
def test_unit_parameters_are_refused_as_the_job_refuses_its_flags(change, fix):
    with pytest.raises(ValueError, match=fix):
        yaml_transforms.ContinualSumYaml(**{**CONFIG, **change})
