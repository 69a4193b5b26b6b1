"""The declared universe: encoding, predicates, query validation."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, IntRange, Universe, check_query

U = Universe([Categorical("c", ("a", "b", "c")), Bucketed("x", (0, 1, 2, 5)), IntRange("k", 4)])


def test_mixed_radix_encoding_roundtrip_and_validity():
    index, valid = U.encode({"c": ["a", "c", "z", "b"], "x": [0.5, 5.0, 1.0, np.nan], "k": [0, 3, 1, 2]})
    assert U.size == 36 and index[:2].tolist() == [0, 35] and valid.tolist() == [True, True, False, False]
    for i in range(U.size):
        assert U.encode_one(U.decode(i)[:1] + (U.decode(i)[1][0], U.decode(i)[2])) == i
    for bad in ({"c": "a", "x": 9.0, "k": 0}, {"c": ["a"], "x": 1.0, "k": 0}, ("a", 1.0), {"c": "a", "x": 1, "k": 4}):
        with pytest.raises(ValueError):
            U.encode_one(bad)


def test_integer_codes_beyond_int64_are_outside_the_universe():
    # a CSV cell "1e30" becomes the integer 10**30: outside the universe, never an OverflowError
    index, reasons = U.encode_records([{"c": "a", "x": 0.5, "k": 10**30}, {"c": "a", "x": 0.5, "k": -(10**30)},
                                       {"c": "b", "x": 0.5, "k": 3}])
    assert reasons.tolist() == ["outside_universe", "outside_universe", ""] and index[2] == U.encode_one(("b", 0.5, 3))
    codes = [field.codes(np.array(column, dtype=object)) for field, column in zip(U.fields, (["a", "b"], [0.5, 3.0],
                                                                                                [1, 2]))]
    np.testing.assert_array_equal(U.combine(codes)[0], U.encode({"c": ["a", "b"], "x": [0.5, 3.0], "k": [1, 2]})[0])


def test_predicates_are_broadcast_masks():
    f = U.predicate({"c": ["a", "c"], "x": (0, 2)}).reshape(3, 3, 4)
    assert f[[0, 2]][:, :2].all() and f.sum() == 2 * 2 * 4
    assert U.predicate({}).sum() == U.size
    with pytest.raises(ValueError):
        U.predicate({"nope": 1})
    assert U.counting_query([1, 5]).sum() == 2
    with pytest.raises(ValueError):
        U.counting_query([36])


def test_large_indexed_universe_is_vectorised():
    big = Universe.indexed(1 << 16)
    idx, valid = big.encode(np.array([0, 65535, 65536, -1]))
    assert idx.tolist()[:2] == [0, 65535] and valid.tolist() == [True, True, False, False]
    assert Universe([IntRange("a", 256), IntRange("b", 256)]).predicate({"a": [3]}).sum() == 256


@pytest.mark.parametrize("weights, reason", [
    (np.ones(5), "wrong_shape"), (np.full(4, 2.0), "out_of_range"), (np.full(4, np.nan), "non_finite"),
    ("text", "bad_value"), (np.array(["a"] * 4), "bad_value"), (None, "bad_value"),
])
def test_check_query_reasons(weights, reason):
    with pytest.raises(ValueError, match=f"^{reason}"):
        check_query(weights, 4)


def test_invalid_schemas():
    for make in (lambda: Categorical("c", ()), lambda: Categorical("c", ("a", "a")), lambda: Bucketed("x", (1, 1)),
                 lambda: IntRange("k", 0), lambda: Universe([]), lambda: Universe([IntRange("a", 2), IntRange("a", 2)]),
                 lambda: Universe([IntRange("a", 1 << 14), IntRange("b", 1 << 14)])):
        with pytest.raises(ValueError):
            make()
