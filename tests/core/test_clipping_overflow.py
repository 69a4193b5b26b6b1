"""Clipping never overflows: a finite contribution far above the bound comes out at norm R in every
family's clip path (sums, ERM rows, online learners, regression, lifelong per-example gradients).

Floating point: a rescaled row ``(x/peak)·(R/‖x/peak‖)`` has recomputed norm R up to a few ulps, so
"norm R" is checked to 1e-12 relative; rows inside the bound must come back bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core.clipping import clip_l1, clip_l2, l2_norms
from beam_dp.mechanisms.erm.models import SoftmaxRegression
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.mechanisms.online.learners import make_online_learner
from beam_dp.mechanisms.online.regression import normalise_records
from beam_dp.mechanisms.sums.tree import make_tree_sum

RTOL = 1e-12
MAX = float(np.finfo(np.float64).max)
# each row: a finite contribution whose sum of squares overflows float64
HUGE_ROWS = np.array([[1e308, 0.5], [1e200, 0.0], [-MAX, 0.0], [MAX, -MAX], [1e155, 1e155]])
SMALL = np.array([[0.3, -0.4], [1e-3, 2e-3]])


def _assert_at_bound(out: np.ndarray, bound: float) -> None:
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(l2_norms(out), bound, rtol=RTOL)


def test_core_l2_huge_rows_at_bound_direction_kept():
    R = 2.0
    out, was = clip_l2(HUGE_ROWS, R)
    _assert_at_bound(out, R)
    assert was.all()
    assert out[0, 1] > 0 and out[0, 1] == pytest.approx(0.5 * R / 1e308, rel=1e-12)  # small coordinate kept
    assert out[2, 0] == pytest.approx(-R, rel=RTOL) and out[3, 0] == pytest.approx(-out[3, 1], rel=RTOL)
    single, was1 = clip_l2(np.array([-MAX]), R)
    assert single.tolist() == [pytest.approx(-R, rel=RTOL)] and was1.tolist() == [True]


def test_core_l2_underflowing_rows_clipped_against_a_tiny_bound():
    """Squares of 1e-170 underflow to 0: the norm is still 1.41e-170, above a bound of 1e-175."""
    out, was = clip_l2(np.array([[1e-170, 1e-170]]), 1e-175)
    assert was.tolist() == [True]
    assert l2_norms(out)[0] == pytest.approx(1e-175, rel=RTOL)
    same, was2 = clip_l2(np.array([[1e-170, 1e-170]]), 1.0)
    assert not was2.any() and np.array_equal(same, [[1e-170, 1e-170]])


def test_core_l1_huge_rows_at_bound():
    out, was = clip_l1(np.array([[1e308, 1e308], [MAX, -MAX], [0.5, 0.25]]), 2.0)
    np.testing.assert_allclose(np.abs(out[:2]).sum(axis=1), 2.0, rtol=RTOL)
    assert was.tolist() == [True, True, False]
    assert np.array_equal(out[2], [0.5, 0.25])


def test_l2_norms_no_intermediate_overflow():
    n = l2_norms(np.array([[1e300, 1e300], [3.0, 4.0], [MAX, MAX]]))
    assert n[0] == pytest.approx(np.sqrt(2) * 1e300, rel=RTOL) and n[1] == 5.0 and n[2] == np.inf


def test_values_inside_range_unchanged_bit_for_bit():
    """Rows well inside the float range take the direct formula x·R/‖x‖, exactly as computed directly."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(200, 5)) * rng.choice([0.1, 10.0], size=(200, 1))
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    expected = rows * np.where(norms > 1.0, 1.0 / np.where(norms > 1.0, norms, 1.0), 1.0)[:, None]
    assert np.array_equal(clip_l2(rows, 1.0)[0], expected)


