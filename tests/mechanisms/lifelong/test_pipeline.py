"""``LifelongLearner`` on the FnApiRunner: releases equal the pure learner's under the same key; dead letters."""

import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam.lifelong import END_OF_TASK, LifelongLearner, LifelongParams
from beam_dp.core import NoiseSource
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.io import release_to_row
from beam_dp.io.schema import ReleaseLabels
from beam_dp.mechanisms.lifelong import AGEMConfig, BoundedAGEMConfig, L2DPConfig
from beam_dp.mechanisms.lifelong.factory import build_learner
from tests.beam.collect import run
from tests.conftest import TEST_KEY
from tests.mechanisms.lifelong.conftest import small_common


def _elements(tasks):
    out = [("s", "0", row, int(label)) for row, label in zip(tasks[0].x, tasks[0].y)]  # one row per element
    out += [("s", t.task_id, t.x[i: i + 50], t.y[i: i + 50]) for t in tasks[1:] for i in range(0, len(t), 50)]
    return out


BAD = [
    ("s", "9", np.zeros(64), 1),  # unknown task
    ("s", "1", np.zeros(10), 1),  # wrong shape
    ("s", "1", np.full(64, np.nan), 1),  # non-finite
    ("s", "1", np.zeros(64), 10),  # label out of range
    ("s", "1", np.zeros(64), 1.5),  # label not an integer
    ("", "1", np.zeros(64), 1),  # bad stream id
    ("s", "1"),  # malformed
]


DOMAIN = "LifelongLearner"  # the transform's noise domain: its default label


def _expected(config, tasks, params):
    learner = build_learner(config)
    state = learner.init_state("s")
    noise = NoiseSource(TEST_KEY).for_domain(DOMAIN, calibration_binding(params))
    labels = ReleaseLabels(DOMAIN, "approx")  # DP-SGD steps compose as (epsilon, delta); no job budget
    rows = []
    for task in tasks:
        state, releases = learner.step(state, learner.merge_blocks([task]), noise)
        rows += [labels(release_to_row(r, learner.guarantee)) for r in releases]
    return rows


@pytest.mark.parametrize("kind", ["l2dp", pytest.param("bounded", marks=pytest.mark.slow)])
def test_pipeline_matches_pure_learner(digits, kind):
    tasks, evals = digits
    common = small_common(evals, steps_per_task=3)
    config = (L2DPConfig(**common, epsilon=1.0) if kind == "l2dp"
              else BoundedAGEMConfig(**common, task_size=480, epsilon=1.0, memory_uses=3))
    params = LifelongParams(config, allow_cuda=False, torch_threads=1)
    elements = _elements(tasks) + BAD
    releases = run(lambda p: (p | beam.Create(elements, reshuffle=False) | LifelongLearner(params)).releases)
    expected = _expected(config, tasks, params)
    assert [(r.stream, r.step) for r in releases] == [("s", 1), ("s", 2), ("s", 3)]
    for got, want in zip(releases, expected):
        assert np.allclose(got.value, want.value, rtol=1e-12, atol=1e-12)
        assert got._replace(value=want.value) == want
        meta = json.loads(got.meta)
        assert set(meta["accuracy"]) == {str(i) for i in range(got.step)}
        assert got.parts and "enc.W" in got.parts
    if kind == "l2dp":
        assert all(json.loads(r.meta)["guarantee_basis"].startswith("paper_claim") for r in releases)


def test_pipeline_dead_letters(digits):
    tasks, _ = digits
    params = LifelongParams(L2DPConfig(**small_common(steps_per_task=1), epsilon=1.0), allow_cuda=False)
    letters = run(lambda p: (p | beam.Create(BAD) | LifelongLearner(params)).dead_letter)
    reasons = sorted(letter.reason for letter in letters)
    assert reasons == sorted(["unknown_task", "wrong_shape", "non_finite", "bad_label", "bad_label",
                              "bad_stream_id", "malformed"])
    assert all("nan" not in letter.detail.lower() for letter in letters)


def test_params_validation():
    with pytest.raises(ValueError):
        LifelongParams(AGEMConfig(**small_common()))  # not private
    with pytest.raises(ValueError):
        LifelongParams(L2DPConfig(**small_common(task_ids=None)))  # the task order must be declared
    with pytest.raises(TypeError):
        LifelongLearner(object())


def _parse_bundle(params, elements, max_rows=1024):
    """One bundle through the lifelong parse stage: its outputs in order (windowed values unwrapped)."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_dp.beam.lifelong import ParseTaskRows

    parse = ParseTaskRows(params)
    parse.MAX_ROWS = max_rows
    parse.setup()
    parse.start_bundle()
    out = [o for e in elements for o in parse.process(e, Timestamp(0), GlobalWindow())]
    out += list(parse.finish_bundle())
    return [o.value if isinstance(o, WindowedValue) else o for o in out]


def test_a_bundle_s_rows_leave_as_one_block_per_stream_and_task_and_a_marker_after_them():
    params = LifelongParams(L2DPConfig(**small_common(steps_per_task=1), epsilon=1.0), allow_cuda=False)
    rng = np.random.default_rng(0)
    rows = [(s, t, rng.uniform(-1, 1, 64), int(rng.integers(10))) for t in ("0", "1") for s in ("a", "b")
            for _ in range(5)]
    marker = ("a", "0", END_OF_TASK)
    out = _parse_bundle(params, rows[:5] + [marker] + rows[5:])
    assert [(stream, index, None if x is None else len(x)) for stream, (index, x, _, _) in out] == [
        ("a", 0, 5), ("a", 0, None), ("b", 0, 5), ("a", 1, 5), ("b", 1, 5)]  # the marker after a's rows
    (stream, (index, x, y, originals)) = out[0]
    assert np.array_equal(x, np.stack([r[2] for r in rows[:5]])) and list(y) == [r[3] for r in rows[:5]]
    assert tuple(originals) == tuple(rows[:5])  # each row's element, for a per-row dead letter later
    split = _parse_bundle(params, rows[:5], max_rows=2)  # full blocks leave at once, the rest at the end
    assert [len(x) for _, (_, x, _, _) in split] == [2, 2, 1]


def test_rows_after_their_task_closed_are_dead_lettered_one_per_row(digits):
    tasks, _ = digits
    params = LifelongParams(L2DPConfig(**small_common(steps_per_task=1), epsilon=1.0), allow_cuda=False)
    row = tasks[0].x[0]
    elements = [("s", "0", row, 1), ("s", "0", END_OF_TASK), ("s", "0", row, 2), ("s", "0", row, 3)]
    letters = run(lambda p: (p | beam.Create(elements, reshuffle=False) | LifelongLearner(params)).dead_letter)
    assert sorted((letter.reason, letter.element[3]) for letter in letters) == [
        ("task_backwards", 2), ("task_backwards", 3)]
