"""Lifelong learners declare their spend (issue 23 item 2): every release of NaiveGaussian, the bounded
DP-SGD + A-GEM learner and L2DP-ML carries accounts (``"dpsgd"``: the subsampled-Gaussian accountant;
``"l2dp_ml"``: the paper's Theorem 2 claim) from which the verifier recomputes its ``epsilon_spent``
without torch, and a row stating less than that recomputation, or declaring a smaller noise, fails."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.verify import verify_job
from tests.conftest import TEST_KEY
from tests.verify.strict_jobs import ROOT, run_and_verify_strictly

torch = pytest.importorskip("torch")

TASKS = ("a", "b", "c")
# Stated and recomputed spends come from the same memoised accountant calls on the same public
# parameters (JSON floats round-trip exactly); the stated one is only capped at the target epsilon,
# which the calibration exceeds by at most its relative tolerance 1e-9 (BudgetExhausted beyond).
REL = 2e-9


def _tiny(**overrides) -> dict:
    """A network small enough for a few steps per task on the shared CPU (d = 4, two classes)."""
    kw = dict(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=8, epochs=1, task_ids=TASKS,
              device="cpu", steps_per_task=3)
    kw.update(overrides)
    return kw


def _tasks():
    from beam_dp.mechanisms.lifelong import TaskData

    rng = np.random.default_rng(5)
    return [TaskData(t, rng.uniform(-1, 1, (30 + 10 * i, 4)), rng.integers(0, 2, 30 + 10 * i))
            for i, t in enumerate(TASKS)]


def _learners():
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig, L2DPConfig, NaiveGaussianConfig

    sizes = {"a": 30, "b": 80, "c": 200}  # different rates q: different task accounts
    # RDP accounts (kind "dpsgd"); the default PLD accounts: tests/mechanisms/lifelong/test_pld_accounting.py
    yield "naive", NaiveGaussianConfig(**_tiny(), task_size=sizes, epsilon=3.0, delta=1e-5, num_tasks=3,
                                       accountant="rdp")
    yield "naive-fixed-z", NaiveGaussianConfig(**_tiny(), task_size=40, epsilon=50.0, delta=1e-5, num_tasks=3,
                                               noise_multiplier=1.3, accountant="rdp")
    yield "bounded", BoundedAGEMConfig(**_tiny(steps_per_task=None, epochs={"a": 1, "b": 2, "c": 1}),
                                       task_size=sizes, epsilon=1.0, delta=1e-5, memory_uses=4, accountant="rdp")
    yield "l2dp", L2DPConfig(**_tiny(), epsilon=0.7)


LEARNERS = dict(_learners())


def _run(config, tasks=None):
    learner, noise, releases = build_learner(config), NoiseSource(TEST_KEY), []
    state = learner.init_state("s")
    for task in tasks or _tasks():
        state, out = learner.step(state, task, noise)
        releases += out
    return learner, releases


@pytest.fixture(scope="module")
def runs():
    return {name: _run(config) for name, config in LEARNERS.items()}


def _rows(releases, epsilon, delta):
    return [dict(noise_domain="ll", composition="approx" if delta else "pure", stream=r.stream, step=r.step,
                 mechanism=r.mechanism, meta="", epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent,
                 epsilon_budget=epsilon, delta_budget=delta, job_epsilon_budget=epsilon, job_delta_budget=delta,
                 purpose=r.purpose, noise=r.noise) for r in releases]


@pytest.mark.parametrize("name", list(LEARNERS))
def test_every_release_declares_accounts_that_recompute_its_spend(runs, name):
    learner, releases = runs[name]
    assert len(releases) == 3
    kind = "l2dp_ml" if name == "l2dp" else "dpsgd"
    for r in releases:
        text = json.loads(r.noise)
        assert text["terms"] == [] and {a["kind"] for a in text["accounts"]} == {kind}, r.noise
        recomputed = recomputed_epsilon(loss_of_declaration(r.noise), r.delta_spent)
        assert recomputed == pytest.approx(r.epsilon_spent, rel=REL), (name, r.step)
    g = learner.guarantee
    assert verify_job(_rows(releases, g.epsilon, g.delta), strict=True).ok


def test_naive_gaussian_declares_every_stream_of_every_task_so_far(runs):
    """Basic composition as the learner accounts it: task 1 one stream, later tasks two (task and memory,
    the memory stream of task i Poisson at 1/i); each account at δ/(2m)."""
    _, releases = runs["naive"]
    counts = [len(json.loads(r.noise)["accounts"]) for r in releases]
    assert counts == [1, 3, 5]
    last = json.loads(releases[-1].noise)["accounts"]
    assert [a["sampling_rate"] for a in last] == pytest.approx([8 / 30, 8 / 80, 1.0, 8 / 200, 0.5], rel=1e-15)
    assert all(a["delta"] == pytest.approx(1e-5 / 6, rel=1e-15) for a in last)
    assert releases[-1].delta_spent == pytest.approx(5e-5 / 6, rel=1e-12)


def test_bounded_learner_declares_the_worst_task_account(runs):
    """Tasks are disjoint: a release declares the one task account (its steps at z_τ and K memory uses
    at z_M) that spends most among the tasks so far; its epsilon is the stated max."""
    from beam_dp.core.accounting.lifelong import dpsgd_spend

    learner, releases = runs["bounded"]
    seen = []
    for r in releases:
        (declared,) = json.loads(r.noise)["accounts"]
        assert declared["memory_uses"] == 4 and declared["memory_noise_multiplier"] == learner.memory_noise_multiplier
        seen.append(dpsgd_spend(**{k: v for k, v in declared.items() if k != "kind"})[0])
        assert seen[-1] == pytest.approx(max(seen), rel=1e-15) and r.epsilon_spent <= 1.0
    steps = [json.loads(r.noise)["accounts"][0]["steps"] for r in releases]
    assert steps[0] == 4  # task a: 1 epoch of round(30/8) = 4 steps


@pytest.mark.parametrize("name,field,factor", [
    ("naive", "noise_multiplier", 0.9), ("naive", "steps", 2.0), ("bounded", "sampling_rate", 1.2),
    ("bounded", "memory_uses", 2.0), ("l2dp", "scale_chi3", 0.9), ("l2dp", "scale_chi1", 0.9)])
def test_a_row_stating_less_than_its_declaration_fails(runs, name, field, factor):
    """Epsilon lowered 10%, or a declared noise made smaller (z or a Laplace scale lowered, more steps,
    a higher rate, more memory uses): the recomputed spend exceeds the stated one."""
    learner, releases = runs[name]
    g = learner.guarantee
    rows = _rows(releases, g.epsilon, g.delta)
    lowered = verify_job([dict(row, epsilon_spent=0.9 * row["epsilon_spent"]) for row in rows])
    assert any("below the spend recomputed" in p for p in lowered.problems), lowered.problems

    def doctor(text):
        data = json.loads(text)
        account = data["accounts"][-1]
        value = account[field] * factor
        account[field] = round(value) if field in ("steps", "memory_uses") else value
        return json.dumps(data)

    doctored = verify_job([dict(row, noise=doctor(row["noise"])) for row in rows])
    assert any("below the spend recomputed" in p for p in doctored.problems), doctored.problems
    stripped = verify_job([dict(row, noise="") for row in rows])
    assert any("lack the noise declaration" in p for p in stripped.problems), stripped.problems


@pytest.mark.parametrize("name", ["naive", "bounded"])
def test_declarations_are_public_functions_of_the_config(runs, name):
    """The declared parameters come from the declared task sizes and the config, never from the true
    rows: other data with other true task sizes (the add/remove neighbours' private n_τ) declare the same."""
    from beam_dp.mechanisms.lifelong import TaskData

    rng = np.random.default_rng(9)
    other = [TaskData(t, rng.uniform(-1, 1, (n, 4)), rng.integers(0, 2, n)) for t, n in zip(TASKS, (13, 61, 25))]
    _, releases = _run(LEARNERS[name], other)
    assert [r.noise for r in releases] == [r.noise for r in runs[name][1]]
    assert [r.epsilon_spent for r in releases] == [r.epsilon_spent for r in runs[name][1]]  # same public arithmetic


@pytest.mark.parametrize("bad", [
    {"kind": "dpsgd", "sampling_rate": 1.5, "noise_multiplier": 1.0, "steps": 3, "delta": 1e-5},
    {"kind": "dpsgd", "sampling_rate": 0.5, "noise_multiplier": 1.0, "steps": 2.5, "delta": 1e-5},
    {"kind": "dpsgd", "sampling_rate": 0.5, "noise_multiplier": 0.0, "steps": 3, "delta": 1e-5},
    {"kind": "dpsgd", "sampling_rate": 0.5, "noise_multiplier": 1.0, "steps": 3},
    {"kind": "l2dp_ml", "delta_r": 24.0, "delta_l": 10.0, "scale_chi1": -1.0, "scale_chi2": 1.0, "scale_chi3": 1.0,
     "batch_size": 8, "b_theta": 1.0}])
def test_malformed_accounts_are_refused(bad):
    with pytest.raises(ValueError):
        loss_of_declaration(json.dumps({"terms": [], "accounts": [bad]}))


def test_the_verifier_recomputes_the_accounts_without_torch_or_beam(runs):
    """A fresh process (as ``python -m beam_dp.verify`` runs) loads the account functions without torch."""
    texts = [runs[name][1][-1].noise for name in ("naive", "bounded", "l2dp")]
    deltas = [runs[name][1][-1].delta_spent for name in ("naive", "bounded", "l2dp")]
    code = ("import json, sys\nfrom beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon\n"
            f"pairs = zip({texts!r}, {deltas!r})\n"
            "print(json.dumps([recomputed_epsilon(loss_of_declaration(t), d) for t, d in pairs]))\n"
            "assert 'torch' not in sys.modules and 'apache_beam' not in sys.modules, 'heavy import'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    stated = [runs[name][1][-1].epsilon_spent for name in ("naive", "bounded", "l2dp")]
    assert json.loads(done.stdout) == pytest.approx(stated, rel=REL)


@pytest.mark.pipeline
@pytest.mark.parametrize("learner", ["bounded_agem", "naive_gaussian", "l2dp"])
def test_the_lifelong_job_verifies_strictly(learner, tmp_path):
    """The CLI job end to end on a tiny input (one stream, two tasks of 24 rows): every release declares, so
    ``python -m beam_dp.verify --strict`` (which fails on a release it cannot recompute) passes."""
    rng = np.random.default_rng(0)
    with open(tmp_path / "tasks.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["stream_id", "task_id", "x_0", "x_1", "x_2", "x_3", "label"])
        for task in ("t1", "t2"):
            for x in rng.uniform(-1, 1, (24, 4)).round(4):
                out.writerow(["s", task, *x, int(x[0] > 0)])
    run_and_verify_strictly("lifelong", [
        "--learner", learner, "--input", str(tmp_path / "tasks.csv"), "--tasks", "t1,t2", "--classes", "0,1",
        "--task-size", "24", "--hidden", "4", "--g-layers", "4", "--batch-size", "8", "--steps-per-task", "2"],
        tmp_path / "out")
