"""Projections, local linear oracles and constraint specs (checks 7 and bad input)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import linprog, minimize

from beam_dp.mechanisms.online.convex_sets import (
    Box,
    L1Ball,
    L2Ball,
    Polytope,
    Simplex,
    gaussian_width_unit_l2,
    make_convex_set,
)


def _vertices(C):
    d = C.dim
    if isinstance(C, Simplex):
        return C.R * np.eye(d)
    if isinstance(C, L1Ball):
        return C.R * np.vstack([np.eye(d), -np.eye(d)])
    return C.vertices


@pytest.mark.parametrize("C", [Simplex(4), Simplex(6, 2.0), L1Ball(5, 1.5), Polytope(np.random.default_rng(3).normal(size=(7, 3)))])
def test_projection_satisfies_the_variational_inequality(C):
    # p = Π_C(x) iff p ∈ C and <x − p, v − p> <= 0 for every vertex v (the condition is linear in v)
    rng = np.random.default_rng(0)
    V = _vertices(C)
    for _ in range(200):
        x = rng.normal(scale=2.0, size=C.dim)
        p = C.project(x)
        assert C.contains(p, 1e-9)
        assert np.max((V - p) @ (x - p)) <= 1e-8 * (1 + np.linalg.norm(x))


def test_projection_matches_an_independent_solver():
    rng = np.random.default_rng(1)
    for C in (Simplex(5), L1Ball(5, 0.7), L2Ball(5, 0.5), Box([-1, 0, 0.5, -2, 0], [1, 0.2, 0.6, 2, 3])):
        for _ in range(10):
            x = rng.normal(scale=2.0, size=5)
            cons = {
                "simplex": [{"type": "eq", "fun": lambda y: y.sum() - 1.0}],
                "l2_ball": [{"type": "ineq", "fun": lambda y: 0.25 - y @ y}],
            }.get(C.kind, [])
            bounds = None
            if C.kind == "simplex":
                bounds = [(0, None)] * 5
            if C.kind == "box":
                bounds = list(zip(C.lower, C.upper))
            if C.kind == "l1_ball":  # split y = u − w, u, w >= 0
                res = minimize(lambda z: np.sum((z[:5] - z[5:] - x) ** 2), np.zeros(10), method="SLSQP",
                               bounds=[(0, None)] * 10, constraints=[{"type": "ineq", "fun": lambda z: 0.7 - z.sum()}],
                               options={"ftol": 1e-14, "maxiter": 500})
                ref = res.x[:5] - res.x[5:]
            else:
                res = minimize(lambda y: np.sum((y - x) ** 2), C.project(np.zeros(5)), method="SLSQP", bounds=bounds,
                               constraints=cons, options={"ftol": 1e-14, "maxiter": 500})
                ref = res.x
            np.testing.assert_allclose(C.project(x), ref, atol=1e-5)


def _relaxation_value(C, x, r, c):
    """The LP value over the relaxation each oracle is exact on, by linprog."""
    d = C.dim
    if isinstance(C, Box):
        lo = np.maximum(C.lower, x - r)
        hi = np.minimum(C.upper, x + r)
        return linprog(c, bounds=list(zip(lo, hi)), method="highs").fun
    if isinstance(C, Simplex):
        base, cost, mass, n, scale = x, c, min(math.sqrt(d) * r / 2, C.R), d, C.R
    else:
        R = C.R
        z = np.concatenate([np.maximum(x, 0), np.maximum(-x, 0), [0.0]]) / R
        z[-1] = 1 - z[:-1].sum()
        base, cost, mass, n, scale = z, np.concatenate([R * c, -R * c, [0.0]]), min(math.sqrt(d) * r / R, 1.0), 2 * d + 1, 1.0
    # variables (p, s): min cost·p  s.t.  p >= 0, Σp = scale, |p − base| <= s, Σs <= 2·mass
    eye = np.eye(n)
    A_ub = np.block([[eye, -eye], [-eye, -eye], [np.zeros((1, n)), np.ones((1, n))]])
    b_ub = np.concatenate([base, -base, [2 * mass]])
    A_eq = np.concatenate([np.ones((1, n)), np.zeros((1, n))], axis=1)
    res = linprog(np.concatenate([cost, np.zeros(n)]), A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[scale],
                  bounds=[(0, None)] * (2 * n), method="highs")
    return res.fun


def _random_point(C, rng):
    if isinstance(C, Simplex):
        return C.R * rng.dirichlet(np.ones(C.dim))
    if isinstance(C, L1Ball):
        return C.project(rng.normal(size=C.dim)) * rng.uniform(0.3, 1.0)
    return rng.uniform(C.lower, C.upper)


@pytest.mark.parametrize("d", [2, 4, 10])
@pytest.mark.parametrize("kind", ["simplex", "l1_ball", "box"])
def test_llo_properties(kind, d):
    """Check 7: p ∈ P, ‖p − x‖ <= ρr, and ⟨p, c⟩ equals the relaxation's LP value (so it is at most
    the best value over B(x, r) ∩ P, which the relaxation contains)."""
    rng = np.random.default_rng(d)
    C = {"simplex": Simplex(d), "l1_ball": L1Ball(d, 1.3), "box": Box(-np.ones(d), 2 * np.ones(d))}[kind]
    for _ in range(100):  # 3 dims × 100 = 300 cases per set
        x = _random_point(C, rng)
        r = float(rng.choice([1e-3, 0.05, 0.3, 2.0]))
        c = rng.normal(size=d)
        p = C.llo(x, r, c)
        assert C.contains(p, 1e-12)
        assert np.linalg.norm(p - x) <= C.rho * r * (1 + 1e-12)
        assert p @ c == pytest.approx(_relaxation_value(C, x, r, c), abs=1e-9)


def test_llo_beats_the_exact_local_minimiser():
    """Property 1 against the exact minimiser over B(x, r) ∩ P (SLSQP from 5 starts)."""
    rng = np.random.default_rng(5)
    C = Simplex(3)
    for _ in range(10):
        x, r, c = rng.dirichlet(np.ones(3)), 0.2, rng.normal(size=3)
        best = np.inf
        for _ in range(5):
            res = minimize(lambda y: y @ c, rng.dirichlet(np.ones(3)), method="SLSQP", bounds=[(0, None)] * 3,
                           constraints=[{"type": "eq", "fun": lambda y: y.sum() - 1},
                                        {"type": "ineq", "fun": lambda y: r * r - (y - x) @ (y - x)}])
            if res.success:
                best = min(best, res.fun)
        assert C.llo(x, r, c) @ c <= best + 1e-9


def test_polytope_llo_and_projection():
    V = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    P = Polytope(V)
    H = Polytope.from_halfspaces(np.vstack([np.eye(2), -np.eye(2)]), np.array([1.0, 1.0, 0.0, 0.0]))
    box = Box([0, 0], [1, 1])
    rng = np.random.default_rng(2)
    for _ in range(20):
        x, c, r = rng.uniform(0, 1, 2), rng.normal(size=2), 0.3
        for Q in (P, H):
            p = Q.llo(x, r, c)
            assert Q.contains(p, 1e-9) and np.linalg.norm(p - x) <= Q.rho * r * (1 + 1e-9)
            assert p @ c <= box.llo(x, r, c) @ c + 1e-9 or np.linalg.norm(p - x, 1) <= math.sqrt(2) * r + 1e-9
        y = rng.normal(scale=2, size=2)
        np.testing.assert_allclose(P.project(y), box.project(y), atol=1e-8)
    assert H.diameter == pytest.approx(math.sqrt(2))


def test_sizes_and_widths():
    assert L2Ball(3, 2.0).diameter == 4.0 and L2Ball(3, 2.0).radius == 2.0
    assert Simplex(4).diameter == pytest.approx(math.sqrt(2)) and Simplex(4).radius == 1.0
    assert L1Ball(4).rho == pytest.approx(4.0) and Simplex(9).rho == pytest.approx(3.0)
    assert gaussian_width_unit_l2(100) == pytest.approx(math.sqrt(100 - 0.5), rel=1e-3)
    # Monte Carlo widths (fixed public seed) agree with their closed forms / orders
    assert L1Ball(50).gaussian_width() == pytest.approx(math.sqrt(2 * math.log(100)), rel=0.25)
    assert Box(-np.ones(4), np.ones(4)).gaussian_width() == pytest.approx(8 / math.sqrt(2 * math.pi))


@pytest.mark.parametrize(
    "spec",
    [
        "sphere", {"kind": "l0_ball", "k": 2}, {"kind": "union"}, {"radius": 1.0}, 42,
        {"kind": "l2_ball", "radius": 0.0}, {"kind": "l1_ball", "radius": -1.0},
        {"kind": "box", "lower": [1.0, 0.0], "upper": [0.0, 1.0]},
        {"kind": "box", "lower": [0.0, -np.inf], "upper": [1.0, 1.0]},
        {"kind": "polytope", "vertices": np.zeros((0, 2))}, {"kind": "polytope"},
        {"kind": "halfspaces", "A": [[1.0, 0.0], [-1.0, 0.0]], "b": [-1.0, -1.0]},  # empty
        {"kind": "halfspaces", "A": [[1.0, 0.0]], "b": [1.0]},  # unbounded
        {"kind": "simplex", "radius": 1.0, "weird": 1},
    ],
)
def test_empty_or_non_convex_constraint_specs_raise(spec):
    with pytest.raises(ValueError):
        make_convex_set(spec, dim=2)


def test_spec_dimension_mismatch_raises():
    with pytest.raises(ValueError):
        make_convex_set(Simplex(3), dim=2)
    assert make_convex_set({"kind": "box", "lower": 0.0, "upper": 1.0}, dim=3).dim == 3
