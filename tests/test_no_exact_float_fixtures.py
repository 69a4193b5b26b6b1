"""No test compares a computed release's floats with a recorded or independently computed one exactly.

Twice the suite went red on another CPU because a float's last bit differed (a YAML ``tests:`` block,
then ``dict(row.meta) == exp["meta"]`` in the regression fixtures). Comparisons go through
``tests/release_checks.py`` (floats within a tolerance, the rest exactly); this module scans the suite
for the patterns that caused it and checks the helper itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.release_checks import assert_close_values, assert_release_matches

TESTS = Path(__file__).resolve().parent
TEMPLATES = TESTS.parent / "templates" / "yaml"

#: Fields of a release (attribute or row key) that hold computed floats.
FLOAT_FIELDS = {"value", "values", "meta", "epsilon_spent", "delta_spent", "theta", "x", "job_epsilon_spent",
                "job_delta_spent"}
#: Names the suite gives recorded fixtures and their entries.
FIXTURE_NAMES = {"exp", "expected", "FIXTURE", "fixture", "case", "recorded"}


def _mentions_float_field(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in FLOAT_FIELDS:
            return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and sub.slice.value in FLOAT_FIELDS:
            return True
    return False


def _mentions_fixture(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id in FIXTURE_NAMES for sub in ast.walk(node))


def _is_meta_dict(node: ast.AST) -> bool:
    """``dict(<x>.meta)`` anywhere in ``node``: a whole meta, floats included."""
    return any(isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "dict"
               and len(sub.args) == 1 and isinstance(sub.args[0], ast.Attribute) and sub.args[0].attr == "meta"
               for sub in ast.walk(node))


def _is_approx(node: ast.AST) -> bool:
    """``pytest.approx(...)``: a comparison with a tolerance."""
    return isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and (
        getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "approx"


def exact_float_comparisons(source: str) -> list[int]:
    """Lines of ``assert`` statements that compare with ``==``/``!=`` a release's float fields with a
    recorded fixture, or a whole ``dict(x.meta)`` with anything."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            for op, left, right in zip(cmp.ops, sides, sides[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq)) or _is_approx(left) or _is_approx(right):
                    continue
                fixture_vs_release = any(_mentions_fixture(a) and _mentions_float_field(b) and not _mentions_fixture(b)
                                         for a, b in ((left, right), (right, left)))
                if fixture_vs_release or _is_meta_dict(left) or _is_meta_dict(right):
                    found.append(node.lineno)
    return sorted(set(found))


def test_the_suite_compares_no_release_floats_exactly():
    offenders = {str(path.relative_to(TESTS)): lines
                 for path in sorted(TESTS.rglob("*.py")) if path != Path(__file__)
                 for lines in [exact_float_comparisons(path.read_text())] if lines}
    assert offenders == {}, ("exact == between a release's floats and a fixture (use "
                             f"tests/release_checks.assert_release_matches): {offenders}")


@pytest.mark.parametrize("snippet", [
    'assert dict(row.meta) == exp["meta"] and "lift_fallback" in row.meta',  # regression_groups:218
    'assert (release.step, release.epsilon_spent, release.delta_spent, dict(release.meta)) == (\n'
    '    exp["step"], exp["epsilon_spent"], exp["delta_spent"], exp["meta"])',  # regression_groups:180
    'assert (release.epsilon_spent, release.delta_spent) == (expected["epsilon_spent"], expected["delta_spent"])',
    'assert row.meta != case["releases"][0]["meta"]',
    'assert (row.stream, dict(row.meta)) == (single.stream, dict(single.meta))',
])
def test_the_scan_finds_the_patterns_that_went_red(snippet):
    assert exact_float_comparisons(snippet) == [1]


@pytest.mark.parametrize("snippet", [
    'assert_release_matches(row, recorded(exp))',
    'assert (state.stream, state.t) == ("fixture", k)',
    'assert [r.step for r in out] == ([t + 1] if t + 1 in by_step else [])',
    'assert row.meta["noise"] == "gamma"',
    'assert release.meta["noise_scale"] == pytest.approx(expected, rel=1e-6)',
])
def test_the_scan_leaves_exact_comparisons_of_exact_values(snippet):
    assert exact_float_comparisons(snippet) == []


def _floats(node) -> list[float]:
    if isinstance(node, dict):
        return [f for v in node.values() for f in _floats(v)]
    if isinstance(node, list):
        return [f for v in node for f in _floats(v)]
    return [node] if isinstance(node, float) else []


@pytest.mark.parametrize("template", sorted(p.stem for p in TEMPLATES.glob("*.yaml") if p.stem != "providers"))
def test_yaml_tests_blocks_expect_only_floats_echoed_from_their_inputs(template):
    """Beam YAML compares a ``tests:`` block exactly: the only floats it may expect are the mocked
    inputs echoed back (dead letters), never a computed release (compared with tolerance in
    tests/templates/test_yaml_templates.py)."""
    text = (TEMPLATES / f"{template}.yaml").read_text()
    spec = yaml.safe_load(text[text.index("\ntests:"):]) if "\ntests:" in text else {"tests": []}
    for test in spec["tests"]:
        echoed = set(_floats(test.get("mock_outputs", [])))
        for expected in test.get("expected_inputs", []):
            assert "Release" not in expected["name"], f"{template}: {expected['name']} expects computed releases"
            assert set(_floats(expected)) <= echoed, f"{template}: {expected['name']} expects computed floats"


def test_the_helper_takes_a_last_bit_and_nothing_more():
    recorded = {"step": 3, "value": {"theta": [0.25, -1.5]}, "epsilon_spent": 3.0956205732127273,
                "meta": {"alpha_t": 365.1419308808629, "L_t": 5.213314229763015, "r_t": 2, "r_capped": False,
                         "noise": "gaussian"}}
    today = {"step": 3, "value": {"theta": np.array([0.25, -1.5])}, "epsilon_spent": 3.0956205732127273,
             "meta": {"alpha_t": 365.1419308808628, "L_t": 5.213314229763014, "r_t": 2, "r_capped": False,
                      "noise": "gaussian"}}
    assert_release_matches(today, recorded)  # the AMD machine's last bits (issue 28)
    for field, wrong in [("step", 4), ("epsilon_spent", 3.0956205732127273 * (1 + 1e-9))]:
        with pytest.raises(AssertionError):
            assert_release_matches({**today, field: wrong}, recorded)
    for key, wrong in [("alpha_t", 365.1419308808628 * (1 + 1e-9)), ("r_t", 3), ("r_capped", 0), ("noise", "gamma")]:
        with pytest.raises(AssertionError):
            assert_release_matches({**today, "meta": {**today["meta"], key: wrong}}, recorded)
    with pytest.raises(AssertionError):  # a missing meta key
        assert_release_matches({**today, "meta": {k: v for k, v in today["meta"].items() if k != "r_t"}}, recorded)
    with pytest.raises(AssertionError):  # a wrong value
        assert_release_matches({**today, "value": {"theta": [0.25, -1.5 + 1e-9]}}, recorded)
    with pytest.raises(AssertionError):  # a release without a recorded field
        assert_release_matches({k: v for k, v in today.items() if k != "meta"}, recorded)
    assert_close_values([1, "a", None, [2.0, 3]], [1, "a", None, [2.0, 3.0]])
