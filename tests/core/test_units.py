"""Privacy units (beam_dp/core/units.py): keyed unit hashes, bounds, the ledger and bound_block."""

from __future__ import annotations

import hashlib
import pickle
import time
from collections import defaultdict

import numpy as np
import pytest

from beam_dp.core.clipping import clip_l2
from beam_dp.core.state import decode_state, encode_state
from beam_dp.core.units import (
    DROP_REASONS,
    MAX_UNIT_ID_BYTES,
    MAX_WINDOW_STEPS,
    UNIT_PERSON,
    UnitBounds,
    UnitKeys,
    UnitLedger,
    bound_block,
    unit_hash,
    unit_id_problems,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
R = 1.0
OVER_STEPS, TOO_CLOSE, OVER_STREAMS, OVER_CONTRIBUTIONS = (DROP_REASONS.index(r) + 1 for r in DROP_REASONS)


def _block(rng, n_units, n_streams, max_rows, dim=2, prefix="u"):
    """Random contributions: each unit sends 1..max_rows rows to random streams (ids, hashes, streams, values)."""
    counts = rng.integers(1, max_rows + 1, n_units)
    ids = np.repeat(np.array([f"{prefix}{i}" for i in range(n_units)], dtype=object), counts)
    streams = np.array([f"s{j}" for j in range(n_streams)], dtype=object)[rng.integers(0, n_streams, len(ids))]
    values = rng.normal(0.0, 1.0, (len(ids), dim))
    perm = rng.permutation(len(ids))
    return ids[perm], unit_hash(KEY, ids[perm]), streams[perm], values[perm]


def _kept_per_pair(hashes, streams, values, row_drops):
    """{(unit, stream): kept values as an array} from the row codes."""
    pairs = defaultdict(list)
    for h, s, v, code in zip(hashes, streams, values, row_drops):
        if code == 0:
            pairs[(int(h), s)].append(v)
    return {k: np.array(v) for k, v in pairs.items()}


# -- unit hashes ----------------------------------------------------------------------------------------
def test_unit_hash_is_keyed_blake2b_of_the_id():
    ids = ["alice", "bob", "ünïcode", "x" * MAX_UNIT_ID_BYTES]
    hashes = unit_hash(KEY, ids)
    assert hashes.dtype == np.uint64 and hashes.shape == (4,)
    reference = [int.from_bytes(hashlib.blake2b(i.encode(), key=KEY, digest_size=8, person=UNIT_PERSON).digest(),
                                "little") for i in ids]
    assert hashes.tolist() == reference
    assert unit_hash(KEY, np.array(ids, dtype=object)).tolist() == reference  # an object array too
    assert unit_hash(UnitKeys(KEY), ids[:1]).tolist() == reference[:1]
    assert unit_hash(KEY, []).shape == (0,)


def test_unit_hash_depends_on_the_key_and_is_distinct_per_id():
    ids = [f"user-{i}" for i in range(10_000)]
    mine, other = unit_hash(KEY, ids), unit_hash(OTHER_KEY, ids)
    assert len(set(mine.tolist())) == len(ids)
    assert not np.intersect1d(mine, other).size  # another key: other hashes (a shared one has chance ~1e-11)
    noise_derivation = hashlib.blake2b(b"user-0", key=KEY, digest_size=8, person=b"beam_dp-noise-v1").digest()
    assert int(mine[0]) != int.from_bytes(noise_derivation, "little")  # domain-separated from the noise keys


@pytest.mark.parametrize("bad, detail", [
    (17, "must be a string"), (b"alice", "must be a string"), (None, "must be a string"),
    ("", "must not be empty"), ("\ud800x", "UTF-8"), ("é" * 513, f"at most {MAX_UNIT_ID_BYTES} bytes"),
])
def test_bad_unit_ids_are_refused_with_a_reason_that_hides_the_id(bad, detail):
    ids = ["ok", bad, "fine"]
    problems = unit_id_problems(ids)
    assert [row for row, _ in problems] == [1] and detail in problems[0][1]
    with pytest.raises(ValueError, match="row 1") as err:
        unit_hash(KEY, ids)
    assert not (isinstance(bad, str) and bad and bad in str(err.value))
    assert unit_id_problems(["ok", "x" * MAX_UNIT_ID_BYTES]) == []


def test_unit_id_problems_of_many_ids_find_every_bad_row():
    rng = np.random.default_rng(5)
    ids = np.array([f"user-{i}" for i in range(20_000)], dtype=object)
    assert unit_id_problems(ids) == [] and unit_id_problems([]) == []  # all valid: the one C-level pass
    bad = np.sort(rng.choice(len(ids), 6, replace=False))
    for row, value in zip(bad, [7, "", None, "\ud800", "x" * (MAX_UNIT_ID_BYTES + 1), b"raw"]):
        ids[row] = value
    assert [row for row, _ in unit_id_problems(ids)] == bad.tolist()


def test_unit_keys_hide_the_key():
    keys = UnitKeys(KEY)
    assert KEY.hex() not in repr(keys) and "secret" in repr(keys)
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(keys)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        UnitKeys(b"short")
    assert unit_hash(bytes(100), ["a"]).tolist() == unit_hash(hashlib.blake2b(bytes(100), digest_size=64).digest(),
                                                              ["a"]).tolist()  # long keys as NoiseSource


# -- bounds ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"max_streams_per_step": 0}, {"max_contributions_per_step": -1}, {"max_steps": 1.5}, {"min_separation": 0},
    {"max_steps": True}, {"window": 0}, {"window": 10, "max_steps": MAX_WINDOW_STEPS + 1}, {"max_steps": 2**63},
])
def test_unit_bounds_are_validated(kwargs):
    args = {"max_streams_per_step": 2, "max_contributions_per_step": 3, "max_steps": 4} | kwargs
    with pytest.raises(ValueError):
        UnitBounds(**args)


