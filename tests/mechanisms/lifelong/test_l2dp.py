"""L2DP-ML: the spec's checks 1–9, 11, 12 and 14 (lifelong-dp §14) on scikit-learn digits."""

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.lifelong import L2DPConfig, TaskData, TaskOrderError
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.mechanisms.lifelong.l2dp import GUARANTEE_BASIS, l2dp_gradients
from tests.conftest import TEST_KEY
from tests.mechanisms.lifelong.conftest import digits_tasks, small_common


class CountingNoise(NoiseSource):
    """Counts Laplace draws (the χ's are the only Laplace noise of L2DP-ML)."""

    def __init__(self, key=TEST_KEY):
        super().__init__(key)
        self.laplace_calls = []

    def laplace(self, stream, purpose, index, scale, size):
        self.laplace_calls.append((stream, purpose, index))
        return super().laplace(stream, purpose, index, scale, size)


def run(learner, tasks, noise, stream="s", state=None):
    state = learner.init_state(stream) if state is None else state
    releases, states = [], []
    for task in tasks:
        state, rel = learner.step(state, task, noise)
        releases += rel
        states.append(state)
    return states, releases


@pytest.fixture(scope="module")
def quick(digits):
    tasks, evals = digits
    learner = build_learner(L2DPConfig(**small_common(evals, epochs=2), epsilon=1.0))
    noise = CountingNoise()
    states, releases = run(learner, tasks, noise)
    return learner, tasks, noise, states, releases


def test_noise_drawn_once_and_reused(quick):
    learner, _, noise, states, _ = quick
    assert sorted(p for _, p, _ in noise.laplace_calls) == ["l2dp-chi1", "l2dp-chi2", "l2dp-chi3"]
    for name in ("chi1", "chi2", "chi3"):
        first = states[0].noise[name]
        assert all(s.noise[name].tobytes() == first.tobytes() for s in states)
        restored = learner.decode_state(learner.encode_state(states[-1]))
        assert restored.noise[name].tobytes() == first.tobytes()
    assert states[0].noise["chi3"].shape == (33, 10)


def test_noise_equal_for_equal_keys_and_different_otherwise():
    learner = build_learner(L2DPConfig(**small_common(), epsilon=1.0))
    a = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY)).noise
    b = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY)).noise
    c = learner._initialise(learner.init_state("s"), NoiseSource(bytes(32))).noise
    d = learner._initialise(learner.init_state("t"), NoiseSource(TEST_KEY)).noise
    for k in a:
        assert a[k].tobytes() == b[k].tobytes()
        assert not np.array_equal(a[k], c[k]) and not np.array_equal(a[k], d[k])


def test_noise_laws_ks_with_negative_control():
    """χ's pooled over 500 streams against Laplace with the §3 scales: KS at level 1e-3 for the law, and
    the scale's sufficient statistic mean|χ|/b, which is Gamma(n, 1)/n (mean 1, sd 1/√n), within
    4.5/√n of 1 (two-sided level ≈ 7e-6). A scale 10% off moves it to 1/1.1 = 1 − 0.091, at least
    0.091·√n ≥ 11.5 sd for the smallest pool (χ_2: n = 500·32 = 16,000), so the mutant is rejected
    except with probability ≈ P(Z > 7) ≈ 1e-12; the KS negative control on χ_3 (n = 165,000): the
    Laplace(b) vs Laplace(1.1 b) CDF distance is 0.0175, √n·0.0175 ≈ 7.1 against the critical 1.95."""
    learner = build_learner(L2DPConfig(**small_common(), epsilon=1.0))
    noise = NoiseSource(TEST_KEY)
    draws = [learner._initialise(learner.init_state(f"s{i}"), noise).noise for i in range(500)]
    for name, purpose in (("chi1", "l2dp-chi1"), ("chi2", "l2dp-chi2"), ("chi3", "l2dp-chi3")):
        sample = np.concatenate([d[name].ravel() for d in draws])
        scale, tolerance = learner.noise_scales[purpose], 4.5 / np.sqrt(sample.size)
        assert stats.kstest(sample, "laplace", args=(0, scale)).pvalue > 1e-3
        assert abs(np.abs(sample).mean() / scale - 1.0) < tolerance
        assert abs(np.abs(sample).mean() / (1.1 * scale) - 1.0) > tolerance  # negative control
        if name == "chi3":
            assert stats.kstest(sample, "laplace", args=(0, 1.1 * scale)).pvalue < 1e-3


