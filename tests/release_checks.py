"""One comparison of a release with a recorded fixture or with another computation of the same release.

Floats are compared with a tolerance, everything else exactly. A release's floats (values, spends,
meta such as ``alpha_t`` or ``noise_std``) come out of BLAS and libm, whose last bits differ between
processors and builds: a recorded float equals today's only up to a few ulps. ``RTOL``/``ATOL`` =
1e-12: the releases under test are float64 (unit roundoff 1.1e-16) computed by at most a few hundred
operations per value (a step's tree sums, a solver's tens of iterations), so an honest difference
stays below ~1e-13 relative; 1e-12 leaves a margin and is still 10 orders of magnitude below any noise
scale, so a wrong noise cell or formula still fails. Integers, strings, booleans and None compare
exactly (steps, streams, mechanism names, node counts are exact by construction).

``tests/test_no_exact_float_fixtures.py`` keeps fixture tests on this helper.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ATOL", "RELEASE_FIELDS", "RTOL", "assert_close_values", "assert_release_matches", "release_fields"]

RTOL = 1e-12
ATOL = 1e-12

#: The fields of a release that a fixture can record.
RELEASE_FIELDS = ("stream", "step", "mechanism", "value", "epsilon_spent", "delta_spent", "meta")


def release_fields(release: Any) -> dict[str, Any]:
    """The :data:`RELEASE_FIELDS` of a ``Release``, a ``ReleaseRow`` or a release dict (those it has);
    ``meta`` as a plain dict (parsed when it is a row's JSON text)."""
    get = release.get if isinstance(release, Mapping) else (lambda name, default=None: getattr(release, name, default))
    missing = object()
    fields = {name: get(name, missing) for name in RELEASE_FIELDS}
    fields = {name: value for name, value in fields.items() if value is not missing}
    if isinstance(fields.get("meta"), str):  # a row's meta column is JSON text
        fields["meta"] = json.loads(fields["meta"])
    if isinstance(fields.get("meta"), Mapping):
        fields["meta"] = dict(fields["meta"])
    return fields


def _is_float(x: Any) -> bool:
    return isinstance(x, (float, np.floating)) or (isinstance(x, np.ndarray) and x.dtype.kind in "fc")


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def assert_close_values(got: Any, want: Any, where: str = "release", rtol: float = RTOL, atol: float = ATOL) -> None:
    """``got`` equals ``want`` with floats within ``rtol``/``atol`` at any depth (mappings by key,
    sequences and arrays element by element) and everything else exactly."""
    if isinstance(want, Mapping) or isinstance(got, Mapping):
        assert isinstance(got, Mapping) and isinstance(want, Mapping), f"{where}: {got!r} != {want!r}"
        assert set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_close_values(got[key], want[key], f"{where}[{key!r}]", rtol, atol)
        return
    if isinstance(got, np.ndarray) or isinstance(want, np.ndarray) or (
            isinstance(want, Sequence) and not isinstance(want, str)):
        try:
            got_a, want_a = np.asarray(got), np.asarray(want)
        except ValueError:  # ragged: compared element by element below
            got_a = want_a = np.asarray(None)
        if got_a.dtype.kind in "iufc" and want_a.dtype.kind in "iufc":
            assert got_a.shape == want_a.shape, f"{where}: shape {got_a.shape} != {want_a.shape}"
            if got_a.dtype.kind in "fc" or want_a.dtype.kind in "fc":
                np.testing.assert_allclose(got_a, want_a, rtol=rtol, atol=atol, err_msg=where)
            else:  # integers: exact
                np.testing.assert_array_equal(got_a, want_a, err_msg=where)
            return
        assert isinstance(got, Sequence) and not isinstance(got, str) and len(got) == len(want), \
            f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close_values(g, w, f"{where}[{i}]", rtol, atol)
        return
    if _is_number(got) and _is_number(want) and (_is_float(got) or _is_float(want)):
        assert np.isclose(float(got), float(want), rtol=rtol, atol=atol) or (
            np.isnan(float(got)) and np.isnan(float(want))), f"{where}: {got!r} != {want!r} (rtol {rtol})"
        return
    if isinstance(got, (bool, np.bool_)) or isinstance(want, (bool, np.bool_)):  # not 1 == True
        assert isinstance(got, (bool, np.bool_)) and isinstance(want, (bool, np.bool_)) and bool(got) == bool(want), \
            f"{where}: {got!r} != {want!r}"
        return
    assert got == want, f"{where}: {got!r} != {want!r}"


def assert_release_matches(got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
    """``got`` (a ``Release``, ``ReleaseRow`` or dict) has every field ``want`` records (a fixture
    dict or another release), floats within tolerance and the rest exactly."""
    got_fields, want_fields = release_fields(got), release_fields(want)
    assert set(want_fields) <= set(got_fields), f"release lacks {sorted(set(want_fields) - set(got_fields))}"
    for name, expected in want_fields.items():
        assert_close_values(got_fields[name], expected, name, rtol, atol)
