"""Pub/Sub output: one JSON message per release with the id attribute ``<stream>/<step>`` (the same on
every retry, replay or restore, so a reader can deduplicate), translated offline (never published)."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from beam_dp.core.guarantee import Guarantee
from beam_dp.core.release import Release
from beam_dp.io.sinks import RELEASE_ID, WriteReleasesToPubSub, release_message
from beam_dp.steps.schema import release_to_row


def _row(stream="s/1", step=7):
    release = Release(stream, step, "tree", np.array([0.5]), 0.25, 0.0, {})
    return release_to_row(release, Guarantee(epsilon=1.0), 60_000_000, 70_000_000)


def test_a_release_message_is_the_row_as_json_with_its_stream_step_id():
    row = _row()
    message = release_message(row)
    assert message.attributes == {RELEASE_ID: "s/1/7"}  # stream "s/1", step 7
    assert json.loads(message.data) == json.loads(json.dumps(row._asdict()))
    assert release_message(_row()).attributes == message.attributes  # a replay: the same id
    assert release_message(row, "rid").attributes == {"rid": "s/1/7"}


def test_the_sink_publishes_with_attributes():
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True))
    _ = pipeline | beam.Create([_row()]) | WriteReleasesToPubSub("projects/my-project/topics/releases")
    leaves = {t.unique_name for t in pipeline.to_runner_api().components.transforms.values() if not t.subtransforms}
    assert any(name.startswith("WriteReleasesToPubSub/Publish/") for name in leaves)
    assert any(name.startswith("WriteReleasesToPubSub/ToMessage") for name in leaves)
