"""The online-learning job end to end: OnlineLearner and IncrementalRegression from a CSV equal the pure
mechanisms, bad rows to dead letters, one-line usage errors."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.beam import IncrementalRegressionParams, OnlineLearnerParams
from beam_dp.core import StepClock
from beam_dp.io import read_releases, release_to_row
from pipelines import online_learning as job
from tests.beam.helpers import domain_noise, labelled
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters, value_reasons_merged

pytestmark = pytest.mark.pipeline

PROG = "python -m pipelines.online_learning"


def _expected(params, blocks_by_stream, domain):
    """The pure mechanism's rows under the test key in the noise domain ``domain`` (the job labels the
    transform with its class name)."""
    mech, rows, noise = params.build_mechanism(), [], domain_noise(params, domain)
    clock = getattr(params, "clock", None)
    for stream, blocks in blocks_by_stream.items():
        for rel in mech.run(stream, blocks, noise):
            times = (clock.step_start_micros(rel.step), clock.step_end_micros(rel.step)) if clock else (None, None)
            rows.append(release_to_row(rel, mech.guarantee, *times))
    return sorted(labelled(rows, params, domain), key=lambda r: (r.stream, r.step))


def _check(out, want):
    got = read_releases(str(out / "models-*"))
    assert want and [(r["stream"], r["step"]) for r in got] == [(r.stream, r.step) for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["value"], w.value, rtol=1e-9, atol=1e-12)
        assert g["epsilon_spent"] == w.epsilon_spent and g["parts"] == w.parts
        assert (g["noise_domain"], g["composition"], g["job_epsilon_spent"]) == (
            w.noise_domain, w.composition, w.job_epsilon_spent)


def test_help_lists_the_job_flags(capsys):
    assert job.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--learner", "--algorithm", "--window", "--constraint", "--release-every", "--block-size", "--start"):
        assert flag in text


def test_online_learner_cli_equals_the_pure_mechanism(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = {s: [(rng.normal(size=3) / 2, float(rng.choice([-1.0, 1.0]))) for _ in range(12)] for s in ("a", "b")}
    lines = ["stream_id,x_0,x_1,x_2,label"] + [f"{s},{','.join(repr(float(v)) for v in x)},{y!r}"
                                               for s, recs in data.items() for x, y in recs]
    lines += ["a,0.1,0.2,0.3,0.5", "a,nan,0.0,0.0,1.0", "b,0.1,0.2", ",0.1,0.2,0.3,1.0"]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={out}", "--algorithm=cocol", "--constraint=l1_ball",
            "--window=8", "--mu=0.5", "--epsilon=1.0"]
    assert job.main(argv) == 0
    params = OnlineLearnerParams(dim=3, constraint={"kind": "l1_ball", "radius": 1.0}, epsilon=1.0, window=8,
                                 algorithm="cocol", loss="logistic", mu=0.5)
    mech = params.build_mechanism()
    records = {s: [mech.record(x, y) for x, y in recs] for s, recs in data.items()}
    _check(out, _expected(params, records, "OnlineLearner"))
    # a logistic label 0.5 and a NaN feature: value-level reasons (the parse stage names which)
    assert value_reasons_merged(dead_letters(out)) == {"models:bad_input": 2, "read:malformed": 1,
                                                       "models:bad_stream_id": 1}
    assert "models: 24 releases" in capsys.readouterr().out


def test_incremental_regression_event_time_cli_equals_the_pure_mechanism(tmp_path):
    rng = np.random.default_rng(1)
    events = [(s, float(rng.uniform(0, 40)), rng.normal(size=2) / 2, float(rng.uniform(-1, 1)))
              for s in ("u", "v") for _ in range(10)]
    lines = ["stream_id,timestamp,x_0,x_1,label"] + [f"{s},{t!r},{float(x[0])!r},{float(x[1])!r},{y!r}" for s, t, x, y in events]
    lines += ["u,99.0,0.0,0.0,0.0", "u,5.0,0.1,abc,0.2"]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'r.csv'}", f"--output={out}", "--learner=regression", "--start=0",
            "--period=10", "--end=60", "--epsilon=1.0", "--delta=1e-6", "--format=jsonl"]
    assert job.main(argv) == 0
    clock = StepClock(0.0, 10.0, end=60.0)
    params = IncrementalRegressionParams(dim=2, epsilon=1.0, delta=1e-6, clock=clock,
                                         constraint={"kind": "l2_ball", "radius": 1.0})
    mech = params.build_mechanism()
    blocks = {}
    for s in ("u", "v"):
        steps = [[mech.record(x, y) for st, t, x, y in events if st == s and int(t // 10) == k] for k in range(6)]
        blocks[s] = [mech.merge_blocks(items) if items else None for items in steps]
    _check(out, _expected(params, blocks, "IncrementalRegression"))
    assert value_reasons_merged(dead_letters(out)) == {"models:after_end": 1, "models:bad_input": 1}


@pytest.mark.parametrize("argv, fix", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--algorithm=privincreg1"], "--algorithm privincreg1 needs --learner regression"),
    (["--learner=regression", "--algorithm=cocop"], "--algorithm cocop needs --learner online"),
    (["--window=0"], "cocop"),
    (["--learner=regression", "--start=0"], "--period"),
    (["--learner=regression", "--block-size=4", "--start=0", "--period=1", "--end=5"], "not both"),
    (["--source=pubsub", "--streaming", "--pubsub-topic=projects/p/topics/t"], "--dim is required"),
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fix, capsys, tmp_path):
    assert_usage_error(job.main, PROG, argv + [f"--output={tmp_path}"], fix, capsys)