def test_unit_bounds_rule_and_slots():
    assert UnitBounds(2, 3, 4, 5).rule == (4, 5, None) and UnitBounds(2, 3, 4, 5).slots == 1
    assert UnitBounds(2, 3, 4, window=10).slots == 4
    assert UnitBounds(1, 1, np.int64(3)).max_steps == 3 and type(UnitBounds(1, 1, np.int64(3)).max_steps) is int


# -- bound_block on one step ----------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [1, 3])
def test_bounds_hold_on_random_data(dim):
    rng = np.random.default_rng(20240601 + dim)
    bounds = UnitBounds(max_streams_per_step=3, max_contributions_per_step=2, max_steps=5)
    _, hashes, streams, values = _block(rng, 400, 8, 12, dim)
    if dim == 1:
        values = values[:, 0] * 3.0
    out = bound_block(UnitLedger.empty(bounds), 1, hashes, streams, values, bounds, KEY, clip_bound=R)
    # the row codes and the counts agree, every row has one code
    assert out.row_drops.shape == (len(hashes),)
    assert out.drops == {r: int((out.row_drops == i + 1).sum()) for i, r in enumerate(DROP_REASONS)}
    assert out.drops["over_steps"] == out.drops["too_close"] == 0
    assert out.drops["over_streams"] > 0 and out.drops["over_contributions"] > 0
    kept = _kept_per_pair(hashes, streams, values, out.row_drops)
    # one output per kept (unit, stream), in (unit, stream) order; <= m streams per unit, <= c rows per pair
    pairs = list(zip(out.units.tolist(), out.streams.tolist()))
    assert pairs == sorted(kept) and len(set(pairs)) == len(pairs)
    per_unit = defaultdict(int)
    for unit, _ in pairs:
        per_unit[unit] += 1
    assert max(per_unit.values()) <= 3 and all(len(v) <= 2 for v in kept.values())
    # each output is the clipped sum of the pair's kept rows, of L2 norm <= R
    sums = np.stack([kept[p].sum(axis=0) for p in pairs])
    want, was_clipped = clip_l2(sums.reshape(len(pairs), -1), R)
    np.testing.assert_allclose(out.sums.reshape(len(pairs), -1), want, rtol=1e-12, atol=1e-15)
    assert (out.clipped == was_clipped).all() and out.clipped.any() and not out.clipped.all()
    assert (np.abs(out.sums) if dim == 1 else np.linalg.norm(out.sums, axis=1)).max() <= R * (1 + 1e-12)
    # maximal: a unit keeps min(m, its streams) streams and a pair min(c, its rows) rows
    all_pairs = defaultdict(int)
    for h, s in zip(hashes.tolist(), streams.tolist()):
        all_pairs[(h, s)] += 1
    streams_of = defaultdict(set)
    for h, s in all_pairs:
        streams_of[h].add(s)
    assert all(per_unit[u] == min(3, len(v)) for u, v in streams_of.items())
    assert all(len(kept[p]) == min(2, all_pairs[p]) for p in pairs)
    # the reasons: over_streams rows are in pairs that keep nothing, over_contributions rows in kept pairs
    for h, s, code in zip(hashes.tolist(), streams.tolist(), out.row_drops):
        assert (code == OVER_STREAMS) == ((h, s) not in kept) or code == OVER_CONTRIBUTIONS
        if code == OVER_CONTRIBUTIONS:
            assert (h, s) in kept and len(kept[(h, s)]) == 2


