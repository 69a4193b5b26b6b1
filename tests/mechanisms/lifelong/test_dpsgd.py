"""NaiveGaussian and the bounded-participation DP-SGD + A-GEM learner (check 13 and accountant totals)."""

import numpy as np
import pytest
import torch

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.lifelong import AGEMConfig, BoundedAGEMConfig, NaiveGaussianConfig, TaskData
from beam_dp.mechanisms.lifelong.dpsgd import BudgetExhausted
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.testing.stats import gaussian_variance_matches
from tests.conftest import TEST_KEY
from tests.mechanisms.lifelong.conftest import small_common


def test_per_example_clipping(digits):
    tasks, _ = digits
    learner = build_learner(BoundedAGEMConfig(**small_common(), task_size=480, clip_norm=0.05))
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
    learner = build_learner(BoundedAGEMConfig(**small_common(), task_size=480, clip_norm=0.5))
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
    learner = build_learner(NaiveGaussianConfig(**small_common(evals), task_size=480, epsilon=3.0, delta=1e-5, num_tasks=3))
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
        build_learner(cfg).step(state, TaskData("extra", digits[0][0].x, digits[0][0].y), NoiseSource(TEST_KEY))


def test_bounded_learner_total_fixed_and_memory_cap(digits):
    tasks, _ = digits
    many = [TaskData(f"{i}", t.x, t.y) for i, t in enumerate(tasks + tasks[:1])]  # 4 tasks
    learner = build_learner(BoundedAGEMConfig(**small_common(task_ids=None, steps_per_task=8), task_size=480, epsilon=1.0, memory_uses=5))
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
    learner = build_learner(AGEMConfig(**small_common(evals, epochs=5)))
    assert learner.guarantee is None
    state, rel = learner.step(learner.init_state("s"), tasks[0], NoiseSource(TEST_KEY))
    assert rel[0].meta["accuracy"]["0"] > 0.8


class CellLog(NoiseSource):
    """Records every Gaussian cell; overriding the one-cell sampler makes ``draw_cells`` go cell by cell
    through it, so a run under this source draws each cell alone (the step-by-step reference)."""

    def __init__(self, key=TEST_KEY):
        super().__init__(key)
        self.cells = []

    def gaussian(self, stream, purpose, index, sigma, size):
        self.cells.append((purpose, tuple(index)))
        return super().gaussian(stream, purpose, index, sigma, size)


def _bounded(**overrides):
    kw = dict(small_common(task_ids=None, steps_per_task=9), task_size=480, epsilon=1.0, memory_uses=4)
    kw.update(overrides)
    return build_learner(BoundedAGEMConfig(**kw))


def _run(learner, tasks, noise):
    state, out = learner.init_state("s"), []
    for task in tasks:
        state, rel = learner.step(state, task, noise)
        out += rel
    return state, out


def test_chunked_noise_draws_exactly_the_step_cells(digits, monkeypatch):
    """A chunk's noise is the cells ``(stream, purpose, (τ, s))`` of its steps, the same numbers as one
    draw per step: a run in chunks of 2 steps, one in a single chunk, and one drawing every cell alone
    release bit-identical models (exact: the same noise, masks and float operations in the same order),
    and the cells drawn are exactly one task cell per step and one memory cell per reference step."""
    from beam_dp.mechanisms.lifelong import dpsgd

    tasks, _ = digits
    _, whole = _run(_bounded(), tasks, NoiseSource(TEST_KEY))
    log = CellLog()
    _, alone = _run(_bounded(), tasks, log)
    learner = _bounded()
    monkeypatch.setattr(dpsgd, "CHUNK_CELLS", 2 * (len(tasks[0]) + 32 + 2 * learner.size))
    _, chunked = _run(learner, tasks, NoiseSource(TEST_KEY))
    assert whole == alone == chunked
    task_cells = sorted(c for c in log.cells if c[0].endswith("noise-task"))
    assert task_cells == sorted(("dpsgd_agem_bounded/noise-task", (tau, s)) for tau in (1, 2, 3) for s in range(9))
    memory_cells = [c for c in log.cells if c[0].endswith("noise-memory")]
    assert len(memory_cells) == len(set(memory_cells)) == sum(r.meta["reference_steps"] for r in whole) == 8


