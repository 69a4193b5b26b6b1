"""Count steps fed blocks of rows (issue 26.3): a block split across steps releases what one row at a time
releases, the mechanism state is decoded once per block, and the bundle's blocks keep arrival order."""

from __future__ import annotations

import json

import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow

from beam_dp.beam.shell.blocks import BundleBlocks
from beam_dp.core import NoiseSource
from beam_dp.mechanisms.erm import ContinualReleaseMechanism, LabelledRows, SoftmaxRegression
from beam_dp.steps.driver import RELEASE, ListBuffer, StepDriver
from beam_dp.steps.policies import BlockPolicy, split_rows

KEY = bytes(range(32))


def _mechanism() -> ContinualReleaseMechanism:
    model = SoftmaxRegression(n_features=2, clip_bound=1.0, n_classes=3, labels=("a", "b", "c"))
    return ContinualReleaseMechanism(model=model, lam=1.0, epsilon=1.0, update=2, base=4)


def _rows(n: int, seed: int = 0) -> LabelledRows:
    rng = np.random.default_rng(seed)
    return LabelledRows(rng.normal(size=(n, 2)) / 2, rng.integers(0, 3, n))


def _feed(sizes: list[int], rows: LabelledRows, counter: list | None = None):
    """Feed ``rows`` cut into blocks of ``sizes`` rows; returns (releases, final key state, buffer)."""
    mech = _mechanism()
    if counter is not None:
        decode = mech.decode_state
        mech.decode_state = lambda data: (counter.append(1), decode(data))[1]
    driver = StepDriver(BlockPolicy(mech, NoiseSource(KEY)), block_size=2)
    state, buffer, out, lo = driver.open("s"), ListBuffer(), [], 0
    for size in sizes:
        out += driver.add(state, buffer, None, LabelledRows(rows.features[lo:lo + size], rows.labels[lo:lo + size]))
        lo += size
    return [o.value for o in out if o.tag == RELEASE], state, buffer


def test_a_block_split_across_count_steps_releases_what_single_rows_release():
    rows = _rows(11)
    single, s1, b1 = _feed([1] * 11, rows)
    blocks, s2, b2 = _feed([3, 1, 5, 2], rows)
    assert len(single) == 4  # steps 2..5 release (the base at t = B = 4 rows, then every 2 rows)
    assert [(r.stream, r.step) for r in blocks] == [(r.stream, r.step) for r in single]
    for a, b in zip(blocks, single):
        # the same rows in the same order reach the same code: equal up to float reordering (none expected)
        np.testing.assert_allclose(a.value, b.value, rtol=1e-12, atol=1e-15)
        assert a.epsilon_spent == b.epsilon_spent
    assert (s2.next_step, s2.buffered) == (s1.next_step, s1.buffered) == (6, 1)
    (step, left), = b2.read()  # the block's tail waits in the buffer: the 11th row
    assert step == 6 and np.array_equal(left.features, rows.features[10:])


def test_the_mechanism_state_is_decoded_once_per_block():
    calls: list = []
    _feed([11], _rows(11), calls)
    assert len(calls) == 1  # five steps closed by one block: one decode (the per-row path: one per step)


def test_split_rows_cuts_rows_and_refuses_a_sum():
    head, tail = split_rows(_rows(5), 2)
    assert (len(head), len(tail)) == (2, 3)
    from beam_dp.mechanisms.base import ClippedSum

    with pytest.raises(TypeError, match="not a block of rows"):
        split_rows(ClippedSum(np.zeros(2), 3, 0), 1)


def test_bundle_blocks_keep_arrival_order_per_stream_and_cap_their_size():
    from apache_beam.pvalue import TaggedOutput

    def make(stream, rows, originals):  # the block, and a letter for each odd row (a block-wide check)
        return [TaggedOutput("dead", o) for o in originals if o[1] % 2] + [(stream, (None, list(rows), tuple(originals)))]

    blocks = BundleBlocks(make, max_rows=3)
    window, full = GlobalWindow(), []
    for i, stream in enumerate("abaabaa"):
        full += blocks.add(stream, i, ("el", i), None, window)
    assert full[-1] == ("a", (None, [0, 2, 3], (("el", 0), ("el", 2), ("el", 3))))
    assert [o.value for o in full[:-1]] == [("el", 3)]
    rest = list(blocks.flush())
    assert {wv.value[0]: wv.value[1] for wv in rest if not isinstance(wv, TaggedOutput)} == {
        "a": (None, [5, 6], (("el", 5), ("el", 6))), "b": (None, [1, 4], (("el", 1), ("el", 4)))}
    letters = [o for o in rest if isinstance(o, TaggedOutput)]  # tagged letters leave windowed too
    assert sorted(o.value.value for o in letters) == [("el", 1), ("el", 5)] and letters[0].value.windows == (window,)
    assert list(blocks.flush()) == []  # a flushed bundle holds nothing


