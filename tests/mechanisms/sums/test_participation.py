"""Unit-level sensitivity of every counter against a brute force over participation patterns (small n).

The brute force is independent of ``participation.py``: it reads the noised nodes (steps covered, noise
law) from each mechanism's own bookkeeping (``nodes_noised_at``/``node_steps``/``node_law``, the window
tree's ``nodes_completing``) or the explicit matrix ``C`` from ``c_coeffs``, enumerates every pattern of at
most ``k`` steps at least ``b`` apart, and takes the worst value over the worst single step.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from beam_dp.mechanisms.sums import participation
from beam_dp.mechanisms.sums.blt import BLTSum
from beam_dp.mechanisms.sums.blt_math import BLT
from beam_dp.mechanisms.sums.honaker import HonakerTreeSum
from beam_dp.mechanisms.sums.participation import (
    Participation,
    blt_multiplier,
    toeplitz_multiplier,
    unit_sensitivity,
)
from beam_dp.mechanisms.sums.pure import KaryTreeSum
from beam_dp.mechanisms.sums.snapping import SnappedSum
from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtSum
from beam_dp.mechanisms.sums.tree import BinaryTreeSum, DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

BASE = dict(dim=1, epsilon=1.0, clip_bound=1.0)
GAUSS = dict(noise="gaussian", delta=1e-6)
CASES = [(k, b) for k in (1, 2, 3, 4) for b in (1, 2, 3)]
RTOL = 1e-9  # float rounding of sums of at most a few hundred terms


def patterns(n: int, k: int, b: int, first: int = 0) -> np.ndarray:
    """Indicator rows of every pattern of 1..k steps in [first, n) with gaps >= b."""
    rows = []
    for size in range(1, k + 1):
        for combo in itertools.combinations(range(first, n), size):
            if all(y - x >= b for x, y in zip(combo, combo[1:])):
                row = np.zeros(n)
                row[list(combo)] = 1.0
                rows.append(row)
    return np.array(rows)


def brute_nodes(incidence: np.ndarray, weights: np.ndarray, n: int, k: int, b: int, pure: bool,
                window: tuple[int, int] | None = None) -> float:
    """Worst pattern over worst single step of ``Σ_v w_v cnt_v^p`` (pure p = 1, Gaussian p = 2, multiplier
    returned as its root); ``window = (B, W)``: patterns inside ``B`` consecutive steps with at most ``k``
    in any ``W`` consecutive ones."""
    if window is None:
        ind = patterns(n, k, b)
    else:
        block, w = window
        ind = patterns(n, k * -(-block // w), b)
        steps = [np.flatnonzero(row) for row in ind]
        ind = ind[[s[-1] - s[0] < block and all(np.sum((s >= x) & (s < x + w)) <= k for x in s) for s in steps]]
    counts = ind @ incidence.T
    values = (counts if pure else counts**2) @ weights
    singles = (incidence if pure else incidence**2).T @ weights
    ratio = values.max() / singles.max()
    return ratio if pure else math.sqrt(ratio)


def brute_matrix(c: np.ndarray, n: int, k: int, b: int, rows: int | None = None) -> float:
    """Worst ``‖Σ_{i∈P} C[:, i]‖`` over the worst column, ``C`` Toeplitz of ``rows`` rows, steps < n."""
    rows = rows or n
    mat = np.zeros((rows, n))
    for i in range(n):
        mat[i:, i] = c[: rows - i]
    sums = patterns(n, k, b) @ mat.T
    return math.sqrt(np.max(np.sum(sums**2, axis=1)) / np.max(np.sum(mat**2, axis=0)))


def tree_incidence(mech, n: int, noised_at, part=None) -> tuple[np.ndarray, np.ndarray]:
    """(incidence nodes × steps, weights) of the nodes noised at steps 1..n, from the mechanism."""
    nodes = [node for t in range(1, n + 1) for node in noised_at(t)]
    if part is not None:
        nodes = [node for node in nodes if part(node)]
    inc = np.zeros((len(nodes), n))
    weights = np.zeros(len(nodes))
    for row, node in enumerate(nodes):
        first, last = mech.node_steps(*node) if isinstance(mech, HonakerTreeSum) else mech.node_steps(node)
        inc[row, first - 1:last] = 1.0
        law = mech.level_noise[node[0]] if isinstance(mech, HonakerTreeSum) else (
            mech.node_noise if isinstance(mech, WindowTreeSum) else mech.node_law(node))
        weights[row] = 1.0 / law.scale if law.law != "gaussian" else 1.0 / law.scale**2
    return inc, weights


def check(computed, brute: float) -> None:
    """The computed multiplier is never below the brute force, and equals it where claimed exact."""
    assert computed.multiplier >= brute * (1 - RTOL), (computed, brute)
    if computed.exact:
        assert computed.multiplier == pytest.approx(brute, rel=RTOL), (computed, brute)


# -- participation --------------------------------------------------------------------------------
def test_participation_validated_and_refused_forever():
    with pytest.raises(ValueError, match="max_steps"):
        Participation(0)
    with pytest.raises(ValueError, match="min_separation"):
        Participation(2, 0)
    with pytest.raises(ValueError, match="forever"):
        Participation(None).steps_within(None)
    assert Participation(None, 3).steps_within(10) == 4  # steps 1, 4, 7, 10
    assert Participation(2, 3).steps_within(10) == 2
    mech = HonakerTreeSum(**BASE, arity=2, levels=3)
    with pytest.raises(ValueError, match="forever"):
        unit_sensitivity(mech, Participation(None))
    assert unit_sensitivity(mech, Participation(None), horizon=8).steps == 8  # a public horizon bounds it


# -- factorizations -------------------------------------------------------------------------------
@pytest.mark.parametrize("k,b", CASES)
@pytest.mark.parametrize("kind", ["toeplitz_sqrt", "blt"])
def test_factorization_exact_against_brute_force(kind, k, b):
    n = 11
    mech = (ToeplitzSqrtSum if kind == "toeplitz_sqrt" else BLTSum)(horizon=n, **BASE, **GAUSS)
    got = unit_sensitivity(mech, Participation(k, b))
    assert got.exact
    check(got, brute_matrix(mech.c_coeffs(n), n, k, b))
    if k == 1:
        assert got.multiplier == 1.0
        # today's sensitivity: the calibrated column norm
        assert math.sqrt(mech.col_norm_sq(n)) == pytest.approx(mech.max_col_norm, rel=1e-12)


@pytest.mark.parametrize("k,b", CASES)
def test_blt_unbounded_closed_form_against_brute_force(k, b):
    blt = BLT((0.6, 0.25), (0.5, 0.8))  # c_1 = 1.3 > c_0: the worst pattern still starts first
    got = blt_multiplier(blt, Participation(k, b), None)
    assert got.exact
    # columns over "all" steps: 400 rows carry every coefficient above 1e-80
    check(got, brute_matrix(blt.c_coeffs(400), 10, k, b, rows=400))
    finite = blt_multiplier(blt, Participation(k, b), 5000)
    assert finite.multiplier == pytest.approx(got.multiplier, rel=1e-12)


def test_toeplitz_refuses_increasing_coefficients_and_runs_at_a_million_steps():
    with pytest.raises(ValueError, match="non-increasing"):
        toeplitz_multiplier([1.0, 0.2, 0.5], Participation(2))
    mech = BLTSum(horizon=10**6, **BASE, **GAUSS)
    got = unit_sensitivity(mech, Participation(1000, 7))
    c = mech.c_coeffs(10**6)
    # the earliest pattern's column sum, by shifted slices (no window trick)
    u = np.zeros(10**6)
    for a in range(1000):
        u[a * 7:] += c[: 10**6 - a * 7]
    assert got.multiplier == pytest.approx(math.sqrt(np.sum(u**2) / np.sum(c**2)), rel=1e-10)
    assert 1.0 < got.multiplier < 1000.0


# -- trees ------------------------------------------------------------------------------------------
TREES = ["binary", "binary12", "honaker", "honaker_gap", "doubling", "hybrid"]


def _make(name: str, law: dict):
    if name == "binary":
        return BinaryTreeSum(horizon=11, **BASE, **law)
    if name == "binary12":
        return BinaryTreeSum(horizon=12, **BASE, **law, calibration="analytic" if law else "paper")
    if name == "honaker":
        return HonakerTreeSum(**BASE, **law, arity=3, levels=3, level_weights=[0.5, 0.2, 0.3])
    if name == "honaker_gap":
        return HonakerTreeSum(**BASE, **law, arity=2, levels=4, level_weights=[1, 0, 2, 1])
    if name == "doubling":
        return DoublingTreeSum(**BASE, **law)
    return HybridTreeSum(**BASE, **law)


def _brute_tree(mech, n: int, k: int, b: int, pure: bool) -> float:
    if isinstance(mech, HybridTreeSum):  # two parts certified apart: the larger multiplier
        return max(brute_nodes(*tree_incidence(mech, n, mech.nodes_noised_at, part), n, k, b, pure)
                   for part in (lambda v: v[0] == "L", lambda v: v[0] != "L"))
    return brute_nodes(*tree_incidence(mech, n, mech.nodes_noised_at), n, k, b, pure)


@pytest.mark.parametrize("k,b", CASES)
@pytest.mark.parametrize("law", ["pure", "gaussian"])
@pytest.mark.parametrize("name", TREES)
def test_tree_bound_against_brute_force(name, law, k, b):
    mech = _make(name, GAUSS if law == "gaussian" else {})
    n = getattr(mech, "horizon", None) or 12
    if isinstance(mech, HonakerTreeSum):
        n = 12
    got = unit_sensitivity(mech, Participation(k, b), horizon=n)
    check(got, _brute_tree(mech, n, k, b, law == "pure"))
    if k == 1:
        assert got.multiplier == 1.0 and got.exact
        if isinstance(mech, BinaryTreeSum):  # today's calibration: L_T nodes of one law
            inc, weights = tree_incidence(mech, n, mech.nodes_noised_at)
            assert np.max(inc.T @ weights) == pytest.approx(mech.levels * weights[0], rel=1e-12)


@pytest.mark.parametrize("route", ["layers", "top_k"])
@pytest.mark.parametrize("k,b", CASES)
@pytest.mark.parametrize("law", ["pure", "gaussian"])
@pytest.mark.parametrize("name", TREES)
def test_long_horizon_routes_against_brute_force(monkeypatch, route, name, law, k, b):
    """The routes of long horizons, forced on short ones: the per-tree/per-level bounds alone (beyond
    ``_ARRAY_STEPS``), and the top k ignoring the separation (beyond ``_DP_CELLS``)."""
    monkeypatch.setattr(participation, "_ARRAY_STEPS" if route == "layers" else "_DP_CELLS", 0)
    mech = _make(name, GAUSS if law == "gaussian" else {})
    n = 12 if isinstance(mech, HonakerTreeSum) else (getattr(mech, "horizon", None) or 12)
    got = unit_sensitivity(mech, Participation(k, b), horizon=n)
    check(got, _brute_tree(mech, n, k, b, law == "pure"))
    assert got.multiplier <= k


def _claimed_exact(name: str, pure: bool, k: int, b: int) -> bool:
    """Where the docstring of ``tree_multiplier`` claims the bound is the maximum (small horizons)."""
    if pure or k == 1:
        return True
    if name.startswith("honaker"):
        return b in (1, 2) if name == "honaker_gap" else b in (1, 3)  # b divides the node sizes
    return name.startswith("binary") and b == 1 and k in (1, 2, 4)


@pytest.mark.parametrize("k,b", CASES)
@pytest.mark.parametrize("law", ["pure", "gaussian"])
@pytest.mark.parametrize("name", TREES)
def test_tree_exact_where_claimed(name, law, k, b):
    mech = _make(name, GAUSS if law == "gaussian" else {})
    n = 12 if isinstance(mech, HonakerTreeSum) else (getattr(mech, "horizon", None) or 12)
    got = unit_sensitivity(mech, Participation(k, b), horizon=n)
    if _claimed_exact(name, law == "pure", k, b):
        assert got.exact
        assert got.multiplier == pytest.approx(_brute_tree(mech, n, k, b, law == "pure"), rel=RTOL)


@pytest.mark.parametrize("k,b", CASES)
@pytest.mark.parametrize("law", ["pure", "gaussian"])
@pytest.mark.parametrize("window", [4, 6])
def test_window_tree_against_brute_force(window, law, k, b):
    mech = WindowTreeSum(**BASE, **(GAUSS if law == "gaussian" else {}), window=window)
    n = 2 * mech.block
    inc, weights = tree_incidence(mech, n, mech.nodes_completing)
    brute = brute_nodes(inc, weights, n, k, b, law == "pure", window=(mech.block, window))
    got = unit_sensitivity(mech, Participation(k, b))
    check(got, brute)
    if window == mech.block and (law == "pure" or b == 1 or k == 1):
        assert got.exact
    if window < mech.block:  # k per W-window: up to k·⌈B/W⌉ steps in the B protected ones
        assert not got.exact or k >= -(-window // b)
    elif k == 1:  # today's joint sensitivity: L_W nodes
        assert got.multiplier == 1.0
        assert mech.joint_nodes == len(mech.nodes_containing(1))


def test_kary_tree_is_forever_and_snapped_sum_dispatches_to_its_counter():
    mech = KaryTreeSum(horizon=64, **BASE)
    got = unit_sensitivity(mech, Participation(5, 2))
    assert got.exact and got.multiplier == pytest.approx(5.0)  # pure ε, every step in every level: group privacy
    snapped = SnappedSum(lambda r: BLTSum(horizon=50, dim=1, epsilon=1.0, clip_bound=r, **GAUSS),
                         clip_bound=1.0, granularity=2.0**-20)
    assert unit_sensitivity(snapped, Participation(3)) == unit_sensitivity(snapped.inner, Participation(3))
    with pytest.raises(TypeError, match="no unit-level"):
        unit_sensitivity(object(), Participation(1))


def test_forever_trees_are_bounded_and_fast():
    for mech in (DoublingTreeSum(**BASE, **GAUSS, calibration="analytic"), HybridTreeSum(**BASE, **GAUSS),
                 HonakerTreeSum(**BASE, **GAUSS, arity=4, levels=8)):
        got = unit_sensitivity(mech, Participation(16, 2))
        assert 1.0 < got.multiplier <= 16.0  # never above group privacy
    pure = unit_sensitivity(DoublingTreeSum(**BASE), Participation(16, 2))
    assert pure.exact and pure.multiplier == pytest.approx(16.0)  # 16 block starts, each in all its nodes


def test_event_level_value_fails_the_check():
    """The single-participation multiplier (today's event-level calibration) is refused by the check."""
    mech = BinaryTreeSum(horizon=12, **BASE, **GAUSS, calibration="analytic")
    brute = _brute_tree(mech, 12, 3, 2, pure=False)
    assert brute > 1.5
    wrong = type(unit_sensitivity(mech, Participation(1)))(1.0, True, 3)
    with pytest.raises(AssertionError):
        check(wrong, brute)
