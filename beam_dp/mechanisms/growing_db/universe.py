"""A declared finite data universe 𝒳 = {0, …, N−1} and linear queries over it (Cummings et al., "Differential Privacy for Growing Databases").

A :class:`Universe` is a product of fields, each mapping a raw value to a code in ``[0, size)``:

* :class:`Categorical` -- a declared list of categories (anything hashable);
* :class:`Bucketed`    -- numeric values cut by declared edges ``e_0 < … < e_k`` into ``k`` buckets
  ``[e_j, e_{j+1})`` (the last one closed); values outside ``[e_0, e_k]`` are outside the universe;
* :class:`IntRange`    -- integer codes ``0 … size−1`` given directly.

A record's index is the mixed-radix number of its codes (first field most significant), so
``N = Π size_j``. Everything is vectorised: encoding a column block is a few numpy calls per field,
compiling a predicate is one broadcast over the ``N`` cells. The schema is public; values are not.

A *linear query* is a weight vector ``f ∈ [0, 1]^N``; its answer on a histogram ``x`` (normalised
to sum 1) is ``⟨f, x⟩``. On a database of ``t`` elements it has L1 sensitivity ``1/t`` under
substitution of one element. :func:`check_query` is the validator every mechanism and adapter uses:
it raises ``ValueError`` whose message starts with a machine-readable reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Bucketed", "Categorical", "IntRange", "Universe", "check_elements", "check_query", "clamp_answer"]

MAX_UNIVERSE = 1 << 26  # dense y and f of 2^26 float64 = 512 MiB each: refuse anything larger


class _Field:
    name: str
    size: int

    def codes(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(codes int64, valid bool)`` for a 1-d column of raw values."""
        raise NotImplementedError

    def mask(self, selection: Any) -> np.ndarray:
        """Boolean mask over this field's codes selected by a predicate clause."""
        raise NotImplementedError

    def label(self, code: int) -> Any:
        raise NotImplementedError


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a field name must be a non-empty string, got {name!r}")
    return name


