"""A-GEM projection (check 9) and CPU/CUDA code-path selection."""

from unittest import mock

import numpy as np
import pytest
import torch

from beam_dp.mechanisms.lifelong import L2DPConfig, resolve_device
from beam_dp.mechanisms.lifelong.agem import project, project_blocks
from beam_dp.mechanisms.lifelong.factory import build_learner
from tests.mechanisms.lifelong.conftest import small_common


def test_projection_property():
    gen = torch.Generator().manual_seed(0)
    conflicts = 0
    for _ in range(200):
        g = torch.randn(50, generator=gen, dtype=torch.float64)
        ref = torch.randn(50, generator=gen, dtype=torch.float64)
        out = project(g, ref)
        if torch.dot(g, ref) < 0:
            conflicts += 1
            assert abs(torch.dot(out, ref)) <= 1e-10 * torch.linalg.norm(g) * torch.linalg.norm(ref)
        else:
            assert torch.equal(out, g)
        assert torch.dot(out, ref) >= -1e-10 * torch.linalg.norm(g) * torch.linalg.norm(ref)
        literal = project(g, ref, always=True)
        assert abs(torch.dot(literal, ref)) <= 1e-10 * torch.linalg.norm(g) * torch.linalg.norm(ref)
    assert conflicts > 50
    g = torch.randn(5, generator=gen, dtype=torch.float64)
    assert torch.equal(project(g, torch.zeros(5, dtype=torch.float64)), g)
    assert torch.equal(project(g, torch.zeros(5, dtype=torch.float64), always=True), g)


def test_projection_per_block():
    g = {"a": torch.tensor([1.0, 0.0], dtype=torch.float64), "b": torch.tensor([1.0], dtype=torch.float64)}
    ref = {"a": torch.tensor([-1.0, 1.0], dtype=torch.float64), "b": torch.tensor([1.0], dtype=torch.float64)}
    out = project_blocks(g, ref, [("a",), ("b",)])
    assert torch.dot(out["a"], ref["a"]) == 0 and torch.equal(out["b"], g["b"])  # only the conflicting block moves


def test_device_selection_paths():
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError):
            resolve_device("cuda")
        assert build_learner(L2DPConfig(**small_common(device="auto"))).device.type == "cpu"
    with mock.patch("torch.cuda.is_available", return_value=True):
        assert resolve_device("auto").type == "cuda"
        assert resolve_device("cuda").type == "cuda"
        assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError):
        resolve_device("tpu")


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
U = torch.finfo(torch.float64).eps / 2  # unit roundoff of float64, 2^-53


def _rounding_tolerance(learner, rows: int, scale: float) -> float:
    """Worst-case difference of one float64 sum of ``rows`` clipped per-example gradients on two devices.

    Each device's result is within ``γ·Σ|terms|`` of the exact value, ``γ ≈ (L·K + P + rows)·u``: a chain of
    L ≤ 4 layers of dot products of length ≤ K (forward and backward), the per-example norm over P
    parameters (it sets the clip factor) and the sum over rows (Higham, Accuracy and Stability, §3.1);
    ``Σ|terms| ≤ rows·scale`` (each clipped term ≤ C). Two devices: twice that."""
    cfg = learner.config
    k = max(cfg.input_dim, cfg.hidden, *cfg.g_layers, cfg.n_classes, rows)
    return 2 * (4 * k + learner.size + rows) * U * rows * scale


def _bounded(device, **kw):
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    return build_learner(BoundedAGEMConfig(**small_common(device=device, steps_per_task=5, optimizer="sgd", **kw), task_size=480,
                             epsilon=1.0, clip_norm=0.5, memory_uses=3))


@CUDA
def test_cuda_and_cpu_share_every_noise_cell_and_batch(digits):  # pragma: no cover - needs a GPU
    """What the devices share exactly: the keyed noise cells and the sampling decisions are drawn on the
    host and moved to the device, so they are bit-identical on CPU and CUDA."""
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    chunks = [next(_bounded(d)._chunks(NoiseSource(TEST_KEY), "s", 2, len(tasks[1]), 32 / 480, 5, [32], [0], 1.3, 2.0))
              for d in ("cpu", "cuda")]
    cpu, cuda = chunks
    assert torch.equal(cpu.rows, cuda.rows.cpu()) and np.array_equal(cpu.offsets, cuda.offsets)
    assert torch.equal(cpu.mem_rows, cuda.mem_rows.cpu()) and np.array_equal(cpu.mem_used, cuda.mem_used)
    assert torch.equal(cpu.noise, cuda.noise.cpu()) and torch.equal(cpu.mem_noise, cuda.mem_noise.cpu())
    states = [build_learner(L2DPConfig(**small_common(device=d), epsilon=1.0)) for d in ("cpu", "cuda")]
    chis = [learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY)).noise for learner in states]
    assert all(np.array_equal(chis[0][k], chis[1][k]) for k in chis[0])