def test_fixed_disjoint_batches_and_memory(quick, digits):
    learner, tasks, _, states, releases = quick
    noise = NoiseSource(TEST_KEY)
    for tau, task in enumerate(tasks, start=1):
        batches = learner.partition(noise, "s", tau, len(task))
        again = learner.partition(noise, "s", tau, len(task))
        assert np.array_equal(batches, again)
        assert batches.shape == (len(task) // 32, 32)
        assert len(np.unique(batches)) == batches.size  # every used tuple in exactly one batch
        assert releases[tau - 1].meta["dropped_rows"] == len(task) % 32
        state = states[tau - 1]
        assert len(state.memory_x) == tau  # one batch per task
        x_bar = learner.perturb(state, task.x)
        stored = state.memory_x[tau - 1]
        assert any(np.array_equal(stored, x_bar[b]) for b in batches)  # exactly one batch of its task
        for later in states[tau - 1:]:
            assert later.memory_x[tau - 1].tobytes() == stored.tobytes()  # never modified afterwards


def test_memory_holds_only_perturbed_data(quick):
    learner, tasks, _, states, _ = quick
    final = states[-1]
    shift = final.noise["chi1"] / 32
    for tau, stored in enumerate(final.memory_x):
        x = np.clip(tasks[tau].x, -1, 1)
        for row in stored:  # each row is x + χ_1/λ for one of the task's rows
            diffs = np.abs(row[None, :] - shift[None, :] - x).max(axis=1)
            assert diffs.min() <= 1e-12
            assert not (np.abs(row[None, :] - x).max(axis=1) <= 1e-12).any()
    raw = {tuple(r) for t in tasks for r in np.clip(t.x, -1, 1)}
    arrays = [a for a in final.memory_x] + list(final.params.values()) + list(final.opt.values())
    assert not any(tuple(r) in raw for a in arrays if a.ndim == 2 for r in a)


def test_accounting_and_release_metadata(quick):
    learner, _, _, states, releases = quick
    bound = 1.0 / 64
    assert learner.w1_bound == bound
    for state, release in zip(states, releases):
        assert np.abs(state.params["enc.W"]).max() <= bound
        assert release.epsilon_spent == 1.0 and release.delta_spent == 0.0
        assert release.meta["guarantee_basis"] == GUARANTEE_BASIS
        assert "paper_claim" in learner.guarantee.neighbouring
        assert "chi1" not in release.arrays() and set(release.arrays()) == set(state.params)
    assert learner.budget.total(32, 1.0) == pytest.approx(1.0, abs=1e-12)


def test_w1_clip_after_every_update(digits):
    tasks, _ = digits
    learner = build_learner(L2DPConfig(**small_common(steps_per_task=5), epsilon=1.0, learning_rate=0.5))
    state = learner.init_state("s")
    for task in tasks:
        state, _ = learner.step(state, task, NoiseSource(TEST_KEY))
        assert np.abs(state.params["enc.W"]).max() <= learner.w1_bound


def _batch(learner, state, task, rows=slice(0, 32)):
    p = {k: torch.as_tensor(v) for k, v in state.params.items()}
    x_bar = torch.as_tensor(learner.perturb(state, task.x[rows]))
    y = torch.eye(10, dtype=torch.float64)[torch.as_tensor(task.y[rows])]
    chi2 = torch.as_tensor(state.noise["chi2"])
    chi3 = torch.as_tensor(state.noise["chi3"])
    return p, x_bar, y, chi2, chi3


@pytest.mark.parametrize("label_path", ["autodiff", "constant"])
def test_label_path(quick, label_path):
    """Swapping the labels of two identical inputs keeps M_B, hence g: exactly when M_B is a constant
    coefficient; to rounding (1e-15 relative: only the summation order of the two rows changes) when it
    is differentiated through G."""
    learner, tasks, _, states, _ = quick
    task = tasks[0]
    x = task.x[:32].copy()
    x[1] = x[0]
    y = task.y[:32].copy()
    y[0], y[1] = 0, 3
    swapped = y.copy()
    swapped[0], swapped[1] = 3, 0
    grads = []
    for labels in (y, swapped):
        p, x_bar, onehot, chi2, chi3 = _batch(learner, states[0], TaskData("0", x, labels))
        grads.append(l2dp_gradients(p, x_bar, onehot, chi2, chi3, 32, 2, "code", label_path))
    for k in grads[0]:
        if label_path == "constant":
            assert torch.equal(grads[0][k], grads[1][k])
        else:
            scale = float(grads[0][k].abs().max())
            assert (grads[0][k] - grads[1][k]).abs().max() <= 1e-14 * max(scale, 1e-3)
    # one changed label moves M_B by at most Δ_L in L1 (h_π ∈ [−1, 1], bias unit 1)
    h_pi = np.concatenate([np.random.default_rng(0).uniform(-1, 1, (32, 32)), np.ones((32, 1))], axis=1)
    one_hot = np.eye(10)[task.y[:32]]
    changed = one_hot.copy()
    changed[5] = np.eye(10)[(task.y[5] + 1) % 10]
    assert np.abs(h_pi.T @ one_hot - h_pi.T @ changed).sum() <= learner.delta_l


def test_input_path_only_x_bar(digits):
    """Shifting x by +Δ and χ_1 by −λΔ (same x̄) gives bit-identical releases. Inputs are halved (multiples
    of 1/16 inside [−0.5, 0.5]) and χ_1 rounded to multiples of 1/32 so that both decompositions of x̄ are
    exact in floating point."""
    tasks, _ = digits
    tasks = [TaskData(t.task_id, t.x / 2, t.y) for t in tasks[:2]]
    learner = build_learner(L2DPConfig(**small_common(steps_per_task=4), epsilon=1.0))
    noise = NoiseSource(TEST_KEY)
    base = learner._initialise(learner.init_state("s"), noise)
    base = dataclasses.replace(base, noise=dict(base.noise, chi1=np.round(base.noise["chi1"] * 32) / 32))
    delta = 0.125
    shifted = dataclasses.replace(base, noise=dict(base.noise, chi1=base.noise["chi1"] - 32 * delta))
    moved = [TaskData(t.task_id, t.x + delta, t.y) for t in tasks]
    assert learner.perturb(base, tasks[0].x).tobytes() == learner.perturb(shifted, moved[0].x).tobytes()
    _, ref = run(learner, tasks, noise, state=base)
    _, out = run(learner, moved, noise, state=shifted)
    assert all(a == b for a, b in zip(ref, out))


def test_autoencoder_gradients(quick):
    learner, tasks, _, states, _ = quick
    p, x_bar, y, chi2, chi3 = _batch(learner, states[0], tasks[1])
    g = l2dp_gradients(p, x_bar, y, chi2, chi3, 32, 2, "paper")
    h_bar = torch.clamp(x_bar @ p["enc.W"] + p["enc.b"], -1, 1) + 2 * chi2 / 32
    expected = sum(torch.outer(0.5 - x_bar[r], h_bar[r]) for r in range(32)) / 32
    # 1e-12 relative to the largest entry (χ_2/λ makes entries ~1e5 at ε = 1)
    assert (g["enc.W"] - expected).abs().max() <= 1e-12 * expected.abs().max()
    g = l2dp_gradients(p, x_bar, y, chi2, chi3, 32, 2, "code")

    def r_code(w):
        h = torch.clamp(x_bar @ w + p["enc.b"], -1, 1) + 2 * chi2 / 32
        return torch.abs(np.log(2) + (0.5 - x_bar) * (h @ w.T)).sum() / 32

    rng = np.random.default_rng(1)
    for _ in range(5):  # central differences along random directions (float64)
        direction = torch.as_tensor(rng.standard_normal(p["enc.W"].shape))
        eps = 1e-7
        fd = (r_code(p["enc.W"] + eps * direction) - r_code(p["enc.W"] - eps * direction)) / (2 * eps)
        analytic = (g["enc.W"] * direction).sum()
        assert abs(fd - analytic) <= 1e-5 * abs(analytic)


def test_schedules_heterogeneous_balanced_and_order(digits):
    tasks, _ = digits
    hetero = build_learner(L2DPConfig(**small_common(epochs={"0": 2, "1": 1, "2": 3}), epsilon=1.0))
    _, rels = run(hetero, tasks, NoiseSource(TEST_KEY))
    for rel, task, e in zip(rels, tasks, (2, 1, 3)):
        assert rel.meta["steps"] == e * (len(task) // 32) and rel.meta["epochs"] == e
    balanced = build_learner(L2DPConfig(**small_common(steps_per_task=7), epsilon=1.0))
    _, rels = run(balanced, tasks, NoiseSource(TEST_KEY))
    assert [r.meta["steps"] for r in rels] == [7, 7, 7]
    reordered = build_learner(L2DPConfig(**small_common(steps_per_task=3, task_ids=("2", "0", "1")), epsilon=1.0))
    _, rels = run(reordered, [tasks[2], tasks[0], tasks[1]], NoiseSource(TEST_KEY))
    assert [r.meta["task"] for r in rels] == ["2", "0", "1"] and [r.step for r in rels] == [1, 2, 3]


def test_task_order_errors(digits):
    tasks, _ = digits
    learner = build_learner(L2DPConfig(**small_common(steps_per_task=2), epsilon=1.0))
    state, _ = learner.step(learner.init_state("s"), tasks[1], NoiseSource(TEST_KEY))
    with pytest.raises(TaskOrderError) as err:
        learner.step(state, tasks[0], NoiseSource(TEST_KEY))
    assert err.value.reason == "task_backwards"
    with pytest.raises(TaskOrderError) as err:
        learner.step(state, TaskData("9", tasks[0].x, tasks[0].y), NoiseSource(TEST_KEY))
    assert err.value.reason == "unknown_task"
    with pytest.raises(ValueError):
        learner.step(state, TaskData("2", tasks[2].x[:, :10], tasks[2].y), NoiseSource(TEST_KEY))


def test_determinism_and_restore(digits):
    tasks, _ = digits
    learner = build_learner(L2DPConfig(**small_common(steps_per_task=6), epsilon=1.0))
    _, a = run(learner, tasks, NoiseSource(TEST_KEY))
    _, b = run(learner, tasks, NoiseSource(TEST_KEY))
    assert all(x == y for x, y in zip(a, b))
    states, _ = run(learner, tasks[:1], NoiseSource(TEST_KEY))
    restored = learner.decode_state(learner.encode_state(states[-1]))
    _, c = run(learner, tasks[1:], NoiseSource(TEST_KEY), state=restored)
    assert all(x == y for x, y in zip(a[1:], c))


def test_small_epsilon_run_completes(digits):
    tasks, _ = digits
    learner = build_learner(L2DPConfig(**small_common(steps_per_task=3), epsilon=0.5))
    _, rels = run(learner, tasks, NoiseSource(TEST_KEY))
    assert [r.epsilon_spent for r in rels] == [0.5, 0.5, 0.5]


@pytest.mark.slow
def test_learns_on_digits():
    """Check 11: ε = 50, 20 epochs per task; over 6 seeds the mean within-task accuracy a_{τ,τ} is ≥ 0.85."""
    within = []
    for seed in range(6):
        tasks, evals = digits_tasks(seed)
        learner = build_learner(L2DPConfig(**small_common(evals, epochs=20), epsilon=50.0))
        _, rels = run(learner, tasks, NoiseSource(bytes([seed]) * 32))
        within += [r.meta["accuracy"][r.meta["task"]] for r in rels]
    assert np.mean(within) >= 0.85
