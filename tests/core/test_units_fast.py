"""The fast paths of unit bounding equal bound_block: bound_sorted (the batch replay's, sorted rows and
stream indices) and bound_unit with UnitRow's refusal and advance (a streaming stage's, one unit)."""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core.unit_steps import UnitRow
from beam_dp.core.units import (
    UnitBounds,
    UnitKeys,
    UnitLedger,
    bound_block,
    bound_sorted,
    bound_unit,
    unit_hash,
)

KEY = bytes(range(32))
R = 1.0
KEYS = UnitKeys(KEY)
#: forever and window rules, with m, c small enough that both choices drop on most blocks
RULES = [UnitBounds(2, 3, 4), UnitBounds(1, 2, 3, min_separation=2), UnitBounds(3, 1, 2, window=4),
         UnitBounds(2, 2, 3, min_separation=2, window=5)]


def _rows(rng, n_units, n_streams, max_rows, dim):
    """Random rows of one step: units sending 1..max_rows rows each to random streams, N(0, 1) values
    (continuous: no two rows of a (unit, stream) share a value, so every choice is unique)."""
    counts = rng.integers(1, max_rows + 1, n_units)
    hashes = np.repeat(unit_hash(KEY, [f"u{i}" for i in range(n_units)]), counts)
    streams = np.array([f"s{j:02d}" for j in range(n_streams)], dtype=object)[rng.integers(0, n_streams, len(hashes))]
    perm = rng.permutation(len(hashes))
    return hashes[perm], streams[perm], rng.normal(0.0, 1.0, (len(hashes), dim))


def _assert_same_ledger(a: UnitLedger, b: UnitLedger) -> None:
    assert a.step == b.step
    for field in ("units", "steps", "taken", "exhausted"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.parametrize("bounds", RULES)
@pytest.mark.parametrize("dim", [1, 3])
def test_bound_sorted_equals_bound_block_on_random_blocks(bounds, dim):
    rng = np.random.default_rng(11 + dim)
    names = [f"s{j:02d}" for j in range(12)]
    stream_hashes = KEYS.stream_hashes(names)
    slow = fast = UnitLedger.empty(bounds)
    for step in range(1, 13):  # some steps skipped: the rules' gaps
        if step % 5 == 0:
            continue
        hashes, streams, values = _rows(rng, 40, len(names), 9, dim)
        flat = values[:, 0] if dim == 1 else values
        want = bound_block(slow, step, hashes, streams, flat, bounds, KEY, clip_bound=R)
        codes = np.searchsorted(names, streams.astype(str))
        order = np.lexsort((codes, hashes))
        got = bound_sorted(fast, step, hashes[order], codes[order], flat[order], stream_hashes, bounds, KEYS,
                           clip_bound=R)
        np.testing.assert_array_equal(got.units, want.units)
        assert np.array(names, dtype=object)[got.codes].tolist() == want.streams.tolist()
        # the same rows in another summation order: equal to rounding (|sum| <= 9 sigma-scale values)
        np.testing.assert_allclose(got.sums, want.sums, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got.clipped, want.clipped)
        np.testing.assert_array_equal(got.row_drops, want.row_drops[order])
        assert got.drops == want.drops and sum(want.drops.values()) > 0
        _assert_same_ledger(got.ledger, want.ledger)
        slow, fast = want.ledger, got.ledger


def test_bound_sorted_refuses_unsorted_rows_and_bad_indices():
    bounds = RULES[0]
    hashes = unit_hash(KEY, ["a", "b"])
    hashes = np.sort(hashes)
    stream_hashes = KEYS.stream_hashes(["x", "y"])
    ok = dict(clip_bound=R)
    with pytest.raises(ValueError, match="sorted by"):
        bound_sorted(UnitLedger.empty(bounds), 1, hashes[::-1], np.array([0, 0]), np.ones(2), stream_hashes, bounds,
                     KEYS, **ok)
    with pytest.raises(ValueError, match="sorted by"):
        bound_sorted(UnitLedger.empty(bounds), 1, hashes[[0, 0]], np.array([1, 0]), np.ones(2), stream_hashes, bounds,
                     KEYS, **ok)
    with pytest.raises(ValueError, match="indices into stream_hashes"):
        bound_sorted(UnitLedger.empty(bounds), 1, hashes, np.array([0, 2]), np.ones(2), stream_hashes, bounds, KEYS,
                     **ok)
    empty = bound_sorted(UnitLedger.empty(bounds), 1, hashes[:0], np.zeros(0, np.int64), np.ones(0), stream_hashes,
                         bounds, KEYS, **ok)
    assert len(empty.units) == 0 and empty.ledger.step == 1


def _row_of(ledger: UnitLedger, bounds: UnitBounds) -> UnitRow:
    """The one-unit ledger as a UnitRow (the streaming state's form)."""
    if len(ledger.units):
        return UnitRow(bounds.rule, ledger.step, int(ledger.taken[0]), False, tuple(map(int, ledger.steps[0])))
    return UnitRow(bounds.rule, ledger.step, 0, len(ledger.exhausted) > 0, UnitRow.empty(bounds).steps)


@pytest.mark.parametrize("bounds", RULES)
def test_one_unit_path_equals_bound_block_step_by_step(bounds):
    """UnitRow.refusal, bound_unit and UnitRow.advanced over random steps of one unit give bound_block's
    refusals, kept streams, sums, row drops and ledger."""
    rng = np.random.default_rng(3)
    for trial in range(30):
        unit = unit_hash(KEY, [f"unit-{trial}"])[0]
        ledger, row = UnitLedger.empty(bounds), UnitRow.empty(bounds)
        for step in np.sort(rng.choice(np.arange(1, 25), 10, replace=False)).tolist():
            n = int(rng.integers(1, 10))
            streams = [f"s{j}" for j in rng.integers(0, 5, n)]
            values = rng.normal(0.0, 1.0, (n, 2))
            want = bound_block(ledger, step, np.full(n, unit, np.uint64), streams, values, bounds, KEYS, clip_bound=R)
            refused = row.refusal(step)
            assert refused == int(ledger.refusals(np.array([unit], np.uint64), step)[0])
            if refused:
                assert not len(want.streams) and (want.row_drops == refused).all()
            else:
                got = bound_unit(unit, step, streams, values, bounds, KEYS, clip_bound=R)
                assert got.streams == want.streams.tolist()
                np.testing.assert_allclose(got.sums, want.sums, rtol=1e-12, atol=1e-12)
                np.testing.assert_array_equal(got.clipped, want.clipped)
                np.testing.assert_array_equal(got.row_drops, want.row_drops)
            ledger, row = want.ledger, row.advanced(step, not refused)
            assert row == _row_of(ledger, bounds)
