"""A-GEM projection (check 9) and CPU/CUDA code-path selection."""

from unittest import mock

import pytest
import torch

from beam_dp.mechanisms.lifelong import L2DPConfig, select_device
from beam_dp.mechanisms.lifelong.agem import project, project_blocks
from tests.lifelong.conftest import small_common


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
        assert select_device("auto").type == "cpu"
        with pytest.raises(ValueError):
            select_device("cuda")
        assert L2DPConfig(**small_common(device="auto")).build().device.type == "cpu"
    with mock.patch("torch.cuda.is_available", return_value=True):
        assert select_device("auto").type == "cuda"
        assert select_device("cuda").type == "cuda"
        assert select_device("cpu").type == "cpu"
    with pytest.raises(ValueError):
        select_device("tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(digits):  # pragma: no cover - runs only where a GPU is present
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    tasks, _ = digits
    out = {}
    for device in ("cpu", "cuda"):
        learner = L2DPConfig(**small_common(steps_per_task=5, device=device), epsilon=1.0).build()
        state = learner.init_state("s")
        for task in tasks:
            state, rel = learner.step(state, task, NoiseSource(TEST_KEY))
        out[device] = rel[0].arrays()
    for k in out["cpu"]:
        assert torch.allclose(torch.as_tensor(out["cpu"][k]), torch.as_tensor(out["cuda"][k]), rtol=1e-6, atol=1e-8)