def test_what_a_unit_keeps_does_not_depend_on_other_units():
    rng = np.random.default_rng(7)
    bounds = UnitBounds(max_streams_per_step=2, max_contributions_per_step=2, max_steps=3)
    ids, hashes, streams, values = _block(rng, 60, 5, 10)
    alone = bound_block(UnitLedger.empty(bounds), 4, hashes, streams, values, bounds, KEY, clip_bound=R)
    # other units' rows (with streams this block has never seen) mixed in, the unit's own rows reordered
    _, more_hashes, more_streams, more_values = _block(rng, 200, 9, 10, prefix="other")
    more_streams = np.where(rng.random(len(more_streams)) < 0.5, more_streams + "x", more_streams)
    all_h = np.concatenate([hashes, more_hashes])
    all_s = np.concatenate([streams, more_streams])
    all_v = np.concatenate([values, more_values])
    perm = rng.permutation(len(all_h))
    mixed = bound_block(UnitLedger.empty(bounds), 4, all_h[perm], all_s[perm], all_v[perm], bounds, KEY, clip_bound=R)
    back = np.empty(len(perm), np.int64)
    back[perm] = np.arange(len(perm))
    mine = back[: len(hashes)]  # where the first block's rows went
    assert (mixed.row_drops[mine] == alone.row_drops).all()
    ours = np.isin(mixed.units, hashes)
    assert mixed.units[ours].tolist() == alone.units.tolist()
    assert mixed.streams[ours].tolist() == alone.streams.tolist()
    np.testing.assert_allclose(mixed.sums[ours], alone.sums, rtol=1e-12, atol=1e-15)


def test_the_choice_is_keyed_and_uniform():
    """4 distinct values per (unit, stream), c = 1: each value is kept with probability 1/4 (binomial), and
    another key keeps another one for 3/4 of the units."""
    n_units, per = 4000, 4
    hashes = np.repeat(unit_hash(KEY, [f"u{i}" for i in range(n_units)]), per)
    position = np.tile(np.arange(per), n_units)
    values = position + 10.0 * np.repeat(np.arange(n_units), per)  # distinct per unit, position readable
    streams = np.full(len(hashes), "s", dtype=object)
    bounds = UnitBounds(1, 1, 1)

    def kept_positions(key):
        out = bound_block(UnitLedger.empty(bounds), 1, hashes, streams, values, bounds, key, clip_bound=1e6)
        assert (out.row_drops.reshape(n_units, per) == 0).sum(axis=1).tolist() == [1] * n_units
        return np.argmax(out.row_drops.reshape(n_units, per) == 0, axis=1)

    mine = kept_positions(KEY)
    counts = np.bincount(mine, minlength=per)
    sd = np.sqrt(n_units * 0.25 * 0.75)  # binomial(4000, 1/4): mean 1000, sd 27.4
    assert np.abs(counts - n_units / per).max() < 5 * sd, counts
    differ = (kept_positions(OTHER_KEY) != mine).mean()
    assert abs(differ - 0.75) < 5 * np.sqrt(0.75 * 0.25 / n_units), differ
    assert (kept_positions(UnitKeys(KEY)) == mine).all()  # deterministic


