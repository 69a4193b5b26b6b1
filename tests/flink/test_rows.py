"""The Flink job's JSON release rows (beam_dp.flink.rows): per group step, the same text as labelling and
encoding each row on its own. Runs in either venv (no PyFlink)."""

from __future__ import annotations

import json

import numpy as np

from beam_dp.core.budget import composition_of
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.flink.rows import json_rows
from beam_dp.mechanisms.sums import BLTSum
from beam_dp.steps.schema import ReleaseColumns, ReleaseLabels, release_to_row


def _slow(value: ReleaseColumns, labels: ReleaseLabels) -> list[str]:
    return [json.dumps(labels(row)._asdict(), sort_keys=True) for row in value.rows()]


def test_a_group_step_encodes_exactly_as_each_labelled_row():
    """Exact string equality: both sides encode the same Python floats with json's repr (exact by
    construction); the streams include JSON escapes and a '%' (the template's own syntax)."""
    mechanism = BLTSum(horizon=8, dim=3, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian")
    labels = ReleaseLabels("sums-%s", composition_of(mechanism))
    streams = ("a", 'b"q', "c\\d", "ü%s", "e\n")
    values = np.random.default_rng(3).normal(0, 10, (len(streams), 3))
    for meta, name in (({"rung": 2, "note": "50%"}, None), ({}, "sum")):
        batch = ReleaseBatch(streams, 4, mechanism.name, values, 0.5, 1e-7, meta, value_name=name, noise="gaussian")
        columns = ReleaseColumns(batch, mechanism.guarantee, 40_000_000, 50_000_000)
        got = json_rows(columns, labels)
        assert got == _slow(columns, labels)
        assert [json.loads(g)["stream"] for g in got] == list(streams)


def test_one_row_and_an_empty_group():
    mechanism = BLTSum(horizon=8, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian")
    labels = ReleaseLabels("d", composition_of(mechanism))
    batch = ReleaseBatch(("a",), 1, mechanism.name, np.ones((1, 2)), 0.1, 0.0, {})
    row = release_to_row(batch.rows()[0], mechanism.guarantee)
    assert json_rows(row, labels) == [json.dumps(labels(row)._asdict(), sort_keys=True)]
    empty = ReleaseBatch((), 1, mechanism.name, np.zeros((0, 2)), 0.1, 0.0, {})
    assert json_rows(ReleaseColumns(empty, mechanism.guarantee, None, None), labels) == []
