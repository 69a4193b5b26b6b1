"""The per-record families' unit stage: at most k records per unit, the id hashed and dropped."""

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_dp.beam.shell.unit_records import BoundUnitRecords, RecordUnit
from beam_dp.steps.events import Reason
from beam_dp.steps.params import NoiseKey


def test_each_unit_keeps_at_most_k_records_and_loses_its_id():
    records = [("s", float(i), "ann") for i in range(5)] + [("s", 9.0, "bob")] + [("t", 1.0, "cat")] * 3
    with beam.Pipeline() as pipeline:
        kept, dead = pipeline | beam.Create(records) | BoundUnitRecords(RecordUnit("user", 2), NoiseKey())
        assert_that(kept | beam.Map(len), equal_to([2] * 5), label="ids stripped")
        assert_that(kept | beam.Map(lambda r: r[0]) | beam.combiners.Count.PerElement(),
                    equal_to([("s", 3), ("t", 2)]), label="at most 2 per unit")
        assert_that(dead, equal_to([]), label="no dead letters")


def test_mappings_keep_their_timestamps_and_bad_ids_are_dead_letters_without_the_id():
    records = [{"stream_id": "s", "x": 1.0, "user": "ann"}, {"stream_id": "s", "x": 2.0, "user": ""},
               {"stream_id": "s", "x": 3.0, "user": 7}, {"stream_id": "s", "x": 4.0}]
    with beam.Pipeline() as pipeline:
        stamped = pipeline | beam.Create(records) | beam.Map(
            lambda r: beam.window.TimestampedValue(r, 100.0 + r["x"]))
        kept, dead = stamped | BoundUnitRecords(RecordUnit("user", 5), NoiseKey())
        assert_that(kept | beam.Map(lambda r, t=beam.DoFn.TimestampParam: (sorted(r), float(t))),
                    equal_to([(["stream_id", "x"], 101.0)]), label="kept, own timestamp")
        assert_that(dead | beam.Map(lambda d: (d.reason, d.element.get("user"), "ann" in repr(d))),
                    equal_to([(Reason.BAD_UNIT_ID, None, False)] * 3), label="dead letters")


@pytest.mark.parametrize("column,k", [("", 1), ("1user", 1), ("user", 0), ("user", 1.5), ("user", True)])
def test_bad_units_are_refused(column, k):
    with pytest.raises(ValueError):
        RecordUnit(column, k)


def test_a_streaming_job_keeps_the_first_k_records_of_a_unit_by_arrival():
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue

    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    events = (TestStream().add_elements([TimestampedValue(("s", 1.0, "ann"), 10)])
              .advance_watermark_to(50).add_elements([TimestampedValue(("s", 2.0, "ann"), 60),
                                                      TimestampedValue(("s", 3.0, "bob"), 61)])
              .advance_watermark_to(100).add_elements([TimestampedValue(("s", 4.0, "ann"), 110)])
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=options) as pipeline:
        kept, _ = pipeline | events | BoundUnitRecords(RecordUnit("user", 2), NoiseKey())
        assert_that(kept | beam.Map(lambda r, t=beam.DoFn.TimestampParam: (r[1], float(t))),
                    equal_to([(1.0, 10.0), (2.0, 60.0), (3.0, 61.0)]), label="ann's third is dropped")
