"""NaiveGaussian and the bounded-participation DP-SGD + A-GEM learner (check 13 and accountant totals)."""

import numpy as np
import pytest
import torch

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.lifelong import AGEMConfig, BoundedAGEMConfig, NaiveGaussianConfig, TaskData
from beam_dp.mechanisms.lifelong.dpsgd import BudgetExhausted
from beam_dp.testing.stats import gaussian_variance_matches
from tests.conftest import TEST_KEY
from tests.lifelong.conftest import small_common


def test_per_example_clipping(digits):
    tasks, _ = digits
    learner = BoundedAGEMConfig(**small_common(), task_size=480, clip_norm=0.05).build()
    state = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY))
    params, _ = learner._torch_state(state)
    x = torch.as_tensor(tasks[0].x[:40])
    y = torch.as_tensor(tasks[0].y[:40])
    raw = torch.linalg.vector_norm(learner.per_example_gradients(params, x, y), dim=1)
    clipped = torch.linalg.vector_norm(learner.clipped_per_example_gradients(params, x, y), dim=1)
    assert (raw > 0.05).any()
    assert torch.all(clipped <= 0.05 * (1 + 1e-12))
    small = raw <= 0.05
    assert torch.allclose(clipped[small], raw[small])


def test_gradient_noise_calibration_with_half_noise_control():
    """On an empty batch the privatised gradient is pure noise N(0, (zC/λ)²): the chi-square variance check
    (two-sided, 0.999) passes for the real noise and fails for a half-noise (σ/2) variant."""
    learner = BoundedAGEMConfig(**small_common(), task_size=480, clip_norm=0.5).build()
    state = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY))
    params, _ = learner._torch_state(state)
    empty_x, empty_y = torch.zeros((0, 64), dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
    z = 1.7
    draws = np.concatenate([
        torch.cat([v.reshape(-1) for v in learner._gradient(params, empty_x, empty_y, z, NoiseSource(TEST_KEY), "s",
                                                             "noise-task", (1, s)).values()]).numpy()
        for s in range(3)])
    variance = (z * 0.5 / 32) ** 2
    assert gaussian_variance_matches(draws, variance)
    assert not gaussian_variance_matches(draws / 2, variance)


@pytest.fixture(scope="module")
def naive_run(digits):
    tasks, evals = digits
    learner = NaiveGaussianConfig(**small_common(evals), task_size=480, epsilon=3.0, delta=1e-5, num_tasks=3).build()
    state = learner.init_state("s")
    releases = []
    for task in tasks:
        state, rel = learner.step(state, task, NoiseSource(TEST_KEY))
        releases += rel
    return learner, state, releases


def test_naive_gaussian_totals(naive_run, digits):
    learner, state, releases = naive_run
    eps = [r.epsilon_spent for r in releases]
    assert eps == sorted(eps) and eps[-1] <= 3.0
    # task 1: one stream (no memory yet); later tasks: two streams of ε/(2m) each
    assert eps[0] == pytest.approx(0.5, abs=1e-6)
    assert eps[-1] == pytest.approx(2.5, abs=3e-6)
    assert releases[-1].delta_spent == pytest.approx(5 * 1e-5 / 6)
    assert all(r.meta["guarantee_basis"] == "accountant" for r in releases)
    with pytest.raises(BudgetExhausted):  # a 4th task is beyond the declared budget
        cfg = NaiveGaussianConfig(**small_common(task_ids=None), task_size=480, epsilon=3.0, num_tasks=3)
        cfg.build().step(state, TaskData("extra", digits[0][0].x, digits[0][0].y), NoiseSource(TEST_KEY))


def test_bounded_learner_total_fixed_and_memory_cap(digits):
    tasks, _ = digits
    many = [TaskData(f"{i}", t.x, t.y) for i, t in enumerate(tasks + tasks[:1])]  # 4 tasks
    learner = BoundedAGEMConfig(**small_common(task_ids=None, steps_per_task=8), task_size=480, epsilon=1.0, memory_uses=5).build()
    state = learner.init_state("s")
    spent, ref_steps = [], 0
    for task in many:
        state, rel = learner.step(state, task, NoiseSource(TEST_KEY))
        spent.append(rel[0].epsilon_spent)
        ref_steps += rel[0].meta["reference_steps"]
        assert all(u <= 5 for u in state.memory_uses)
    assert max(spent) <= 1.0 and spent[-1] == pytest.approx(1.0, abs=1e-6)
    assert sum(state.memory_uses) == ref_steps
    assert state.memory_uses[0] == 5  # the first batch was retired after its K uses


def test_nonprivate_agem_runs(digits):
    tasks, evals = digits
    learner = AGEMConfig(**small_common(evals, epochs=5)).build()
    assert learner.guarantee is None
    state, rel = learner.step(learner.init_state("s"), tasks[0], NoiseSource(TEST_KEY))
    assert rel[0].meta["accuracy"]["0"] > 0.8
