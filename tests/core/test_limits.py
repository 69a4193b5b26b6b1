"""The primitive checks of ``beam_dp.core.limits``: one refusal (``ValueError`` naming the field and its
range) of bools, non-numbers, non-finite and out-of-range values, and the normalised value otherwise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core.limits import MAX_COUNT, check_choice, check_count, check_delta, check_number, check_window

NOT_NUMBERS = (True, False, np.bool_(True), "1", None, [1], b"1")


@pytest.mark.parametrize("bad", NOT_NUMBERS + (math.nan, math.inf, -math.inf, 10**400, 0.5, 3))
def test_check_number_refuses_bools_non_numbers_non_finite_and_out_of_range(bad):
    with pytest.raises(ValueError, match=r"^x must be a (finite )?number in \[1, 2\]"):
        check_number("x", bad, 1.0, 2.0)


def test_check_number_returns_a_float_and_honours_an_open_low_end():
    for good in (1, 1.5, np.float32(2.0), np.int64(1)):
        value = check_number("x", good, 1.0, 2.0)
        assert type(value) is float and value == float(good)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        check_number("x", 0.0, 0.0, 1.0, low_open=True)
    assert check_number("x", 1e-300, 0.0, 1.0, low_open=True) == 1e-300


@pytest.mark.parametrize("bad", NOT_NUMBERS + (math.nan, math.inf, 1.0, 2.5, 0, -1, MAX_COUNT + 1))
def test_check_count_refuses_everything_but_an_int_in_range(bad):
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 2\*\*62\]"):
        check_count("n", bad)


def test_check_count_returns_an_int():
    assert check_count("n", np.int64(5)) == 5 and type(check_count("n", np.int64(5))) is int
    assert check_count("n", 0, 0) == 0 and check_count("n", MAX_COUNT) == MAX_COUNT


def test_check_delta_zero_or_a_probability():
    assert check_delta(0) == 0.0 and check_delta(1e-6) == 1e-6 and check_delta(1) == 1.0
    for bad in (True, False, "0", math.nan, -1e-9, 1.5, 1e-200):
        with pytest.raises(ValueError, match="delta"):
            check_delta(bad)


def test_check_window_caps_cells_by_dim():
    assert check_window(4, 1) == 4
    with pytest.raises(ValueError, match=r"window must be an integer in \[1, 2\]"):
        check_window(3, 2**23)


def test_check_choice():
    assert check_choice("noise", "gamma", ("gamma", "gaussian")) == "gamma"
    for bad in ("Gamma", True, None, 1, ["gamma"]):
        with pytest.raises(ValueError, match=r"^noise must be one of 'gamma', 'gaussian', got "):
            check_choice("noise", bad, ("gamma", "gaussian"))
