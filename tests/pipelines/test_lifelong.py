"""The lifelong job end to end: tasks from a CSV, snapshots equal the pure BoundedAGEM learner's under the
test key (with public-eval accuracy), bad rows to dead letters, one-line usage errors."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.io import read_releases, release_to_row
from beam_dp.io.manifest import read_manifest
from beam_dp.io.schema import ReleaseLabels
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters, value_reasons_merged
from tests.release_checks import assert_release_matches

torch = pytest.importorskip("torch")
from beam_dp.mechanisms.lifelong.config import BoundedAGEMConfig, TaskData  # noqa: E402
from beam_dp.mechanisms.lifelong.factory import build_learner  # noqa: E402
from pipelines import lifelong as job  # noqa: E402

pytestmark = pytest.mark.pipeline

PROG = "python -m pipelines.lifelong"
GROUPS = ((0, 1, 2, 3), (4, 5, 6, 7, 8, 9))


def _digits(seed=0):
    """Two tasks of 48 training rows each and 32 public eval rows each (x in [-1, 1])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data / 8.0 - 1.0, d.target
    rng = np.random.default_rng(seed)
    train, evals = [], {}
    for task, group in enumerate(GROUPS):
        idx = rng.permutation(np.flatnonzero(np.isin(y, group)))
        train.append(TaskData(str(task), x[idx[:48]], y[idx[:48]]))
        evals[str(task)] = (x[idx[48:80]], y[idx[48:80]])
    return train, evals


def _csv(path, rows, extra=()):
    header = "stream_id,task_id," + ",".join(f"x_{i}" for i in range(64)) + ",label"
    lines = [header] + [f"s,{t},{','.join(repr(float(v)) for v in xs)},{int(label)}" for t, xs, label in rows]
    path.write_text("\n".join(lines + list(extra)) + "\n")


def test_help_lists_the_job_flags(capsys):
    assert job.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--learner", "--tasks", "--classes", "--eval-input", "--epsilon", "--delta", "--memory-uses"):
        assert flag in text


def test_cli_on_a_csv_equals_the_pure_learner_with_accuracy(tmp_path, capsys):
    tasks, evals = _digits()
    zeros = ",".join(["0.0"] * 64)
    _csv(tmp_path / "train.csv", [(t.task_id, xs, label) for t in tasks for xs, label in zip(t.x, t.y)],
         extra=[f"s,9,{zeros},1", f"s,1,{zeros},10", f"s,1,nan,{zeros[4:]},1", "s,1,0.5"])
    _csv(tmp_path / "eval.csv", [(t, xs, label) for t, (x, y) in evals.items() for xs, label in zip(x, y)])
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'train.csv'}", f"--eval-input={tmp_path / 'eval.csv'}", f"--output={out}",
            "--tasks=0,1", "--classes=0,1,2,3,4,5,6,7,8,9", "--steps-per-task=2", "--task-size=500", "--device=cpu", "--torch-threads=1"]
    assert job.main(argv) == 0
    assert "s after task 2: accuracy 0=" in capsys.readouterr().out
    config = BoundedAGEMConfig(input_dim=64, n_classes=10, steps_per_task=2, task_ids=("0", "1"), eval_sets=evals,
                               epsilon=1.0, delta=1e-5, memory_uses=50, device="cpu", task_size=500)
    learner, want = build_learner(config), []
    state = learner.init_state("s")
    binding = read_manifest(str(out)).transforms[0].noise_binding  # the job's calibration
    noise = NoiseSource(TEST_KEY).for_domain("LifelongLearner", binding)  # the job's label of the transform
    labels = ReleaseLabels("LifelongLearner", "approx")  # DP-SGD composes as (epsilon, delta); no job budget
    for task in tasks:
        state, releases = learner.step(state, learner.merge_blocks([task]), noise)
        want += [labels(release_to_row(r, learner.guarantee)) for r in releases]
    got = read_releases(str(out / "models-*"))
    assert [(r["stream"], r["step"]) for r in got] == [("s", 1), ("s", 2)]
    for g, w in zip(got, want):
        # floats within tolerance (tests/release_checks.py; 1e-9 for the torch training's summation order)
        assert_release_matches(g, w, rtol=1e-9, atol=1e-12)
        assert w.epsilon_spent <= 1.0 and g["parts"] == w.parts
        assert (g["noise_domain"], g["composition"], g["job_epsilon_spent"]) == (
            w.noise_domain, w.composition, w.job_epsilon_spent)
    # pyarrow reads "nan" in a float column as null: a value-level reason (bad_value today)
    assert value_reasons_merged(dead_letters(out)) == {"models:unknown_task": 1, "models:bad_label": 1,
                                                       "models:bad_input": 1,
                                 "read:malformed": 1}


@pytest.mark.parametrize("argv, fix", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--input=x.csv"], "--tasks, --classes required"),
    (["--learner=agem"], "--learner"),
    (["--input=/no/such.csv", "--tasks=a", "--classes=0,1"], "no files match --input"),
    (["--source=pubsub", "--streaming", "--pubsub-topic=projects/p/topics/t", "--tasks=a", "--classes=0,1"],
     "--dim is required"),
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fix, capsys, tmp_path):
    assert_usage_error(job.main, PROG, argv + [f"--output={tmp_path}"], fix, capsys)


def test_dpsgd_learners_need_the_public_task_size(tmp_path, capsys):
    """Without --task-size the job refuses in one line: q and the step count must not come from the data."""
    _csv(tmp_path / "train.csv", [("0", [0.0] * 64, 1)])
    assert_usage_error(job.main, PROG, [f"--input={tmp_path / 'train.csv'}", "--tasks=0", "--classes=0,1",
                                        f"--output={tmp_path / 'out'}"], "--task-size required", capsys)


def test_demo_is_permuted_digits_with_demo_settings_unless_a_flag_says_otherwise(tmp_path):
    """The demo's tasks hold all ten classes (so forgetting is not the whole story), task t > 0 is a fixed
    pixel permutation of the same images, the demo settings apply where a flag keeps its default, the task
    sizes are the demo's public sizes and the tiny network trains on one thread."""
    from apache_beam.options.pipeline_options import PipelineOptions

    tasks, evals = job.demo_tasks()
    assert all(set(np.unique(t.y)) == set(range(10)) for t in tasks)
    x0, x1 = evals["0"][0], evals["1"][0]
    assert np.array_equal(np.sort(x0, axis=1), np.sort(x1, axis=1)) and not np.array_equal(x0, x1)
    learner = job.plan(PipelineOptions([f"--output={tmp_path}"])).params
    assert (learner.learner.epochs, learner.learner.learning_rate, learner.learner.batch_size) == (10, 1e-2, 64)
    assert learner.learner.task_size == {t.task_id: len(t) for t in tasks} and learner.torch_threads == 1
    mine = job.plan(PipelineOptions([f"--output={tmp_path}", "--epochs=2", "--torch-threads=2"])).params
    assert mine.learner.epochs == 2 and mine.torch_threads == 2


def test_the_demo_runs_and_explains_itself_with_every_learner(tmp_path, capsys, monkeypatch):
    """The demo's closing lines name the public rows per task whatever the learner (L2DP-ML has no
    declared task size: its summary used to fail with an AttributeError after the releases were written)."""
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    assert job.main([f"--output={tmp_path / 'out'}", "--learner=l2dp", "--steps-per-task=1"]) == 0
    rows_per_task = min(len(task) for task in job.demo_tasks()[0])
    assert f"~{rows_per_task} rows per task" in capsys.readouterr().out
