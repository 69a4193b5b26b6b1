"""Fixtures of the lifelong tests: scikit-learn digits scaled to [−1, 1], split into class-group tasks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny networks: threads only contend on the shared 2-core machine

GROUPS = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))


def digits_tasks(seed: int = 0, groups=GROUPS):
    """Keyed 80/20 split of ``load_digits`` (x in [−1, 1]); returns (tasks, eval_sets)."""
    from sklearn.datasets import load_digits

    from beam_dp.mechanisms.lifelong import TaskData

    digits = load_digits()
    x, y = digits.data / 8.0 - 1.0, digits.target
    perm = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    train, test = perm[:cut], perm[cut:]
    tasks, evals = [], {}
    for i, group in enumerate(groups):
        m = np.isin(y[train], group)
        tasks.append(TaskData(str(i), x[train][m], y[train][m]))
        m = np.isin(y[test], group)
        evals[str(i)] = (x[test][m], y[test][m])
    return tasks, evals


@pytest.fixture(scope="session")
def digits():
    return digits_tasks()


def small_common(evals=None, **overrides):
    """The §14 check 11 network (β = 32, G = 64 ReLU → 32 clipped, λ = 32) on CPU."""
    kw = dict(input_dim=64, n_classes=10, hidden=32, g_layers=(64, 32), batch_size=32, epochs=1,
              task_ids=("0", "1", "2"), eval_sets=evals, device="cpu")
    kw.update(overrides)
    return kw
