"""Sensitivities, the Theorem 2 budget split, the Taylor loss, the metrics and the DP-SGD accountants."""

import math

import numpy as np
import pytest

from beam_dp.core.accounting.lifelong import (
    dpsgd_event,
    epsilon_of,
    l2dp_budget,
    sensitivity_label,
    sensitivity_reconstruction,
)
from beam_dp.mechanisms.lifelong import (
    BoundedAGEMConfig,
    L2DPConfig,
    NaiveGaussianConfig,
    average_accuracy,
    average_forgetting,
    curve_p_value,
    forgetting,
)
from beam_dp.mechanisms.lifelong.factory import build_learner
from tests.mechanisms.lifelong.conftest import small_common


def test_sensitivities_from_config():
    learner = build_learner(L2DPConfig(**small_common(), epsilon=1.0))
    assert learner.delta_r == 64 * (32 + 2)  # Δ_R = d(β + 2)
    assert learner.delta_l == 2 * (32 + 1)  # Δ_L = 2(n_π + 1)
    assert sensitivity_reconstruction(784, 10) == 784 * 12
    assert sensitivity_label(512) == 1026


@pytest.mark.parametrize("eps,lam,b_theta", [(0.5, 256, 1.0), (1.0, 32, 1.0), (50.0, 32, 0.5), (2.0, 7, 3.0)])
def test_budget_split_reproduces_epsilon(eps, lam, b_theta):
    budget = l2dp_budget(eps, 0.5, lam, b_theta, 4950.0, 1026.0)
    assert abs(budget.total(lam, b_theta) - eps) <= 1e-12
    assert budget.epsilon_2 == pytest.approx(0.5 * eps)


def test_budget_worked_example_conv_mnist():
    budget = l2dp_budget(0.5, 0.5, 256, 1.0, 4950.0, 1026.0)
    assert budget.epsilon_1 == pytest.approx(0.2320, abs=5e-5)
    assert 4950 / (budget.epsilon_1 * 256) == pytest.approx(83, abs=0.5)


def test_invalid_parameters_raise():
    with pytest.raises(ValueError):
        L2DPConfig(**small_common(), epsilon=0.0)
    with pytest.raises(ValueError):
        L2DPConfig(**small_common(), rho_s=1.0)
    with pytest.raises(ValueError):
        L2DPConfig(**small_common(), ae_mode="other")
    with pytest.raises(ValueError):
        NaiveGaussianConfig(**small_common(), task_size=480, delta=0.0)
    with pytest.raises(ValueError):
        BoundedAGEMConfig(**small_common(), memory_share=1.5, task_size=480)
    with pytest.raises(ValueError):
        L2DPConfig(**small_common(batch_size=0))
    with pytest.raises(ValueError):
        L2DPConfig(**small_common(task_ids=("a", "a")))


def test_taylor_loss_error_bound():
    from beam_dp.mechanisms.lifelong.l2dp import taylor_loss

    z = np.linspace(-1.0, 1.0, 2001)
    for y in (0.0, 1.0):
        exact = np.log1p(np.exp(z)) - y * z
        approx = taylor_loss(z, y)
        assert np.all(np.abs(exact - approx) <= z**4 / 192 + 1e-15)
    assert taylor_loss(0.3, 1.0) == pytest.approx(math.log(2) - 0.5 * 0.3 + 0.09 / 8, abs=1e-15)


def test_metrics_worked_example():
    a = [[0.9, 0.1, 0.1], [0.7, 0.8, 0.1], [0.6, 0.7, 0.9]]
    assert average_accuracy(a)[-1] == pytest.approx(0.733333333333, abs=1e-12)
    assert forgetting(a) == pytest.approx([0.3, 0.1])
    assert average_forgetting(a) == pytest.approx(0.2)
    assert 0.0 <= curve_p_value([0.9, 0.8, 0.7], [0.2, 0.1, 0.15]) < 0.01


def test_naive_gaussian_calibration_per_stream():
    """Check 13: z gives ε/(2m) per stream at δ/(2m) (to 1e-6); the totals sum to ε over m tasks."""
    learner = build_learner(NaiveGaussianConfig(**small_common(), task_size=480, epsilon=1.0, delta=1e-5, num_tasks=5,
                                  accountant="rdp"))
    for q, steps in [(32 / 600, 40), (1.0, 3)]:
        z = learner.noise_multiplier(q, steps)
        eps = epsilon_of(dpsgd_event(q, z, steps), learner.stream_delta)
        assert learner.stream_epsilon - 1e-6 <= eps <= learner.stream_epsilon
    assert learner.stream_epsilon * 2 * 5 == pytest.approx(1.0)
    assert learner.stream_delta * 2 * 5 == pytest.approx(1e-5)


def test_bounded_accountant_fixed_for_any_number_of_tasks():
    """Each example's event (own task + K memory uses) is calibrated to ε: the total does not grow with m."""
    learner = build_learner(BoundedAGEMConfig(**small_common(task_ids=None), task_size=480, epsilon=1.0, delta=1e-5, memory_uses=20,
                                memory_share=0.3, accountant="rdp"))
    assert epsilon_of(dpsgd_event(1.0, learner.memory_noise_multiplier, 20), 1e-5) <= 0.3
    from beam_dp.core.accounting.lifelong import calibrate_noise_multiplier

    for q, steps in [(32 / 500, 30)]:
        z = calibrate_noise_multiplier(lambda v: learner.example_event(q, v, steps), 1.0, 1e-5)
        assert 1.0 - 1e-6 <= epsilon_of(learner.example_event(q, z, steps), 1e-5) <= 1.0
