"""Clipping before state (beam_dp/core/clipping.py).

Floating point: scaling x by R/‖x‖ gives a vector whose recomputed norm is R up to a few ulps (it can
exceed R by ~2e-16 relative), so "exactly R" is checked to 1e-12 relative.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core.clipping import clip_box, clip_l1, clip_l2

RTOL = 1e-12


def test_l2_norm_10R_scaled_to_R():
    rng = np.random.default_rng(0)
    for R in (1e-3, 0.5, 1.0, 7.0, 1e4):
        for d in (1, 2, 5, 100):
            v = rng.normal(size=d)
            v *= 10 * R / np.linalg.norm(v)
            out, was = clip_l2(v, R)
            assert out.shape == (d,)
            assert np.linalg.norm(out) == pytest.approx(R, rel=RTOL)
            assert was.tolist() == [True]
            # Direction preserved: out is a positive multiple (0.1) of v.
            np.testing.assert_allclose(out, v / 10, rtol=1e-12, atol=0)


def test_l2_block_rows_mixed():
    rng = np.random.default_rng(1)
    R = 2.0
    rows = rng.normal(size=(50, 4))
    norms = np.linalg.norm(rows, axis=1)
    target = np.where(np.arange(50) % 2 == 0, 0.5 * R, 10 * R)  # even rows inside, odd rows 10R
    rows = rows / norms[:, None] * target[:, None]
    rows[10] = rows[10] / np.linalg.norm(rows[10]) * R  # exactly at the bound (to rounding): not scaled
    rows[12] = 0.0  # zero row
    original = rows.copy()
    out, was = clip_l2(rows, R)
    assert np.array_equal(rows, original)  # input not modified
    assert out.shape == rows.shape and was.shape == (50,) and was.dtype == bool
    out_norms = np.linalg.norm(out, axis=1)
    inside = np.linalg.norm(original, axis=1) <= R
    assert np.array_equal(was, ~inside)
    assert np.array_equal(out[inside], original[inside])  # within-bound rows untouched (bit for bit)
    np.testing.assert_allclose(out_norms[~inside], R, rtol=RTOL)
    assert np.all(out_norms <= R * (1 + RTOL))
    assert np.array_equal(out[12], np.zeros(4))


def test_l2_within_bound_vector_untouched():
    v = np.array([0.3, -0.4])
    out, was = clip_l2(v, 1.0)
    assert np.array_equal(out, v) and was.tolist() == [False]
    out, was = clip_l2([1, 2, 2], 3.0)  # lists and ints accepted, result float64
    assert out.dtype == np.float64 and np.array_equal(out, [1.0, 2.0, 2.0]) and not was[0]


def test_l1_clipping():
    R = 1.5
    v = np.array([3.0, -6.0, 6.0])  # L1 norm 15 = 10R
    out, was = clip_l1(v, R)
    assert np.abs(out).sum() == pytest.approx(R, rel=RTOL)
    np.testing.assert_allclose(out, v / 10, rtol=1e-15)
    assert was.tolist() == [True]
    rows = np.array([[0.5, -0.5, 0.5], [10.0, 0.0, -5.0], [0.0, 0.0, 0.0]])
    out, was = clip_l1(rows, R)
    assert was.tolist() == [False, True, False]
    assert np.array_equal(out[0], rows[0]) and np.array_equal(out[2], rows[2])
    assert np.abs(out[1]).sum() == pytest.approx(R, rel=RTOL)
    # L1, not L2: a vector with L2 norm < R but L1 norm > R is clipped.
    w = np.array([1.0, 1.0])  # L2 = 1.414 < 1.5, L1 = 2 > 1.5
    assert clip_l1(w, R)[1][0] and not clip_l2(w, R)[1][0]


def test_box_clipping():
    rows = np.array([[0.0, 5.0, -5.0], [0.5, -0.5, 0.9], [-2.0, 0.0, 1.0]])
    out, was = clip_box(rows, -1.0, 1.0)
    assert np.array_equal(out, [[0.0, 1.0, -1.0], [0.5, -0.5, 0.9], [-1.0, 0.0, 1.0]])
    assert was.tolist() == [True, False, True]
    # Per-coordinate bounds.
    lo, hi = np.array([0.0, -1.0, -3.0]), np.array([0.0, 2.0, 3.0])
    out, was = clip_box(rows, lo, hi)
    assert np.array_equal(out, [[0.0, 2.0, -3.0], [0.0, -0.5, 0.9], [0.0, 0.0, 1.0]])
    assert was.tolist() == [True, True, True]
    out, was = clip_box(np.array([0.2, 3.0]), 0.0, 1.0)
    assert np.array_equal(out, [0.2, 1.0]) and was.tolist() == [True]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fn", [lambda v: clip_l2(v, 1.0), lambda v: clip_l1(v, 1.0), lambda v: clip_box(v, -1, 1)])
def test_non_finite_input_refused(fn, bad):
    with pytest.raises(ValueError):
        fn(np.array([0.0, bad, 1.0]))
    with pytest.raises(ValueError):
        fn(np.array([[0.0, 1.0], [bad, 0.0]]))


@pytest.mark.parametrize("fn", [clip_l2, clip_l1])
@pytest.mark.parametrize("bound", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_bad_norm_bound_refused(fn, bound):
    with pytest.raises(ValueError):
        fn(np.ones(3), bound)


@pytest.mark.parametrize(
    "lo,hi", [(1.0, -1.0), (math.nan, 1.0), (-1.0, math.inf), (-math.inf, 0.0), (np.array([0.0, 2.0]), np.array([1.0, 1.0]))]
)
def test_bad_box_bounds_refused(lo, hi):
    with pytest.raises(ValueError):
        clip_box(np.ones(2), lo, hi)


@pytest.mark.parametrize("fn", [lambda v: clip_l2(v, 1.0), lambda v: clip_l1(v, 1.0), lambda v: clip_box(v, -1, 1)])
def test_bad_shapes_refused(fn):
    with pytest.raises(ValueError):
        fn(np.ones((2, 2, 2)))
    with pytest.raises(ValueError):
        fn(np.float64(3.0))


def test_empty_block():
    out, was = clip_l2(np.zeros((0, 3)), 1.0)
    assert out.shape == (0, 3) and was.shape == (0,)


@pytest.mark.parametrize("scale", [10.0, 1e6, 1e150, 1e200])  # 1e200: ‖x‖² overflows
def test_neighbouring_streams_clipped_sums_differ_by_at_most_2R(scale):
    # §8.16 /: replace one contribution by a huge one; after clipping, the step sums (and so
    # every clean node value containing that step) move by at most Δ₂ = 2R in L2.
    rng = np.random.default_rng(3)
    R, d = 0.75, 6
    block = rng.normal(size=(40, d))
    neighbour = block.copy()
    huge = rng.normal(size=d)
    neighbour[17] = huge / np.linalg.norm(huge) * scale * R
    a = clip_l2(block, R)[0].sum(axis=0)
    b = clip_l2(neighbour, R)[0].sum(axis=0)
    assert np.linalg.norm(a - b) <= 2 * R * (1 + RTOL)
    # Worst case: the replaced contribution points the opposite way, the gap approaches 2R.
    opposite = block.copy()
    opposite[17] = -neighbour[17]
    c = clip_l2(opposite, R)[0].sum(axis=0)
    assert np.linalg.norm(b - c) <= 2 * R * (1 + RTOL)
    if scale < 1e100:  # at 1e200 the squared norm overflows and the row is clipped to 0 (safe, direction lost)
        assert np.linalg.norm(b - c) == pytest.approx(2 * R, rel=RTOL)
    # L1 clipping gives the same bound in L1.
    a1 = clip_l1(block, R)[0].sum(axis=0)
    b1 = clip_l1(neighbour, R)[0].sum(axis=0)
    assert np.abs(a1 - b1).sum() <= 2 * R * (1 + RTOL)
