"""Versioned byte encoding of mechanism state (beam_dp/core/state.py; restore)."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, ClassVar

import numpy as np
import pytest

from beam_dp.core.state import decode_state, encode_state


@dataclasses.dataclass(frozen=True)
class DemoState:
    STATE_VERSION: ClassVar[int] = 3

    step: int
    big: int
    neg_big: int
    flag: bool
    x: float
    neg_zero: float
    tiny: float
    huge: float
    name: str
    nothing: Any
    vec: np.ndarray
    ints: np.ndarray
    empty: np.ndarray
    empty2d: np.ndarray
    matrix: np.ndarray
    nested: tuple
    items: list
    table: dict


@dataclasses.dataclass(frozen=True)
class OtherState:
    STATE_VERSION: ClassVar[int] = 3
    step: int


@dataclasses.dataclass(frozen=True)
class Unversioned:
    a: Any


def _demo() -> DemoState:
    rng = np.random.default_rng(0)
    return DemoState(
        step=12345,
        big=2**100 + 7,
        neg_big=-(2**64) - 1,
        flag=True,
        x=0.1,
        neg_zero=-0.0,
        tiny=5e-324,
        huge=1.7976931348623157e308,
        name="stream/ä-✓",
        nothing=None,
        vec=rng.normal(size=7),
        ints=np.arange(-5, 7, dtype=np.int32).reshape(3, 4),
        empty=np.zeros(0),
        empty2d=np.zeros((0, 3), dtype=np.int64),
        matrix=np.asfortranarray(rng.normal(size=(3, 5)).astype(np.float32)),  # non-C-contiguous
        nested=((1, 2.5), [np.array([True, False]), None], "s"),
        items=[1, "two", 3.0, (4,)],
        table={"b": np.array([1.5, -2.5]), "a": {"inner": (1, 2)}, "c": -0.0},
    )


def _assert_same(a: Any, b: Any) -> None:
    """Deep equality that is exact: types, float bits, array dtype/shape/bytes."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _assert_same(u, v)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def test_round_trip_exact():
    s = _demo()
    data = encode_state(s)
    assert isinstance(data, bytes) and data[:4] == b"BDPS"
    back = decode_state(DemoState, data)
    assert isinstance(back, DemoState)
    _assert_same(s, back)
    assert math.copysign(1.0, back.neg_zero) == -1.0
    assert back.tiny == 5e-324 and back.x == 0.1
    assert back.big == 2**100 + 7 and back.neg_big == -(2**64) - 1
    assert back.flag is True
    assert back.vec.flags.writeable  # decoded arrays are owned, writable copies
    assert back.ints.dtype == np.int32 and back.ints.shape == (3, 4)
    assert back.matrix.dtype == np.float32 and np.array_equal(back.matrix, s.matrix)
    assert back.empty.shape == (0,) and back.empty2d.shape == (0, 3) and back.empty2d.dtype == np.int64


def test_special_floats_and_dtypes():
    s = Unversioned(
        a=[
            math.inf, -math.inf, 1e-310, -1e-310, 2.0**-1074, 1 / 3,
            np.array([np.inf, -0.0, 5e-324]),
            np.array([1, 2], dtype=">i4"),  # big-endian input
            np.array([1 + 2j, -3j], dtype=np.complex128),
            np.array([[1, 0], [0, 1]], dtype=np.uint8),
            np.array(7.5),  # 0-d
            np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2, 1:],  # strided view
        ]
    )
    back = decode_state(Unversioned, encode_state(s))
    for orig, got in zip(s.a, back.a):
        if isinstance(orig, np.ndarray):
            assert np.array_equal(orig, got) and orig.shape == got.shape
            assert got.dtype == orig.dtype.newbyteorder("<") or got.dtype == orig.dtype
            if orig.dtype.kind == "f":
                assert np.signbit(orig).tolist() == np.signbit(got).tolist()
        else:
            _assert_same(orig, got)
    # NaN round-trips as NaN (float and array).
    n = decode_state(Unversioned, encode_state(Unversioned(a=(math.nan, np.array([np.nan])))))
    assert math.isnan(n.a[0]) and np.isnan(n.a[1][0])


def test_numpy_scalars_become_python_numbers():
    back = decode_state(Unversioned, encode_state(Unversioned(a=(np.int64(-3), np.float32(0.5), np.uint64(2**64 - 1)))))
    assert back.a == (-3, 0.5, 2**64 - 1)
    assert type(back.a[0]) is int and type(back.a[1]) is float


def test_deterministic_bytes():
    assert encode_state(_demo()) == encode_state(_demo())
    s = _demo()
    assert encode_state(s) == encode_state(decode_state(DemoState, encode_state(s)))  # stable under re-encoding
    # Changing one bit of one array changes the bytes.
    vec = s.vec.copy()
    vec.view(np.uint64)[3] ^= 1
    assert encode_state(dataclasses.replace(s, vec=vec)) != encode_state(s)
    assert encode_state(dataclasses.replace(s, neg_zero=0.0)) != encode_state(s)


