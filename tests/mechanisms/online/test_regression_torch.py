"""PRIVINCREG₁/₂ on the torch backend (issue 27.5): the same noise cells as numpy, releases equal to
numpy's within float64 reassociation, restore from encoded states, groups, refusals; CUDA against the
CPU (skipped without CUDA).

Tolerance. Both backends release ``P_t + Σ noise`` of the same cells, added in another order: each tree
entry is a sum of at most ``t + 2 log₂ t`` terms of size ``<= max(t, |noise|)``, so the two differ by at
most ``(t + 2 log t)·max·2⁻⁵³ ≈ 1e-13`` here (t <= 40, |noise| < 1e3). NOISYPROJGRAD then runs ``r_t``
steps of ``θ ↦ Π(θ − η g(θ))`` whose map is ``(1 + 2η‖Q̂‖)``-Lipschitz (the projection is
non-expansive); with ``r_t`` and ``η_t‖Q̂‖`` of these configurations (r_t <= 40, growth < 1e3 in all)
the releases agree to ``1e-9`` absolute, asked here.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from beam_dp.core.noise import NoiseSource  # noqa: E402
from beam_dp.mechanisms.online.regression import PrivIncReg1, make_incremental_regression  # noqa: E402
from beam_dp.mechanisms.sums.tree import make_tree_sum  # noqa: E402

KEY = bytes(range(32))
DIM, T = 6, 40
TOL = 1e-9
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CONFIGS = {
    "reg1-binary-l1": ("privincreg1", dict(constraint="l1_ball", horizon=T, epsilon=4.0)),
    "reg1-hybrid-l2-sym-every3": ("privincreg1", dict(constraint="l2_ball", epsilon=50.0, calibration="analytic",
                                                      symmetrize=True,
                                                      release_every=3)),
    "reg1-doubling-l2": ("privincreg1", dict(constraint="l2_ball", unbounded="doubling", epsilon=8.0)),
    "reg2-binary-l2": ("privincreg2", dict(constraint="l2_ball", horizon=T, m=4, epsilon=8.0)),
}


class RecordingNoise(NoiseSource):
    """A NoiseSource that logs every cell it draws (law, streams, purpose, index)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.cells: list = []

    def draw_cells(self, law, streams, purpose, index, scale, size):
        self.cells.append((law, tuple(streams), purpose, tuple(np.asarray(index).reshape(-1).tolist()), scale, size))
        return super().draw_cells(law, streams, purpose, index, scale, size)


def data(n=T, dim=DIM, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim)) * 0.6
    return X, np.clip(X @ rng.normal(size=dim) * 0.4, -1.5, 1.5)  # some |y| > 1 and ‖x‖ > 1: clipped


def mech(name, backend, device="cpu"):
    algo, kw = CONFIGS[name]
    return make_incremental_regression(algo, dim=DIM, delta=1e-6, backend=backend, device=device, **kw)


def releases(m, noise, X, y, stream="s"):
    return m.run(stream, list(zip(X, y)), noise)


@pytest.mark.parametrize("unbounded,horizon", [("hybrid", None), ("doubling", None), ("hybrid", 100)])
def test_nodes_used_partition_the_steps(unbounded, horizon):
    """The premise of the device tree: the nodes used at t cover 1..t exactly once (so their clean sums
    add to P_t), and a node used at t+1 was used at t or is noised at t+1 (so keeping used(t) suffices)."""
    tree = make_tree_sum(dim=1, epsilon=1.0, delta=1e-6, sensitivity=2.0, noise="gaussian", horizon=horizon,
                         unbounded=unbounded)
    for t in range(1, 100):
        steps = sorted(s for node in tree.nodes_used(t) for s in range(tree.node_steps(node)[0], tree.node_steps(node)[1] + 1))
        assert steps == list(range(1, t + 1))
        if t > 1:
            assert set(tree.nodes_used(t)) <= set(tree.nodes_used(t - 1)) | set(tree.nodes_noised_at(t))


