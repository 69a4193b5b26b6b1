"""Release schema, Parquet/JSONL sinks and the reader round-trip."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_dp.core import Guarantee, Release
from beam_dp.io import (
    RELEASE_SCHEMA,
    WriteReleasesToJsonLines,
    WriteReleasesToParquet,
    read_releases,
    release_to_row,
    row_to_release,
)
from tests.beam.helpers import batch_options

pytestmark = pytest.mark.pipeline

GUARANTEE = Guarantee(epsilon=1.0, window=8, window_requested=5)


def _releases():
    rng = np.random.default_rng(0)
    out = [Release(f"s{i % 2}", i, "window_tree", rng.normal(size=3), 0.5, 0.0, {"noise": "gamma", "noisy_nodes": 2})
           for i in range(1, 7)]
    out.append(Release("m", 1, "model", {"weights": rng.normal(size=(2, 3)), "bias": np.array([0.5])}, 1.0, 1e-6,
                       {"certified": True}))
    return out


@pytest.mark.parametrize("sink,suffix", [(WriteReleasesToParquet, ".parquet"), (WriteReleasesToJsonLines, ".jsonl")])
def test_sink_and_reader_round_trip(tmp_path, sink, suffix):
    releases = _releases()
    rows = [release_to_row(r, GUARANTEE, 1_000_000 * r.step, 1_000_000 * (r.step + 1)) for r in releases]
    with beam.Pipeline(options=batch_options()) as p:
        p | beam.Create(rows) | sink(str(tmp_path / "rel"))
    files = list(tmp_path.glob(f"rel-*{suffix}"))
    assert files
    if suffix == ".parquet":
        assert pq.read_schema(files[0]).remove_metadata().equals(RELEASE_SCHEMA)
    back = read_releases(str(tmp_path / "rel-*"))
    assert len(back) == len(releases)
    by_key = {(r["stream"], r["step"]): r for r in back}
    for release in releases:
        row = by_key[(release.stream, release.step)]
        assert row_to_release(row) == release
        assert row["window"] == 8 and row["epsilon_budget"] == 1.0
        assert row["step_start"] == 1_000_000 * release.step


def test_release_row_of_mapping_value_lists_parts():
    row = release_to_row(_releases()[-1], GUARANTEE)
    assert row.parts == '[["bias", [1]], ["weights", [2, 3]]]' and len(row.value) == 7 and row.shape == []


def test_read_releases_without_files_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_releases(str(tmp_path / "nothing-*"))
