"""The release record (ARCHITECTURE §3; beam_dp/core/release.py)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from beam_dp.core.release import Release


def _release(value, **kw) -> Release:
    args = dict(stream="s1", step=3, mechanism="tree", value=value, epsilon_spent=0.5, delta_spent=0.0,
                meta={"noise": "k-norm", "scale": 2.0})
    args.update(kw)
    return Release(**args)


def test_value_converted_to_read_only_float64():
    src = np.array([1, 2, 3], dtype=np.int32)
    r = _release(src)
    assert isinstance(r.value, np.ndarray) and r.value.dtype == np.float64
    assert np.array_equal(r.value, [1.0, 2.0, 3.0])
    assert not r.value.flags.writeable
    with pytest.raises(ValueError):
        r.value[0] = 9.0
    # It is a copy: the caller's array stays writable and later changes do not leak in.
    assert src.flags.writeable
    f = np.array([1.5, 2.5])
    r2 = _release(f)
    f[0] = 100.0
    assert r2.value[0] == 1.5
    # Lists and scalars too.
    assert _release([0.5, 1]).value.dtype == np.float64
    assert _release(4).value.shape == () and _release(4).value.dtype == np.float64


def test_mapping_values():
    r = _release({"weights": [1, 2], "intercept": np.float32(0.5), 7: np.eye(2)})
    assert set(r.value) == {"weights", "intercept", "7"}
    for arr in r.value.values():
        assert arr.dtype == np.float64 and not arr.flags.writeable
    assert r.arrays().keys() == r.value.keys()
    assert np.array_equal(r.arrays()["7"], np.eye(2))


def test_arrays():
    r = _release(np.arange(3.0))
    arrays = r.arrays()
    assert list(arrays) == ["value"] and arrays["value"] is r.value
    m = _release({"a": [1.0]})
    out = m.arrays()
    out["b"] = np.zeros(1)  # a new dict: does not change the release
    assert list(m.arrays()) == ["a"]


def test_equality_is_byte_level():
    v = np.array([0.1, 0.2, 0.3])
    a, b = _release(v), _release(v.copy())
    assert a == b and not (a != b)
    flipped = v.copy()
    flipped.view(np.uint64)[1] ^= 1  # one bit of one value
    assert flipped[1] != v[1] and abs(flipped[1] - v[1]) < 1e-16
    assert a != _release(flipped)
    # -0.0 and 0.0 compare equal as floats but differ in bytes.
    assert _release([0.0]) != _release([-0.0])
    # NaN: the same bytes are equal (reproducibility), even though NaN != NaN.
    assert _release([np.nan]) == _release([np.nan])
    # Shape matters, not just bytes.
    assert _release(np.zeros((2, 3))) != _release(np.zeros((3, 2)))
    assert _release(np.zeros(6)) != _release(np.zeros((6, 1)))


def test_equality_on_metadata_and_mappings():
    base = _release([1.0])
    assert base != _release([1.0], stream="s2")
    assert base != _release([1.0], step=4)
    assert base != _release([1.0], mechanism="window-tree")
    assert base != _release([1.0], epsilon_spent=0.6)
    assert base != _release([1.0], delta_spent=1e-9)
    assert base != _release([1.0], meta={"noise": "gauss"})
    m1 = _release({"w": [1.0, 2.0], "b": [0.0]})
    assert m1 == _release({"b": [0.0], "w": [1.0, 2.0]})
    assert m1 != _release({"w": [1.0, 2.0]})
    assert m1 != _release({"w": [1.0, 2.0], "b": [-0.0]})
    assert m1 != _release([1.0, 2.0, 0.0])
    assert base.__eq__("not a release") is NotImplemented


def test_frozen_unhashable_and_picklable():
    r = _release({"w": [1.0, 2.0]})
    with pytest.raises(AttributeError):  # a frozen dataclass or a NamedTuple
        r.step = 4
    with pytest.raises(TypeError):
        hash(r)
    for back in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
        assert back == r
        # Still read-only float64 after a round trip through pickle (as between Beam stages).
        assert not back.value["w"].flags.writeable and back.value["w"].dtype == np.float64
    plain = pickle.loads(pickle.dumps(_release(np.arange(4.0))))
    assert plain == _release(np.arange(4.0)) and not plain.value.flags.writeable
