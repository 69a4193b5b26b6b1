"""Submittable Flink job: continual private sums of CSV events, from files or Kafka.

    flink run --python beam_dp/flink/run.py --pyFiles . \\
        --input /data/events/ --output /data/releases/ --dead-letter /data/dead/ \\
        --start 1700000000 --period 60 --end 1700086400 --dim 2 --epsilon 1 --clip-bound 1

    python -m beam_dp.flink.run --input events.csv --output out/ --dead-letter dead/ ...   # local MiniCluster

Input lines are ``stream_id,timestamp_seconds,v0[,v1,...]`` (a line that does not parse is dead-lettered,
never fatal). Outputs are JSON lines: release rows (``beam_dp.io.ReleaseRow`` columns) and dead letters.
Files use PyFlink's built-in ``FileSource``/``FileSink``; ``--kafka-brokers`` with ``--kafka-topic`` and
``--kafka-output-topic`` read and write Kafka instead (needs the Kafka connector jar: ``--kafka-jar`` or
``flink run --jarfile``; see docs/running.md). A bounded file input is a replay (no finite watermark:
every step of the public schedule releases at the end); ``--streaming`` or Kafka follows the event-time
watermark. Checkpointing is on (every ``--checkpoint-ms``; the driver's state is Flink keyed state, and
the file sinks commit on checkpoints). The noise key is read on the workers from ``BEAM_DP_NOISE_KEY``
or ``--key-file``.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

from beam_dp.core.clock import StepClock
from beam_dp.mechanisms.counters import make_counter
from beam_dp.mechanisms.stream_groups import groups_for
from beam_dp.steps.params import NoiseKey

__all__ = ["main", "parse_line"]


def parse_line(line: str) -> tuple:
    """A CSV line -> ``(stream_id, seconds, value)``; what does not parse stays text (dead-lettered on the worker)."""
    parts = line.strip().split(",")
    stream = parts[0] if parts else ""
    try:
        seconds = float(parts[1])
    except (IndexError, ValueError):
        seconds = math.nan
    try:
        value = [float(x) for x in parts[2:]] or line
    except ValueError:
        value = line
    return stream, seconds, value


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", help="a file or directory of CSV event lines")
    p.add_argument("--output", help="directory for release rows (JSON lines)")
    p.add_argument("--dead-letter", help="directory for dead letters (JSON lines)")
    p.add_argument("--kafka-brokers")
    p.add_argument("--kafka-topic")
    p.add_argument("--kafka-output-topic")
    p.add_argument("--kafka-dead-letter-topic")
    p.add_argument("--kafka-jar", help="file:// URL of flink-sql-connector-kafka-*.jar")
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--period", type=float, required=True)
    p.add_argument("--end", type=float, default=None)
    p.add_argument("--allowed-lateness", type=float, default=0.0)
    p.add_argument("--streams", default=None, help="comma-separated declared streams")
    p.add_argument("--dim", type=int, default=1)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=0.0)
    p.add_argument("--clip-bound", type=float, default=1.0)
    p.add_argument("--noise", default="gamma", choices=["gamma", "gaussian"])
    p.add_argument("--counter", default="auto")
    p.add_argument("--stream-groups", type=int, default=4,
                   help="key by this many groups of streams where the counter steps groups (0: by stream)")
    p.add_argument("--key-file", default=None)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--streaming", action="store_true", help="STREAMING mode for a file input too")
    p.add_argument("--checkpoint-ms", type=int, default=60_000)
    p.add_argument("--max-delay-ms", type=int, default=0, help="bounded out-of-orderness of the watermark")
    p.add_argument("--idle-ms", type=int, default=None, help="mark a silent source split idle after this")
    args = p.parse_args(argv)
    if not args.kafka_brokers and not (args.input and args.output and args.dead_letter):
        p.error("give --input, --output and --dead-letter, or --kafka-brokers with the Kafka topics")
    if args.kafka_brokers and not (args.kafka_topic and args.kafka_output_topic and args.kafka_dead_letter_topic):
        p.error("Kafka needs --kafka-topic, --kafka-output-topic and --kafka-dead-letter-topic")
    if args.stream_groups < 0:
        p.error(f"--stream-groups must be >= 0, got {args.stream_groups}")
    return args


def _params(args: argparse.Namespace):
    from beam_dp.flink.params import FlinkReleaseParams

    clock = StepClock(start=args.start, period=args.period, end=args.end)
    build = functools.partial(make_counter, args.counter, public_end=clock.last_step, dim=args.dim,
                              epsilon=args.epsilon, delta=args.delta, clip_bound=args.clip_bound, noise=args.noise)
    streams = tuple(args.streams.split(",")) if args.streams else None
    return FlinkReleaseParams(build=build, clock=clock, streams=streams, allowed_lateness=args.allowed_lateness,
                              noise_key=NoiseKey(key_file=args.key_file) if args.key_file else NoiseKey(),
                              stream_groups=groups_for(build(), args.stream_groups))


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        params = _params(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from pyflink.common import Encoder, Types, WatermarkStrategy
    from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat

    from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream

    streaming = args.streaming or bool(args.kafka_brokers)
    env = local_environment(args.parallelism, replay=not streaming)
    env.enable_checkpointing(args.checkpoint_ms)  # also commits the file sinks' last part files at the end
    if args.kafka_brokers:
        from pyflink.common.serialization import SimpleStringSchema
        from pyflink.datastream.connectors.kafka import (KafkaOffsetsInitializer, KafkaRecordSerializationSchema,
                                                         KafkaSink, KafkaSource)

        if args.kafka_jar:
            env.add_jars(args.kafka_jar)
        source = (KafkaSource.builder().set_bootstrap_servers(args.kafka_brokers).set_topics(args.kafka_topic)
                  .set_group_id("beam_dp").set_starting_offsets(KafkaOffsetsInitializer.committed_offsets())
                  .set_value_only_deserializer(SimpleStringSchema()).build())
        lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "kafka-events")

        def sink(topic: str):
            return (KafkaSink.builder().set_bootstrap_servers(args.kafka_brokers).set_record_serializer(
                KafkaRecordSerializationSchema.builder().set_topic(topic)
                .set_value_serialization_schema(SimpleStringSchema()).build()).build())
        release_sink, dead_sink = sink(args.kafka_output_topic), sink(args.kafka_dead_letter_topic)
    else:
        source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), args.input).build()
        lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "event-files")
        release_sink = FileSink.for_row_format(args.output, Encoder.simple_string_encoder()).build()
        dead_sink = FileSink.for_row_format(args.dead_letter, Encoder.simple_string_encoder()).build()
    events = lines.filter(lambda line: bool(line.strip())).map(parse_line, output_type=EVENT_TYPE)
    releases, dead = release_stream(env, events, params, args.max_delay_ms, args.idle_ms)
    releases.sink_to(release_sink)
    dead.sink_to(dead_sink)
    env.execute("beam_dp continual sums")
    return 0


if __name__ == "__main__":
    sys.exit(main())