def test_equal_values_make_any_choice_the_same_sum():
    hashes = np.repeat(unit_hash(KEY, ["a", "b"]), 5)
    values = np.array([1.0] * 5 + [-0.0, 0.0, 2.0, 2.0, 2.0])
    bounds = UnitBounds(1, 3, 1)
    out = bound_block(UnitLedger.empty(bounds), 1, hashes, ["s"] * 10, values, bounds, KEY, clip_bound=100.0)
    by_unit = dict(zip(out.units.tolist(), out.sums.tolist()))
    assert by_unit[int(hashes[0])] == pytest.approx(3.0)
    assert out.drops["over_contributions"] == 4


def test_huge_contributions_are_summed_and_clipped_without_overflow():
    hashes = np.repeat(unit_hash(KEY, ["a"]), 3)
    values = np.array([[1.7e308, -1e308], [1.7e308, 1e308], [1.7e308, 0.0]])
    bounds = UnitBounds(1, 3, 1)
    out = bound_block(UnitLedger.empty(bounds), 1, hashes, ["s"] * 3, values, bounds, KEY, clip_bound=2.0)
    np.testing.assert_allclose(out.sums, [[2.0, 0.0]], atol=1e-12)
    assert out.clipped.tolist() == [True]


def test_stream_indices_give_the_same_result_as_stream_ids():
    rng = np.random.default_rng(3)
    bounds = UnitBounds(2, 2, 3)
    _, hashes, streams, values = _block(rng, 100, 6, 8)
    names = ["s4", "s0", "s5", "s2", "s1", "s3"]  # any order
    codes = np.array([names.index(s) for s in streams])
    by_id = bound_block(UnitLedger.empty(bounds), 1, hashes, streams, values, bounds, KEY, clip_bound=R)
    by_code = bound_block(UnitLedger.empty(bounds), 1, hashes, codes, values, bounds, KEY, clip_bound=R,
                          stream_names=names)
    assert (by_id.row_drops == by_code.row_drops).all() and by_id.streams.tolist() == by_code.streams.tolist()
    np.testing.assert_allclose(by_id.sums, by_code.sums, rtol=0, atol=0)


def test_bad_blocks_are_refused():
    bounds = UnitBounds(1, 1, 2)
    ledger = UnitLedger.empty(bounds)
    h = unit_hash(KEY, ["a", "b"])
    with pytest.raises(ValueError, match="finite"):
        bound_block(ledger, 1, h, ["s", "s"], [1.0, np.nan], bounds, KEY, clip_bound=R)
    with pytest.raises(ValueError, match="uint64"):
        bound_block(ledger, 1, h.astype(np.int64), ["s", "s"], [1.0, 2.0], bounds, KEY, clip_bound=R)
    with pytest.raises(ValueError, match="stream ids"):
        bound_block(ledger, 1, h, ["s", ""], [1.0, 2.0], bounds, KEY, clip_bound=R)
    with pytest.raises(ValueError, match="indices"):
        bound_block(ledger, 1, h, [0, 2], [1.0, 2.0], bounds, KEY, clip_bound=R, stream_names=["a", "b"])
    with pytest.raises(ValueError, match="rows"):
        bound_block(ledger, 1, h, ["s", "s"], [1.0], bounds, KEY, clip_bound=R)
    with pytest.raises(ValueError, match="clip_bound"):
        bound_block(ledger, 1, h, ["s", "s"], [1.0, 2.0], bounds, KEY, clip_bound=0.0)
    after = bound_block(ledger, 3, h, ["s", "s"], [1.0, 2.0], bounds, KEY, clip_bound=R).ledger
    with pytest.raises(ValueError, match="step"):  # a step is bounded once, in order
        bound_block(after, 3, h, ["s", "s"], [1.0, 2.0], bounds, KEY, clip_bound=R)
    with pytest.raises(ValueError, match="kept under"):
        bound_block(after, 4, h, ["s", "s"], [1.0, 2.0], UnitBounds(1, 1, 3), KEY, clip_bound=R)
    empty = bound_block(after, 4, np.zeros(0, np.uint64), [], np.zeros((0, 2)), bounds, KEY, clip_bound=R)
    assert empty.sums.shape == (0, 2) and empty.ledger.step == 4 and len(empty.ledger) == 2


