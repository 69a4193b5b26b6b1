"""The release stage of a bounded input (``beam_dp.beam.shell.batch_release``): a key's items in one call after a
``GroupByKey`` (or the per-key combine of the sums) release exactly what the stateful shell releases with
its one timer at the public end, on the same keyed input, and the pipelines say which shell they use."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams
from beam_dp.beam.shell.batch_release import KeyReleaseDoFn, release_stage
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import StepClock
from beam_dp.mechanisms.base import ClippedSum
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key
from beam_dp.steps.driver import CARRIED
from beam_dp.steps.params import NoiseKey
from tests.beam.helpers import batch_options

CLOCK = StepClock(start=1000.0, period=10.0, end=1120.0)  # 12 steps


def _sum_items(rng, streams=("a", "b", "c")):
    """Keyed items as the parse stage sends them: per stream a few steps' clipped sums, a step past the
    public end (never released), and a declaration of a stream with no data."""
    items = [(s, (int(step), ClippedSum(rng.normal(size=2) * 0.1, 1, 0), None))
             for s in streams for step in rng.choice(np.arange(1, 13), 5, replace=False)]
    items.append(("a", (14, ClippedSum(np.ones(2), 1, 0), "past the end")))
    items.append(("quiet", (0, None, None)))
    return items


def _group_items(rng):
    names = [f"s{i}" for i in range(6)]
    items = []
    for step in (1, 3, 4, 9):
        chosen = tuple(sorted(rng.choice(names, 3, replace=False).tolist()))
        items.append((group_key(0), (step, GroupBlock(chosen, rng.normal(size=(3, 2)) * 0.1, np.ones(3, np.int64),
                                                      np.zeros(3, np.int64)), None)))
    items.append((group_key(0), (CARRIED, GroupBlock.declaring(["declared"], 2), None)))
    return items


def _cells(release):
    if hasattr(release, "batch"):  # a group's ReleaseColumns
        return [(s, int(release.batch.step), np.round(v, 9).tolist()) for s, v in
                zip(release.batch.streams, np.asarray(release.batch.values))]
    return [(release.stream, int(release.step), np.round(np.asarray(release.value, dtype=float), 9).tolist())]


def _collect(params, items, dofn, out_dir):
    """Sorted (stream, step, value) of every release and (reason, stream) of every dead letter of one run."""
    with beam.Pipeline(options=batch_options()) as p:
        keyed = p | beam.Create(items)
        if dofn is KeyReleaseDoFn:
            out = release_stage(keyed, params, "Release", bounded=True)
        else:
            out = keyed | beam.ParDo(ContinualReleaseDoFn(params, per_step_timers=False)).with_outputs(
                "dead_letter", main="rows")
        _ = out.rows | "Cells" >> beam.FlatMap(_cells) | "Rows" >> beam.Map(json.dumps) | "WriteRows" >> (
            beam.io.WriteToText(str(out_dir / "rows")))
        _ = (out["dead_letter"] | "Reasons" >> beam.Map(lambda letter: json.dumps([letter.reason, letter.stream]))
             | "WriteLetters" >> beam.io.WriteToText(str(out_dir / "letters")))

    def read(prefix):
        return sorted(tuple(json.loads(line)) if prefix == "letters" else _as_cell(json.loads(line))
                      for path in out_dir.glob(f"{prefix}*") for line in path.read_text().splitlines())
    return read("rows"), read("letters")


def _as_cell(row):
    return row[0], row[1], tuple(row[2])


@pytest.mark.parametrize("grouped", [False, True])
def test_a_key_in_one_call_releases_what_the_stateful_shell_releases(grouped, tmp_path):
    rng = np.random.default_rng(7)
    params = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, clock=CLOCK, noise_key=NoiseKey(domain="shells"),
                                stream_groups=1 if grouped else None)
    items = _group_items(rng) if grouped else _sum_items(rng)
    (tmp_path / "key").mkdir()
    (tmp_path / "stateful").mkdir()
    rows, letters = _collect(params, items, KeyReleaseDoFn, tmp_path / "key")
    want_rows, want_letters = _collect(params, items, ContinualReleaseDoFn, tmp_path / "stateful")
    assert rows == want_rows and letters == want_letters
    streams = {s for s, _, _ in rows}
    assert len(rows) == 12 * len(streams)  # every stream at every public step, the step past the end never
    if grouped:
        assert "declared" in streams
    else:
        assert "quiet" in streams


def _transforms(pipeline) -> set[str]:
    names = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            fn = getattr(node.transform, "fn", None)
            names.add(type(getattr(fn, "fn", fn)).__name__ if fn is not None else type(node.transform).__name__)

    pipeline.visit(Visitor())
    return names


def test_a_bounded_replay_uses_the_key_shell_and_a_stream_the_stateful_one():
    params = ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=CLOCK, stream_groups=4)
    from beam_dp.beam import ContinualSum

    bounded = beam.Pipeline(options=batch_options())
    _ = bounded | beam.Create([("a", 1001.0, [0.5])]) | ContinualSum(params)
    names = _transforms(bounded)
    assert "KeyReleaseDoFn" in names and "ContinualReleaseDoFn" not in names

    from apache_beam.testing.test_stream import TestStream

    from tests.beam.helpers import streaming_options

    unbounded = beam.Pipeline(options=streaming_options())
    _ = unbounded | TestStream().add_elements([("a", 1001.0, [0.5])]) | ContinualSum(params)
    names = _transforms(unbounded)
    assert "ContinualReleaseDoFn" in names and "KeyReleaseDoFn" not in names


@pytest.mark.parametrize("shell", [KeyReleaseDoFn, ContinualReleaseDoFn])
def test_a_restored_snapshot_this_version_cannot_read_ends_its_stream_with_one_letter(shell, tmp_path):
    """A replay whose restored state for ``a`` is not a state (corrupt bytes): ``a`` ends with one
    ``unreadable_state`` letter and its items are dead-lettered ``stream_ended`` (no crash, no release);
    ``b`` releases every step. In both shells (the stateful one used to fail the pipeline here)."""
    params = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, clock=CLOCK, noise_key=NoiseKey(domain="shells"),
                                restore_states=(("a", b"not a beam_dp state"),))
    items = [("a", (3, ClippedSum(np.ones(2) * 0.1, 1, 0), "raw a")), ("b", (3, ClippedSum(np.ones(2) * 0.1, 1, 0), None))]
    rows, letters = _collect(params, items, shell, tmp_path)
    assert {s for s, _, _ in rows} == {"b"} and len(rows) == 12
    assert sorted(letters) == [("stream_ended", "a"), ("unreadable_state", "a")]