def test_poisson_masks_of_a_chunk_are_the_per_step_draws(digits):
    """One ``(S, n)`` draw per chunk gives each step the rows ``random(n) < q`` of a step-by-step draw."""
    tasks, _ = digits
    learner, n, q = _bounded(), len(tasks[0]), 32 / 480
    noise = NoiseSource(TEST_KEY)
    chunk = next(learner._chunks(noise, "s", 1, n, q, 9, [], [], 1.0, None))
    rng = noise.generator("s", "dpsgd_agem_bounded/sample", 1)
    for s in range(9):
        want = np.flatnonzero(rng.random(n) < q)
        assert np.array_equal(chunk.rows[chunk.offsets[s]: chunk.offsets[s + 1]].numpy(), want)


def test_accountant_runs_once_per_public_task_shape(digits, monkeypatch):
    """The noise multiplier is calibrated once per (q, steps, ε, δ, memory) — never in the step loop, and not
    again for a later task of the same declared size."""
    from beam_dp.core.accounting import lifelong as accounting

    calls = []
    real = accounting.calibrate_noise_multiplier
    monkeypatch.setattr(accounting, "calibrate_noise_multiplier", lambda *a: calls.append(a) or real(*a))
    accounting.dpsgd_noise_multiplier.cache_clear()
    tasks, _ = digits
    _run(_bounded(epsilon=0.7), tasks, NoiseSource(TEST_KEY))
    assert len(calls) == 2  # the memory multiplier (at construction) and one task shape for all three tasks


def test_task_size_is_public_and_the_true_size_is_not_released(digits):
    """q and the step count come from the declared task_size: tasks of different true sizes (an empty one
    included) release the same public fields; a config without task_size is refused."""
    tasks, _ = digits
    with pytest.raises(ValueError, match="task_size is required"):
        BoundedAGEMConfig(**small_common(), epsilon=1.0)
    small = TaskData("0", tasks[0].x[:200], tasks[0].y[:200])
    fields = ("steps", "sampling_rate", "task_size", "epochs", "noise_multiplier", "reference_steps", "memory_batches")
    metas = []
    for task in (tasks[0], small, TaskData("0", tasks[0].x[:0], tasks[0].y[:0])):
        learner = _bounded(steps_per_task=None, epochs=1)
        _, (rel,) = learner.step(learner.init_state("s"), task, NoiseSource(TEST_KEY))
        metas.append(({k: rel.meta[k] for k in fields}, rel.epsilon_spent, rel.delta_spent))
    assert metas[0] == metas[1]
    assert metas[0][0]["steps"] == 15 and metas[0][0]["sampling_rate"] == 32 / 480


def test_micro_batches_sum_to_the_whole_batch(digits):
    """Splitting a logical batch into micro-batches changes only the summation order: the clipped sums agree
    to 1e-12 relative (float64; a few hundred terms of size <= C)."""
    tasks, _ = digits
    whole, micro = _bounded(clip_norm=0.5), _bounded(clip_norm=0.5, micro_batch=7)
    state = whole._initialise(whole.init_state("s"), NoiseSource(TEST_KEY))
    w = whole._flat(state.params)
    x, y = torch.as_tensor(tasks[0].x[:100]), torch.as_tensor(tasks[0].y[:100])
    a, b = whole._clipped_sums(w, x, y, 60), micro._clipped_sums(w, x, y, 60)
    assert torch.allclose(a, b, rtol=0, atol=1e-12 * 100 * 0.5)
    params = {k: torch.as_tensor(v) for k, v in state.params.items()}
    assert torch.allclose(a[0], whole.clipped_per_example_gradients(params, x[:60], y[:60]).sum(0), atol=1e-12 * 60)


def test_retried_task_reproduces_its_release_in_a_new_process(digits, tmp_path):
    """A retry on a fresh worker (a new process, same device type and thread count) releases the same bytes."""
    import hashlib
    import subprocess
    import sys

    def digest(releases):
        return hashlib.sha256(b"".join(np.ascontiguousarray(r.value[k]).tobytes()
                                       for r in releases for k in sorted(r.value))).hexdigest()

    tasks, _ = digits
    _, here = _run(_bounded(), tasks[:2], NoiseSource(TEST_KEY))
    script = ("import torch, numpy as np, hashlib; torch.set_num_threads(1)\n"
              "from tests.mechanisms.lifelong.conftest import digits_tasks\n"
              "from tests.mechanisms.lifelong.test_dpsgd import _bounded, _run\n"
              "from beam_dp.core import NoiseSource\nfrom tests.conftest import TEST_KEY\n"
              "_, rel = _run(_bounded(), digits_tasks()[0][:2], NoiseSource(TEST_KEY))\n"
              "print(hashlib.sha256(b''.join(np.ascontiguousarray(r.value[k]).tobytes() for r in rel "
              "for k in sorted(r.value))).hexdigest())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == digest(here)