def test_sum_mechanisms_clip_paths():
    R = 1.5
    mech = make_tree_sum(horizon=8, dim=2, epsilon=1.0, clip_bound=R)
    rows = np.vstack([HUGE_ROWS, SMALL])
    clipped, was = mech.clip_rows(rows)
    _assert_at_bound(clipped[: len(HUGE_ROWS)], R)
    assert np.array_equal(clipped[len(HUGE_ROWS):], SMALL) and was.sum() == len(HUGE_ROWS)
    one = mech.clip_and_sum(HUGE_ROWS[:1])
    assert l2_norms(one.vector)[0] == pytest.approx(R, rel=RTOL) and one.clipped == 1
    sums, counts, n_clipped = mech.clip_and_sum_groups(HUGE_ROWS[[0, 2]], np.array([0, 1]), 2)
    _assert_at_bound(sums, R)
    assert counts.tolist() == [1, 1] and n_clipped.tolist() == [1, 1]


def test_erm_feature_rows():
    model = SoftmaxRegression(n_features=2, clip_bound=0.7, n_classes=2)
    X = model.augment(np.vstack([HUGE_ROWS, SMALL]))
    _assert_at_bound(X[: len(HUGE_ROWS), :2], 0.7)
    assert np.array_equal(X[len(HUGE_ROWS):, :2], SMALL) and np.all(X[:, 2] == 1.0)


def test_regression_records():
    X, y, nx, ny = normalise_records(np.vstack([HUGE_ROWS, SMALL]), np.zeros(len(HUGE_ROWS) + 2))
    _assert_at_bound(X[: len(HUGE_ROWS)], 1.0)
    assert np.array_equal(X[len(HUGE_ROWS):], SMALL) and nx == len(HUGE_ROWS) and ny == 0


def test_online_learner_features_and_gradients(monkeypatch):
    learner = make_online_learner("cocop", dim=2, constraint={"kind": "l2_ball", "radius": 1.0}, loss="logistic",
                                  epsilon=1.0, window=4)
    A, _ = learner.records(np.vstack([HUGE_ROWS, SMALL]), np.ones(len(HUGE_ROWS) + 2), len(HUGE_ROWS) + 2)
    _assert_at_bound(A[: len(HUGE_ROWS)], 1.0)
    assert np.array_equal(A[len(HUGE_ROWS):], SMALL)
    # the gradient clip to L: a loss whose gradient is huge but finite still feeds norm L to the tree
    seen = {}
    original = learner.tree.step_group

    def spy(tree_group, v, counts, noise):
        seen["v"] = v.copy()
        return original(tree_group, v, counts, noise)

    monkeypatch.setattr(learner.tree, "step_group", spy)
    monkeypatch.setattr(learner.loss.__class__, "grad_rows", lambda self, X, A, b: np.tile(HUGE_ROWS[0], (len(A), 1)))
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    group = learner.stack([learner.init_state("a"), learner.init_state("b")])
    learner.step_group(group, A[:2], np.ones(2), NoiseSource(TEST_KEY))
    _assert_at_bound(seen["v"], learner.lipschitz)


def test_lifelong_per_example_clipping(monkeypatch):
    torch = pytest.importorskip("torch", reason="lifelong learners need torch")
    from beam_dp.core import NoiseSource
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig
    from tests.conftest import TEST_KEY
    from tests.mechanisms.lifelong.conftest import small_common

    learner = build_learner(BoundedAGEMConfig(**small_common(), task_size=480, clip_norm=0.5))
    state = learner._initialise(learner.init_state("s"), NoiseSource(TEST_KEY))
    params, _ = learner._torch_state(state)
    pieces = [torch.tensor([[1e308, 0.5], [1e200, 0.0], [-MAX, 0.0], [0.1, 0.2]], dtype=torch.float64),
              torch.tensor([[0.0], [1e200], [0.0], [0.2]], dtype=torch.float64)]
    monkeypatch.setattr(learner, "_pieces", lambda w, xb, yb: pieces)
    out = learner.clipped_per_example_gradients(params, torch.zeros((4, 64)), torch.zeros(4)).numpy()
    _assert_at_bound(out[:3], 0.5)
    assert out[0, 1] > 0  # the finite small coordinate is kept, not zeroed
    assert np.array_equal(out[3], [0.1, 0.2, 0.2])  # norm 0.3 <= C: unchanged