@pytest.mark.parametrize("name", CONFIGS)
def test_torch_cpu_matches_numpy_with_the_same_noise_cells(name):
    X, y = data()
    noise_np, noise_t = RecordingNoise(KEY), RecordingNoise(KEY)
    ref, got = releases(mech(name, "numpy"), noise_np, X, y), releases(mech(name, "torch"), noise_t, X, y)
    assert noise_t.cells == noise_np.cells and len(noise_np.cells) == 2 * T  # one node per tree per step, once
    assert [r.step for r in got] == [r.step for r in ref] and len(ref) >= T // 3
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b.value["theta"], a.value["theta"], rtol=0, atol=TOL)
        assert (b.epsilon_spent, b.delta_spent) == (a.epsilon_spent, a.delta_spent)  # the same public arithmetic
        assert b.meta["r_t"] == a.meta["r_t"] and b.meta["sigma_Q"] == a.meta["sigma_Q"]


def test_retry_on_cpu_is_bit_for_bit_and_restore_reproduces():
    X, y = data()
    m = mech("reg1-hybrid-l2-sym-every3", "torch")
    first = [r.value["theta"] for r in releases(m, NoiseSource(KEY), X, y)]
    again = [r.value["theta"] for r in releases(m, NoiseSource(KEY), X, y)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))  # exact: same ops, same order
    # restore mid-run from bytes: the node noise is redrawn from its keys (the same cells)
    noise = RecordingNoise(KEY)
    state, out = m.init_state("s"), []
    for i, (x, v) in enumerate(zip(X, y)):
        if i in (7, 21):
            state = m.decode_state(m.encode_state(state))
        state, rel = m.step(state, (x, v), noise)
        out += [r.value["theta"] for r in rel]
    assert len(out) == len(first)
    for a, b in zip(first, out):
        np.testing.assert_allclose(b, a, rtol=0, atol=TOL)
    drawn = {c[2:4] for c in noise.cells}
    assert len(drawn) == 2 * T < len(noise.cells)  # the redraws repeat cells; no new cell appears


def test_group_step_on_torch_matches_numpy_groups():
    streams = ("a", "b", "c")
    X, y = data(n=3 * T)
    rows = np.tile(np.arange(3), T)
    out = {}
    for backend in ("numpy", "torch"):
        m = mech("reg1-doubling-l2", backend)
        group, thetas = m.init_group(streams), []
        for t in range(T):
            sl = slice(3 * t, 3 * t + 3)
            group, batch = m.step_group(group, X[sl], y[sl], rows[sl], NoiseSource(KEY))
            thetas.append(batch.values)
        out[backend] = np.array(thetas)
        states = m.unstack(group)
        assert [s.stream for s in states] == list(streams) and states[1].t == T
    np.testing.assert_allclose(out["torch"], out["numpy"], rtol=0, atol=TOL)


def test_torch_backend_refusals():
    with pytest.raises(ValueError, match="backend"):
        PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6, backend="jax")
    with pytest.raises(ValueError, match="device"):
        PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6, backend="torch", device="tpu")
    m = PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6, horizon=2, backend="torch")
    state = m.init_state("s")
    for _ in range(2):
        state, _ = m.step(state, (np.ones(3), 0.5), NoiseSource(KEY))
    with pytest.raises(ValueError, match="horizon"):
        m.step(state, (np.ones(3), 0.5), NoiseSource(KEY))
    with pytest.raises(ValueError):  # non-finite input refused before it reaches the device
        PrivIncReg1(dim=3, epsilon=1.0, delta=1e-6, backend="torch").step(m.init_state("s"), (np.array([np.nan, 0, 0]), 0.5),
                                                                          NoiseSource(KEY))


@CUDA
@pytest.mark.parametrize("name", CONFIGS)
def test_cuda_matches_cpu(name):
    X, y = data()
    cpu = releases(mech(name, "torch", "cpu"), NoiseSource(KEY), X, y)
    gpu = releases(mech(name, "torch", "cuda"), NoiseSource(KEY), X, y)
    gpu2 = releases(mech(name, "torch", "cuda"), NoiseSource(KEY), X, y)
    for a, b, c in zip(cpu, gpu, gpu2):
        assert b.value["theta"].tobytes() == c.value["theta"].tobytes()  # a retry on CUDA: exact
        np.testing.assert_allclose(b.value["theta"], a.value["theta"], rtol=0, atol=TOL)  # see the module docstring
