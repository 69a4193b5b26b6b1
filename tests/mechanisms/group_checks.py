"""Checks shared by the tests of mechanisms that step groups of streams."""

from __future__ import annotations

import dataclasses

import pytest


def assert_stack_refusals(mech, fresh, stepped, foreign_state) -> None:
    """``mech.stack``/``init_group`` refuse states at different steps, no states, repeated streams, a
    state of another type (``foreign_state``) and a state whose parts belong to another stream.
    ``fresh`` is a new state of stream "a", ``stepped`` one of stream "b" after one step."""
    with pytest.raises(ValueError, match="same step"):
        mech.stack([fresh, stepped])
    with pytest.raises(ValueError, match="at least one"):
        mech.stack([])
    with pytest.raises(ValueError, match="distinct"):
        mech.init_group(["a", "a"])
    with pytest.raises(TypeError):
        mech.stack([foreign_state])
    with pytest.raises(ValueError, match="another stream"):
        mech.stack([dataclasses.replace(fresh, stream="z")])