@CUDA
def test_cuda_step_within_rounding_of_cpu(digits):  # pragma: no cover - needs a GPU
    """One step's clipped gradient sums (float64) agree within the rounding bound of ``_rounding_tolerance``."""
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    sums = []
    for device in ("cpu", "cuda"):
        learner = _bounded(device)
        state = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY))
        x = torch.as_tensor(tasks[0].x[:64], device=learner.device)
        y = torch.as_tensor(tasks[0].y[:64], device=learner.device)
        sums.append(learner._clipped_sums(learner._flat(state.params), x, y, 40).cpu())
    assert (sums[0] - sums[1]).abs().max() <= _rounding_tolerance(learner, 64, 0.5)


@CUDA
@pytest.mark.parametrize("kind", ["bounded", "l2dp"])
def test_cuda_matches_cpu(digits, kind):  # pragma: no cover - runs only where a GPU is present
    """Whole runs (3 tasks × 5 steps, float64, SGD) agree within the per-step rounding bound propagated over
    T steps: ``|Δθ| ≤ T·lr·(tol_step/λ)·g_max·10`` with g_max the largest gradient entry (L2DP-ML's reach
    ~1e5: χ/λ), the factor 10 for the growth of an early difference through 15 small SGD steps (lr·L ≪ 1).
    Not promised for Adam: it divides by √v̂ + 1e-8 and turns a rounding difference in a near-zero
    gradient into an update difference up to lr/1e-8 times larger (why rtol = 1e-6 failed on an H200)."""
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    out, learner = {}, None
    for device in ("cpu", "cuda"):
        learner = (_bounded(device) if kind == "bounded" else
                   build_learner(L2DPConfig(**small_common(steps_per_task=5, device=device, optimizer="sgd"), epsilon=1.0)))
        state = learner.init_state("s")
        for task in tasks:
            state, rel = learner.step(state, task, NoiseSource(TEST_KEY))
        out[device] = rel[0].arrays()
    lr, steps, lam = learner.config.learning_rate, 15, learner.config.batch_size
    g_max = 1e5 if kind == "l2dp" else 0.5 * (1 + 10)  # clipped sum ≤ λC plus noise of a few z·C
    size = sum(v.size for v in out["cpu"].values())
    k = max(learner.config.input_dim, learner.config.hidden, *learner.config.g_layers, lam)
    tol = steps * lr * 10 * g_max * 2 * (4 * k + size + lam) * float(U)
    for name in out["cpu"]:
        assert np.abs(out["cpu"][name] - out["cuda"][name]).max() <= tol, name


@CUDA
def test_retried_run_on_cuda_is_bit_identical(digits):  # pragma: no cover - needs a GPU
    """A retry on the same device type reproduces its release bit for bit."""
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    runs = []
    for _ in range(2):
        learner = _bounded("cuda")
        state = learner.init_state("s")
        for task in tasks:
            state, rel = learner.step(state, task, NoiseSource(TEST_KEY))
        runs.append(rel[0])
    assert runs[0] == runs[1]


def test_rounding_tolerance_detects_a_precision_change(digits):
    """Negative control on CPU: the device tolerance is tight enough that a float32 computation of the same
    step (what a device silently running in lower precision would give) falls outside it, while the same
    float64 step on the same device is inside (exactly equal)."""
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    out = {}
    for dtype in ("float64", "float32"):
        learner = _bounded("cpu", dtype=dtype)
        state = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY))
        x = torch.as_tensor(tasks[0].x[:64], dtype=learner.dtype)
        out[dtype] = learner._clipped_sums(learner._flat(state.params), x, torch.as_tensor(tasks[0].y[:64]), 40)
    tol = _rounding_tolerance(_bounded("cpu"), 64, 0.5)
    assert (out["float64"] - out["float32"].double()).abs().max() > tol