def test_record_rows_feed_an_online_learner_one_record_per_step():
    from beam_dp.beam import OnlineLearnerParams
    from beam_dp.steps.policies import RecordRows

    mech = OnlineLearnerParams(dim=3, constraint="l2_ball", epsilon=1.0, window=4).build_mechanism()
    rng = np.random.default_rng(1)
    records = [mech.record(rng.normal(size=3) / 3, float(rng.choice([-1, 1]))) for _ in range(9)]

    def run(sizes):
        driver = StepDriver(BlockPolicy(mech, NoiseSource(KEY)), block_size=1)
        state, buffer, out, lo = driver.open("s"), ListBuffer(), [], 0
        for size in sizes:
            part = records[lo:lo + size]
            item = part[0] if size == 1 else RecordRows(np.stack([r.a for r in part]), np.array([r.b for r in part]))
            out += driver.add(state, buffer, None, item)
            lo += size
        return [o.value for o in out if o.tag == RELEASE], state

    single, s1 = run([1] * 9)
    blocks, s2 = run([4, 2, 3])
    assert len(single) == 9 and [r.step for r in blocks] == [r.step for r in single]
    for a, b in zip(blocks, single):  # the same records reach the same step code: equal to rounding (none expected)
        np.testing.assert_allclose(a.value, b.value, rtol=1e-12, atol=1e-15)
    assert s1.next_step == s2.next_step == 10 and np.array_equal(s1.mechanism, s2.mechanism)


def test_a_block_of_records_is_placed_in_the_universe_as_one_at_a_time():
    from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe

    universe = Universe([Categorical("colour", ("red", "blue")), Bucketed("size", (0, 1, 5))])
    records = [{"colour": "blue", "size": 3.0}, ("red", 0.5), {"colour": "green", "size": 1}, "red",
               {"colour": "red", "size": 7}, ("blue", 4.99)]
    index, reasons = universe.encode_records(records)
    assert reasons.tolist() == ["", "", "outside_universe", "malformed", "outside_universe", ""]
    for i, record in enumerate(records):  # the vectorised pass agrees with encode_one, record by record
        if reasons[i]:
            with pytest.raises(ValueError, match=reasons[i]):
                universe.encode_one(record)
        else:
            assert index[i] == universe.encode_one(record)
    assert index[[0, 1, 5]].tolist() == [3, 0, 3]  # (colour, size bucket) -> colour * 2 + bucket


def test_a_letter_for_a_whole_block_is_one_letter_per_element():
    from beam_dp.beam.shell.blocks import BlockOriginals
    from beam_dp.steps.events import DeadLetter

    letter = DeadLetter("late", "step 3 was already absorbed", "s", BlockOriginals([("s", 1.0, "x"), ("s", 2.0, "y")]))
    letters = letter.element.letters(letter)
    assert [(x.reason, x.detail, x.stream, x.element) for x in letters] == [
        ("late", "step 3 was already absorbed", "s", ("s", 1.0, "x")),
        ("late", "step 3 was already absorbed", "s", ("s", 2.0, "y"))]


def test_a_block_of_records_draws_its_noise_ahead_and_releases_what_records_one_by_one_release(monkeypatch):
    """The driver's count path begins the policy's context once per block (``StepsAhead``, here 5 steps a
    draw so that a block crosses refills): the releases are those of ``mechanism.step`` per record on the
    plain noise source; a step the mechanism refuses ends the stream there, as record by record."""
    from beam_dp.beam import OnlineLearnerParams
    from beam_dp.steps.events import DEAD_LETTER, Reason
    from beam_dp.steps.policies import RecordRows
    from tests.release_checks import assert_close_values

    monkeypatch.setattr(BlockPolicy, "AHEAD", 5)
    mech = OnlineLearnerParams(dim=3, constraint="l2_ball", epsilon=1.0, window=4).build_mechanism()
    rng = np.random.default_rng(2)
    records = [mech.record(rng.normal(size=3) / 2, float(rng.choice([-1, 1]))) for _ in range(23)]
    state, direct = mech.init_state("s"), []
    for rec in records:
        state, releases = mech.step(state, rec, NoiseSource(KEY))
        direct += releases

    def run(sizes, refuse_at=None):
        step = mech.step

        def refusing(s, block, noise):  # a public end reached at step refuse_at (as a horizon would)
            if s.t + 1 == refuse_at:
                raise ValueError("the end")
            return step(s, block, noise)

        monkeypatch.setattr(mech, "step", refusing)
        driver = StepDriver(BlockPolicy(mech, NoiseSource(KEY)), block_size=1)
        key, buffer, out, lo = driver.open("s"), ListBuffer(), [], 0
        for size in sizes:
            part = records[lo:lo + size]
            out += driver.add(key, buffer, None, RecordRows(np.stack([r.a for r in part]), np.array([r.b for r in part])))
            lo += size
        monkeypatch.setattr(mech, "step", step)
        return ([o.value for o in out if o.tag == RELEASE],
                [(o.value.reason, o.value.element) for o in out if o.tag == DEAD_LETTER])

    blocks, letters = run([17, 6])
    assert [r.step for r in blocks] == [r.step for r in direct] and not letters
    for a, b in zip(blocks, direct):
        np.testing.assert_allclose(a.value, b.value["x"], rtol=1e-13, atol=1e-13)
        assert_close_values((a.epsilon_spent, json.loads(a.meta)), (b.epsilon_spent, b.meta), rtol=1e-13, atol=1e-13)
    ended, ended_letters = run([17, 6], refuse_at=9)
    single, single_letters = run([1] * 23, refuse_at=9)
    assert [r.step for r in ended] == [r.step for r in single] == list(range(1, 9))
    np.testing.assert_allclose([r.value for r in ended], [r.value for r in single], rtol=1e-13, atol=1e-13)
    assert [reason for reason, _ in ended_letters] == [Reason.STREAM_ENDED] * 2
    assert [reason for reason, _ in single_letters] == [Reason.STREAM_ENDED] * 15