# -- steps over a stream's life: the ledger -------------------------------------------------------------
def _admitted(history, step, bounds):
    """The rule on a unit's full history of steps taken (the reference the ledger must match)."""
    if bounds.window is None:
        over = len(history) >= bounds.max_steps
    else:
        over = sum(s > step - bounds.window for s in history) >= bounds.max_steps
    close = bool(history) and step - history[-1] < bounds.min_separation
    return OVER_STEPS if over else TOO_CLOSE if close else 0


@pytest.mark.parametrize("bounds", [
    UnitBounds(2, 2, max_steps=3, min_separation=2),
    UnitBounds(2, 2, max_steps=2, min_separation=1, window=4),
    UnitBounds(1, 3, max_steps=3, min_separation=3, window=5),
    UnitBounds(2, 1, max_steps=2, min_separation=6, window=4),
    UnitBounds(3, 1, max_steps=1),
])
def test_steps_per_unit_follow_the_rule_across_restores(bounds):
    """Random units over 30 steps (some skipped), the ledger encoded and decoded after every step: each
    unit is admitted exactly when the rule on its full history allows; no restore gives steps back."""
    rng = np.random.default_rng(11)
    names = np.array([f"person{i}@example.com" for i in range(80)], dtype=object)
    hashes_of = dict(zip(names.tolist(), unit_hash(KEY, names).tolist()))
    ledger = UnitLedger.empty(bounds)
    history: dict[str, list[int]] = defaultdict(list)
    for step in sorted(rng.choice(np.arange(1, 45), 30, replace=False).tolist()):
        present = names[rng.random(len(names)) < 0.6]
        rows = np.repeat(present, rng.integers(1, 4, len(present)))
        streams = np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, len(rows))]
        out = bound_block(ledger, step, unit_hash(KEY, rows), streams, rng.normal(size=len(rows)), bounds, KEY,
                          clip_bound=R)
        for unit in present.tolist():
            want = _admitted(history[unit], step, bounds)
            got = out.row_drops[rows == unit]
            if want:
                assert (got == want).all(), (unit, step, history[unit])
            else:
                assert (got == 0).any() and not np.isin(got, [OVER_STEPS, TOO_CLOSE]).any()
                history[unit].append(step)
        data = encode_state(out.ledger)
        assert not any(name.encode() in data for name in names.tolist())  # no clear id in the state
        ledger = decode_state(UnitLedger, data)
        assert ledger.step == step
    for steps in history.values():  # the guarantee's bounds, checked on what was admitted
        assert all(b - a >= bounds.min_separation for a, b in zip(steps, steps[1:]))
        if bounds.window is None:
            assert len(steps) <= bounds.max_steps
        else:
            assert all(sum(t - bounds.window < s <= t for s in steps) <= bounds.max_steps for t in steps)
    if bounds.window is None:  # exhausted units are kept as hashes only, the others keep their row
        exhausted = {u for u, s in history.items() if len(s) == bounds.max_steps}
        assert set(ledger.exhausted.tolist()) == {hashes_of[u] for u in exhausted}
        assert set(ledger.units.tolist()) == {hashes_of[u] for u, s in history.items() if s} - set(
            ledger.exhausted.tolist())
    else:  # a row lives while its last step is within max(W, b)
        horizon = max(bounds.window, bounds.min_separation)
        assert set(ledger.units.tolist()) == {hashes_of[u] for u, s in history.items()
                                              if s and ledger.step - s[-1] < horizon}
        assert len(ledger) <= len(names)