def test_wrong_class_refused():
    data = encode_state(_demo())
    with pytest.raises(ValueError, match="not a"):
        decode_state(OtherState, data)


def test_wrong_version_refused():
    data = encode_state(OtherState(step=1))

    @dataclasses.dataclass(frozen=True)
    class OtherState_v4:  # noqa: N801 - same qualified name as OtherState, newer version
        STATE_VERSION: ClassVar[int] = 4
        step: int

    OtherState_v4.__qualname__ = OtherState.__qualname__
    OtherState_v4.__module__ = OtherState.__module__
    with pytest.raises(ValueError, match="version"):
        decode_state(OtherState_v4, data)
    assert decode_state(OtherState, data) == OtherState(step=1)


def test_bad_format_number_refused():
    data = bytearray(encode_state(OtherState(step=1)))
    data[4:6] = struct.pack("<H", 99)
    with pytest.raises(ValueError, match="format"):
        decode_state(OtherState, bytes(data))


def _garbage_inputs() -> list[bytes]:
    good = encode_state(_demo())
    rng = np.random.default_rng(5)
    out = [
        b"",
        b"BDP",
        b"XXXX" + good[4:],
        rng.bytes(200),
        b"BDPS",
        b"BDPS\x01\x00",
        b"BDPS\x01\x00\xff\xff\xff\xff",
        b"BDPS\x01\x00\x05\x00\x00\x00[1,2]",  # header is not an object
        b"BDPS\x01\x00\x02\x00\x00\x00{}",  # header without fields
        b"BDPS\x01\x00\x04\x00\x00\x00\xff\xfe\x00\x01",  # not UTF-8 / JSON
        b"BDPS\x01\x00\x03\x00\x00\x00abc",
    ]
    # Every truncation of a valid encoding (header cut, buffers cut).
    out += [good[:k] for k in range(5, len(good), 7)]
    return out


@pytest.mark.parametrize("data", _garbage_inputs())
def test_garbage_refused_with_value_error(data):
    with pytest.raises(ValueError):
        decode_state(DemoState, data)


def test_corrupted_header_refused_with_value_error():
    good = encode_state(OtherState(step=1))
    head_len = struct.unpack_from("<I", good, 6)[0]
    header = good[10 : 10 + head_len]
    for bad_header in [
        header.replace(b'"fields"', b'"fieldz"'),
        header.replace(b'"version":3', b'"version":"x"'),
        header.replace(b'{"i":"1"}', b'{"q":"1"}'),
        header.replace(b'{"i":"1"}', b'{"i":"one"}'),
        header.replace(b'"step"', b'"stop"'),  # unknown field name
    ]:
        assert bad_header != header
        data = good[:6] + struct.pack("<I", len(bad_header)) + bad_header
        with pytest.raises(ValueError):
            decode_state(OtherState, data)


def test_object_arrays_and_unsupported_values_refused():
    with pytest.raises(TypeError):
        encode_state(Unversioned(a=np.array([1, "x", None], dtype=object)))
    with pytest.raises(TypeError):
        encode_state(Unversioned(a=b"bytes"))
    with pytest.raises(TypeError):
        encode_state(Unversioned(a={1: 2}))  # non-string dict key
    with pytest.raises(TypeError):
        encode_state(Unversioned(a={"x": object()}))
    with pytest.raises(TypeError):
        encode_state({"not": "a dataclass"})
    with pytest.raises(TypeError):
        encode_state(DemoState)  # the class, not an instance


def test_zero_dim_arrays_keep_their_shape():
    s = Unversioned(a=(np.array(7.5), np.array(3, dtype=np.int8), np.zeros((2, 0, 4), dtype=np.float32)))
    back = decode_state(Unversioned, encode_state(s))
    for orig, got in zip(s.a, back.a):
        assert got.shape == orig.shape and got.dtype == orig.dtype and got.tobytes() == orig.tobytes()


def test_dict_insertion_order_does_not_change_bytes():
    x = {"a": np.ones(2), "b": np.zeros(3), "c": 1.5}
    y = {"c": 1.5, "b": np.zeros(3), "a": np.ones(2)}
    assert encode_state(Unversioned(a=x)) == encode_state(Unversioned(a=y))
    back = decode_state(Unversioned, encode_state(Unversioned(a=y)))
    _assert_same(back.a, {k: x[k] for k in sorted(x)})


def test_trailing_bytes_refused():
    good = encode_state(_demo())
    with pytest.raises(ValueError):
        decode_state(DemoState, good + b"\x00")
    with pytest.raises(ValueError):
        decode_state(DemoState, good[:-1])
