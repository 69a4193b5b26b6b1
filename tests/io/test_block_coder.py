"""``BlockCoder`` (``beam_dp.io.coders``): array blocks keep pickle on the wire and get a size estimate from
their arrays, so Beam's element-size sampling never pickles a block only to measure it."""

from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

import beam_dp.io.coders as coders
from beam_dp.beam.shell.combine import MergeClippedSums
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.release_batch import ReleaseBatch
from beam_dp.io import sinks, sources  # noqa: F401  (they register their types)
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock
from beam_dp.steps.events import EventBatch
from beam_dp.steps.schema import ReleaseColumns


def _columns(names, rng) -> ReleaseColumns:
    batch = ReleaseBatch(names, 3, "blt", rng.normal(size=(len(names), 8)), 0.5, 1e-7)
    return ReleaseColumns(batch, Guarantee(epsilon=1.0, delta=1e-6), 0, 1_000_000)


def _blocks():
    rng = np.random.default_rng(0)
    names = tuple(f"stream-{i:05d}" for i in range(2500))
    group = GroupBlock(names, rng.normal(size=(2500, 8)), np.ones(2500, np.int64), np.zeros(2500, np.int64))
    events = EventBatch(np.array(names * 4, dtype=object), rng.uniform(0, 100, 10_000), rng.normal(size=(10_000, 8)))
    table = pa.table({"stream": list(names), "value": rng.normal(size=2500)})
    return {"group block": group, "event batch": events, "table": table,
            "release columns": _columns(names, rng),
            "clipped sum": ClippedSum(np.ones(8), 3, 1)}


@pytest.mark.parametrize("name", list(_blocks()))
def test_the_estimate_is_the_pickled_size_within_a_factor_of_two(name):
    value = _blocks()[name]
    size = len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    assert size / 2 <= coders.estimated_bytes(value) <= 2 * size


@pytest.mark.parametrize("cls", [GroupBlock, EventBatch, pa.Table, ReleaseColumns, ClippedSum])
def test_registered_types_use_the_block_coder_and_size_without_pickling(cls, monkeypatch):
    coder = beam.coders.registry.get_coder(cls)
    assert isinstance(coder, coders.BlockCoder)
    value = next(v for v in _blocks().values() if type(v) is cls)
    encoded = coder.encode(value)
    assert encoded == pickle.dumps(value, pickle.HIGHEST_PROTOCOL)  # the wire bytes are the default coder's
    assert type(coder.decode(encoded)) is cls
    monkeypatch.setattr(coders, "_dumps", lambda _: pytest.fail("sized by pickling"))
    assert coders.BlockCoder().get_impl().estimate_size(value) > 0


def test_the_combiners_accumulators_use_the_block_coder():
    assert isinstance(MergeClippedSums().get_accumulator_coder(), coders.BlockCoder)
