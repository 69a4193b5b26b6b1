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


def _release_columns(steps: int = 3, streams: int = 50) -> list:
    from beam_dp.core.guarantee import Guarantee as G
    from beam_dp.core.release_batch import ReleaseBatch
    from beam_dp.steps.schema import ReleaseColumns

    rng = np.random.default_rng(1)
    names = tuple(f"u{i:03d}" for i in range(streams))
    return [ReleaseColumns(ReleaseBatch(names, t, "blt", rng.normal(size=(streams, 4)), 0.25 * t, 1e-7,
                                        {"noise_std": 2.0 + t}), G(epsilon=1.0, delta=1e-6), t * 1_000_000,
                           (t + 1) * 1_000_000) for t in range(1, steps + 1)]


def test_columnar_parquet_sink_skips_the_dictionary_of_values_only(tmp_path):
    """Release columns are written whole with :data:`RELEASE_SCHEMA` (lists named ``item``, as Beam's
    Parquet sink names them); every column but ``value`` is dictionary-encoded, ``value`` (noisy doubles,
    never repeating) plain, and reading the file back gives the releases."""
    from beam_dp.io import DICTIONARY_COLUMNS

    parts = _release_columns()
    with beam.Pipeline(options=batch_options()) as p:
        p | beam.Create(parts) | WriteReleasesToParquet(str(tmp_path / "rel"), columnar=True)
    (path,) = tmp_path.glob("rel-*.parquet")
    assert pq.read_schema(path).remove_metadata().equals(RELEASE_SCHEMA)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings.pop("value.list.item")
    assert sorted(encodings) == sorted(DICTIONARY_COLUMNS)
    assert all("RLE_DICTIONARY" in encodings[name] for name in DICTIONARY_COLUMNS)
    back = read_releases(str(tmp_path / "rel-*"))
    assert len(back) == 150 and {r["step"] for r in back} == {1, 2, 3}
    expected = {(name, part.batch.step): row for part in parts for name, row in zip(part.batch.streams,
                                                                                      part.batch.values)}
    for row in back:
        np.testing.assert_allclose(row["value"], expected[(row["stream"], row["step"])], rtol=0, atol=0)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_release_tables_with_dictionary_text(tmp_path, suffix):
    """``iter_release_tables(..., dictionary_text=True)`` types the text columns as dictionaries (Parquet
    and JSON lines alike) with the same values, and the verifier's verdict on them is the plain one."""
    import pyarrow as pa

    from beam_dp.io import iter_release_tables
    from beam_dp.verify import VERIFIED_COLUMNS, verify_job

    sink = WriteReleasesToParquet if suffix == ".parquet" else WriteReleasesToJsonLines
    with beam.Pipeline(options=batch_options()) as p:
        p | beam.Create(_release_columns()) | sink(str(tmp_path / "rel"), columnar=True)
    pattern = str(tmp_path / f"rel-*{suffix}")
    plain = pa.concat_tables(iter_release_tables(pattern, VERIFIED_COLUMNS))
    coded = pa.concat_tables(iter_release_tables(pattern, VERIFIED_COLUMNS, dictionary_text=True))
    text = [f.name for f in plain.schema if pa.types.is_string(f.type)]
    assert text and all(pa.types.is_dictionary(coded.schema.field(name).type) for name in text)
    assert coded.cast(plain.schema).equals(plain)
    assert verify_job(iter_release_tables(pattern, VERIFIED_COLUMNS, dictionary_text=True)) == verify_job(plain)


def test_the_columnar_sink_names_shards_per_window_on_an_unbounded_input(monkeypatch):
    """As Beam's ``WriteToParquetBatched`` does: the windowed shard template on an unbounded (windowed)
    input, Beam's default on a bounded one."""
    from apache_beam.io import filebasedsink
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import FixedWindows

    from beam_dp.io import sinks

    seen = {}
    original = sinks._ReleaseTableSink.__init__

    def recording(self, prefix, num_shards, windowed=False):
        original(self, prefix, num_shards, windowed)
        seen[windowed] = self.shard_name_template

    monkeypatch.setattr(sinks._ReleaseTableSink, "__init__", recording)
    bounded, unbounded = beam.Pipeline(), beam.Pipeline()
    bounded | beam.Create(_release_columns()) | WriteReleasesToParquet("/tmp/unused/rel", columnar=True)
    (unbounded | TestStream().add_elements(_release_columns()) | beam.WindowInto(FixedWindows(60))
     | WriteReleasesToParquet("/tmp/unused/rel", columnar=True))
    assert seen == {False: filebasedsink.DEFAULT_SHARD_NAME_TEMPLATE,
                    True: filebasedsink.DEFAULT_WINDOW_SHARD_NAME_TEMPLATE}