@dataclass(frozen=True)
class Categorical(_Field):
    """A categorical field with a declared, public list of distinct categories."""

    name: str
    categories: tuple

    def __post_init__(self) -> None:
        _check_name(self.name)
        cats = tuple(self.categories)
        if not cats:
            raise ValueError(f"field {self.name!r}: categories must be non-empty")
        if len(set(cats)) != len(cats):
            raise ValueError(f"field {self.name!r}: categories must be distinct")
        object.__setattr__(self, "categories", cats)
        object.__setattr__(self, "_lookup", {c: i for i, c in enumerate(cats)})

    @property
    def size(self) -> int:
        return len(self.categories)

    def codes(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = np.asarray(values, dtype=object).reshape(-1)
        get = self._lookup.get
        codes = np.fromiter((_lookup(get, v) for v in flat), dtype=np.int64, count=flat.size)
        return np.maximum(codes, 0), codes >= 0

    def mask(self, selection: Any) -> np.ndarray:
        chosen = [selection] if isinstance(selection, (str, bytes)) or not isinstance(selection, Iterable) else selection
        out = np.zeros(self.size, dtype=bool)
        for c in chosen:
            if c not in self._lookup:
                raise ValueError(f"field {self.name!r}: unknown category in predicate")
            out[self._lookup[c]] = True
        return out

    def label(self, code: int) -> Any:
        return self.categories[code]


def _lookup(get, value: Any) -> int:
    try:
        return get(value, -1)
    except TypeError:  # unhashable: not a category
        return -1


@dataclass(frozen=True)
class Bucketed(_Field):
    """A numeric field cut into buckets ``[e_j, e_{j+1})`` by public, strictly increasing edges."""

    name: str
    edges: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_name(self.name)
        edges = tuple(float(e) for e in self.edges)
        if len(edges) < 2 or not all(math.isfinite(e) for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"field {self.name!r}: edges must be >= 2 finite, strictly increasing numbers")
        object.__setattr__(self, "edges", edges)

    @property
    def size(self) -> int:
        return len(self.edges) - 1

    def codes(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        try:
            v = np.asarray(values, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            v = np.array([_to_float(x) for x in np.asarray(values, dtype=object).reshape(-1)], dtype=np.float64)
        edges = np.asarray(self.edges)
        valid = np.isfinite(v) & (v >= edges[0]) & (v <= edges[-1])
        codes = np.clip(np.searchsorted(edges, np.where(valid, v, edges[0]), side="right") - 1, 0, self.size - 1)
        return codes.astype(np.int64), valid

    def mask(self, selection: Any) -> np.ndarray:
        """``(lo, hi)``: the buckets lying inside ``[lo, hi]``."""
        lo, hi = (float(s) for s in selection)
        edges = np.asarray(self.edges)
        return (edges[:-1] >= lo) & (edges[1:] <= hi)

    def label(self, code: int) -> Any:
        return (self.edges[code], self.edges[code + 1])


def _to_float(x: Any) -> float:
    try:
        return float(x) if not isinstance(x, (str, bytes, bool)) and x is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class IntRange(_Field):
    """Integer codes ``0 … size−1`` given directly."""

    name: str
    size: int

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not isinstance(self.size, (int, np.integer)) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"field {self.name!r}: size must be an integer >= 1, got {self.size!r}")

    def codes(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        arr = np.asarray(values)
        if arr.dtype.kind in "iu":
            v = arr.reshape(-1).astype(np.int64)
            valid = (v >= 0) & (v < self.size)
            return np.where(valid, v, 0), valid
        if arr.dtype.kind == "f":
            f = arr.reshape(-1)
            valid = np.isfinite(f) & (f == np.floor(np.where(np.isfinite(f), f, 0))) & (f >= 0) & (f < self.size)
            return np.where(valid, f, 0).astype(np.int64), valid
        flat = arr.reshape(-1)  # an integer beyond int64 is outside too (never converted)
        ints = np.array([x if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and 0 <= x < self.size
                         else -1 for x in flat], dtype=np.int64)
        valid = ints >= 0
        return np.where(valid, ints, 0), valid

    def mask(self, selection: Any) -> np.ndarray:
        out = np.zeros(self.size, dtype=bool)
        idx = np.asarray(list(selection) if isinstance(selection, Iterable) else [selection], dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError(f"field {self.name!r}: code outside [0, {self.size})")
        out[idx] = True
        return out

    def label(self, code: int) -> Any:
        return code


class Universe:
    """The public, finite universe of a growing database: a product of fields, ``N = Π size_j``."""

    def __init__(self, fields: Sequence[_Field]):
        fields = tuple(fields)
        if not fields or not all(isinstance(f, _Field) for f in fields):
            raise ValueError("a Universe needs at least one Categorical/Bucketed/IntRange field")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError("field names must be distinct")
        size = math.prod(f.size for f in fields)
        if size > MAX_UNIVERSE:
            raise ValueError(f"universe size {size} exceeds the supported maximum {MAX_UNIVERSE}")
        self.fields = fields
        self.size = int(size)
        sizes = np.array([f.size for f in fields], dtype=np.int64)
        self._strides = np.concatenate([np.cumprod(sizes[::-1])[::-1][1:], [1]]).astype(np.int64)

    @classmethod
    def indexed(cls, size: int, name: str = "index") -> "Universe":
        """The plain universe ``{0, …, size−1}`` (elements are their own indices)."""
        return cls([IntRange(name, size)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Universe) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def __repr__(self) -> str:
        return f"Universe(N={self.size}, fields={[f.name for f in self.fields]})"

    # -- elements -----------------------------------------------------------------------------
    def encode(self, columns: Mapping[str, Any] | Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Indices of a block of records: ``columns`` maps field name -> column (or, for a
        one-field universe, is the column itself). Returns ``(index int64, valid bool)``."""
        if not isinstance(columns, Mapping):
            if len(self.fields) != 1:
                raise ValueError("a multi-field universe encodes a mapping of columns")
            columns = {self.fields[0].name: columns}
        missing = [field.name for field in self.fields if field.name not in columns]
        if missing:
            raise ValueError(f"missing column {missing[0]!r}")
        return self.combine([field.codes(columns[field.name]) for field in self.fields])

    def combine(self, codes: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Indices of a block from each field's ``(codes int64, valid bool)`` (``_Field.codes``, in field
        order): ``(index int64, valid bool)``."""
        index, valid = None, None
        for (field_codes, ok), stride in zip(codes, self._strides):
            index = field_codes * stride if index is None else index + field_codes * stride
            valid = ok if valid is None else valid & ok
            if len(field_codes) != len(index):
                raise ValueError("columns of different lengths")
        return index, valid

    def encode_one(self, record: Any) -> int:
        """Index of one record (a mapping, a tuple in field order, or a bare value for one field).

        Raises ``ValueError("outside_universe: …")`` / ``("malformed: …")``; never echoes the value.
        """
        index, reasons = self.encode_records([record])
        if reasons[0] == "malformed":
            raise ValueError("malformed: a record is a mapping or a tuple with one value per field")
        if reasons[0]:
            raise ValueError("outside_universe: the record is not in the declared universe")
        return int(index[0])

    def encode_records(self, records: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Indices of many records (each as :meth:`encode_one` takes it) in one vectorised pass:
        ``(index int64, reason)``, ``reason`` per record ``""`` (in the universe), ``"malformed"`` or
        ``"outside_universe"`` (its index is then meaningless)."""
        names = [f.name for f in self.fields]
        columns: dict[str, list] = {name: [] for name in names}
        reasons = np.full(len(records), "", dtype=object)
        for i, record in enumerate(records):
            if isinstance(record, Mapping):
                values = [record.get(name) for name in names]
            elif len(names) == 1 and not (isinstance(record, (tuple, list)) and len(record) == 1):
                values = [record]
            elif isinstance(record, (tuple, list)) and len(record) == len(names):
                values = list(record)
            else:
                reasons[i] = "malformed"
                continue
            for name, value in zip(names, values):
                columns[name].append(value)
        formed = np.flatnonzero(reasons == "")
        index = np.zeros(len(records), dtype=np.int64)
        if len(formed):
            index[formed], valid = self.encode(_object_columns(columns))
            reasons[formed[~valid]] = "outside_universe"
        return index, reasons

    def decode(self, index: int) -> tuple:
        """Labels of the cell ``index`` (categories, bucket intervals or codes)."""
        if not 0 <= int(index) < self.size:
            raise ValueError("index outside the universe")
        rest, out = int(index), []
        for field, stride in zip(self.fields, self._strides):
            code, rest = divmod(rest, int(stride))
            out.append(field.label(code))
        return tuple(out)

    # -- queries ------------------------------------------------------------------------------
    def predicate(self, clauses: Mapping[str, Any]) -> np.ndarray:
        """Counting query (0/1 weights) of a conjunction ``{field: selection}``: categories (Categorical),
        ``(lo, hi)`` (Bucketed: buckets inside ``[lo, hi]``) or codes (IntRange). Missing fields match all."""
        unknown = set(clauses) - {f.name for f in self.fields}
        if unknown:
            raise ValueError("malformed: predicate names an unknown field")
        out = np.ones((), dtype=bool)
        for field in self.fields:
            m = field.mask(clauses[field.name]) if field.name in clauses else np.ones(field.size, dtype=bool)
            out = np.multiply.outer(out, m)  # one broadcast per field: N cells in total
        return out.reshape(self.size).astype(np.float64)

    def counting_query(self, indices: Iterable[int]) -> np.ndarray:
        """0/1 weights selecting the given cell indices."""
        idx = np.asarray(list(indices), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError("outside_universe: index set not inside [0, N)")
        f = np.zeros(self.size)
        f[idx] = 1.0
        return f


def _object_columns(columns: Mapping[str, list]) -> dict[str, np.ndarray]:
    out = {}
    for name, col in columns.items():
        arr = np.empty(len(col), dtype=object)
        arr[:] = col
        out[name] = arr
    return out


def clamp_answer(answer: float, weights: np.ndarray) -> float:
    """Clamp an answer to a linear query ``⟨f, x⟩`` on a normalised histogram x (a probability
    vector) to the range that query can take, ``[min f, max f]``. Post-processing of a private
    answer with the public query: no privacy cost."""
    return float(np.clip(answer, float(np.min(weights)), float(np.max(weights))))


def check_query(weights: Any, size: int) -> np.ndarray:
    """A linear query as a float64 vector in ``[0, 1]^size``, or ``ValueError("<reason>: …")``.

    Reasons: ``bad_value`` (not numeric), ``wrong_shape``, ``non_finite``, ``out_of_range``.
    """
    if isinstance(weights, (str, bytes)) or weights is None:
        raise ValueError("bad_value: a query is a numeric weight vector")
    try:
        arr = np.asarray(weights)
    except Exception:  # ragged input and the like
        raise ValueError("bad_value: not an array") from None
    if arr.dtype.kind not in "iufb":
        raise ValueError("bad_value: not a numeric array")
    arr = arr.astype(np.float64)
    if arr.shape != (size,):
        raise ValueError(f"wrong_shape: expected ({size},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("non_finite: NaN or infinite weight")
    if arr.min(initial=0.0) < 0.0 or arr.max(initial=0.0) > 1.0:
        raise ValueError("out_of_range: weights must lie in [0, 1]")
    return arr


def check_elements(values: Any, size: int) -> np.ndarray:
    """A block of element indices as int64 in ``[0, size)``, or ``ValueError`` (defence in depth)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise ValueError("elements must be a 1-d integer array of universe indices")
    if arr.min() < 0 or arr.max() >= size:
        raise ValueError("outside_universe: element index not inside [0, N)")
    return arr.astype(np.int64)