def test_window_rows_expire_and_exhausted_units_stay_refused():
    bounds = UnitBounds(1, 1, max_steps=1, window=3)
    h = unit_hash(KEY, ["a"])
    ledger = bound_block(UnitLedger.empty(bounds), 1, h, ["s"], [1.0], bounds, KEY, clip_bound=R).ledger
    assert len(ledger) == 1
    assert bound_block(ledger, 3, h, ["s"], [1.0], bounds, KEY, clip_bound=R).drops["over_steps"] == 1
    quiet = bound_block(ledger, 4, np.zeros(0, np.uint64), [], [], bounds, KEY, clip_bound=R).ledger
    assert len(quiet) == 0  # 3 steps without a step taken: the row is gone
    assert bound_block(quiet, 5, h, ["s"], [1.0], bounds, KEY, clip_bound=R).drops["over_steps"] == 0
    forever = UnitBounds(1, 1, max_steps=2)
    ledger = UnitLedger.empty(forever)
    for step in (1, 2):
        ledger = bound_block(ledger, step, h, ["s"], [1.0], forever, KEY, clip_bound=R).ledger
    assert len(ledger) == 0 and ledger.exhausted.tolist() == h.tolist()
    restored = decode_state(UnitLedger, encode_state(ledger))
    out = bound_block(restored, 10**6, h, ["s"], [1.0], forever, KEY, clip_bound=R)
    assert out.drops["over_steps"] == 1 and len(out.units) == 0


def test_a_corrupt_ledger_is_refused():
    ledger = bound_block(UnitLedger.empty(UnitBounds(1, 1, 3)), 2, unit_hash(KEY, ["a", "b"]), ["s", "s"],
                         [1.0, 1.0], UnitBounds(1, 1, 3), KEY, clip_bound=R).ledger
    with pytest.raises(ValueError, match="ascending"):
        UnitLedger(3, 1, None, 2, ledger.units[::-1].copy(), ledger.steps, ledger.taken, ledger.exhausted)
    with pytest.raises(ValueError, match="after the ledger's step"):
        UnitLedger(3, 1, None, 1, ledger.units, ledger.steps, ledger.taken, ledger.exhausted)
    with pytest.raises(ValueError, match="uint64"):
        UnitLedger(3, 1, None, 2, ledger.units.astype(np.int64), ledger.steps, ledger.taken, ledger.exhausted)
    with pytest.raises(ValueError, match="no exhausted"):
        UnitLedger(3, 1, 5, 2, ledger.units, np.zeros((2, 3), np.int64) + 2, ledger.taken, ledger.units.copy())


# -- speed ----------------------------------------------------------------------------------------------
def test_speed_of_one_step_of_100k_units_by_10_streams():
    """Printed, not asserted (shared machines): 1M rows, every unit over m streams and some over c."""
    rng = np.random.default_rng(5)
    n_units, n_streams = 100_000, 10
    keys = UnitKeys(KEY)
    started = time.perf_counter()
    hashes = keys.hash([f"user-{i}" for i in range(n_units)])
    hashing = time.perf_counter() - started
    rows = np.repeat(hashes, n_streams)
    codes = np.tile(np.arange(n_streams), n_units)
    codes[rng.random(len(codes)) < 0.1] = 0  # some (unit, stream) pairs get 2+ contributions
    perm = rng.permutation(len(rows))
    rows, codes, values = rows[perm], codes[perm], rng.normal(size=(len(rows), 4))
    names = [f"stream-{j}" for j in range(n_streams)]
    bounds = UnitBounds(max_streams_per_step=3, max_contributions_per_step=1, max_steps=10)
    timings = {}
    for label, streams, stream_names in (("indices", codes, names), ("ids", np.array(names, object)[codes], None)):
        for _ in range(2):  # the second run: allocations warm
            wall, cpu = time.perf_counter(), time.process_time()
            out = bound_block(UnitLedger.empty(bounds), 1, rows, streams, values, bounds, keys, clip_bound=R,
                              stream_names=stream_names)
            timings[label] = f"{time.perf_counter() - wall:.3f} s ({time.process_time() - cpu:.3f} s CPU)"
        assert len(out.units) == 3 * n_units and len(out.ledger) == n_units
    print(f"\nunit_hash of {n_units:,} ids: {hashing:.3f} s; bound_block of {len(rows):,} rows "
          f"({n_units:,} units x {n_streams} streams): {timings['indices']} with stream indices, "
          f"{timings['ids']} with stream ids")
