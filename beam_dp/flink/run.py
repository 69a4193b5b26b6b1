"""Submittable Flink job: continual private sums of CSV events, from files or Kafka.

    flink run --python beam_dp/flink/run.py --pyFiles . \\
        --input /data/events/ --output /data/releases/ --dead-letter-output /secure/dead/ \\
        --checkpoint-dir s3://bucket/checkpoints/ \\
        --start 1700000000 --period 60 --end 1700086400 --dim 2 --epsilon 1 --clip-bound 1

    python -m beam_dp.flink.run --input events.csv --output out/ ...   # local MiniCluster

Input lines are ``stream_id,timestamp_seconds,v0[,v1,...]`` (a line that does not parse is dead-lettered,
never fatal). Outputs are JSON lines: release rows (``beam_dp.io.ReleaseRow`` columns) under ``--output``,
which holds the private releases only, and dead letters (**raw data**: rejected lines with their values)
under ``--dead-letter-output``, default the sibling ``<output>.private``, never inside ``--output``.
Exact counts (input lines, dead letters per reason) are printed only with ``--print-exact-counts``,
marked NOT private. Files use PyFlink's built-in ``FileSource``/``FileSink``; ``--kafka-brokers`` with
``--kafka-topic``, ``--kafka-output-topic`` and ``--kafka-dead-letter-topic`` read and write Kafka
instead (needs the Kafka connector jar: ``--kafka-jar`` or ``flink run --jarfile``; see docs/running.md).
A bounded file input is a replay (no finite watermark: every step of the public schedule releases at
the end); ``--streaming`` or Kafka follows the event-time watermark. A replay of local files is read as
blocks (``--file-input blocks``, :mod:`beam_dp.flink.blocks`): byte-range splits parsed, validated and
summed per (stream group, step) in numpy, so one record per key and step reaches the keyed state, not
one per line (the same releases and the same dead-letter reasons); on files, each release record is a
key's step (its JSON rows joined by newlines), on Kafka one row. Checkpoints (every
``--checkpoint-ms``) go to ``--checkpoint-dir`` (default the sibling ``<output>.checkpoints``; they hold
un-noised sums: as private as the input) with the ``--state-backend`` (``rocksdb`` by default: state
beyond memory, incremental checkpoints); the file sinks commit on checkpoints. The release function's
noise domain is ``--noise-domain`` (default ``continual-sums``; one noise key per job, or a domain of
its own for each job under one key). The noise key is read on the workers from ``BEAM_DP_NOISE_KEY`` or
``--key-file``. With files, the job's manifest (``_beam_dp_manifest.json``: its release function, noise
domain, guarantee and release files) is written into ``--output`` before the job runs, so that
``python -m beam_dp.verify <output>`` checks the releases against it. A job started (a savepoint
resumed, or a run repeated) into an ``--output`` whose manifest declares other privacy parameters is
refused with one line, exit code 2 (:func:`resume_problem`): the noise is bound to the parameters.

With ``--privacy-unit NAME`` (and the ``continual_stats`` bounding flags, ``--max-unit-steps`` required) every
release protects one unit's whole bounded contribution: the lines are ``stream_id,timestamp,unit_id,v0,...``,
read line by line (:mod:`beam_dp.flink.units`; docs/privacy_units.md).

This job's noise is its own, not the Beam job's: its flags, budget share (``continual-sums`` of
``flag_budget``) and noise domain are its own, so its calibration binding, and so its releases, differ from
those of ``python -m pipelines.continual_stats`` on the same events and key. ``python -m pipelines.flink_job
--job continual_stats`` takes the Beam job's flags and params and releases the Beam job's noise; the other
families (model release, growing databases, online learning, lifelong) run there with their Beam job's flags.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import sys

from beam_dp.core.budget import composition_of, flag_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.noise import KEY_ENV_VAR, load_key
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.flink.blocks import SPLIT_BYTES, file_splits, parse_line
from beam_dp.io.locations import overlap_error
from beam_dp.io.manifest import JobManifest, ManifestTransform, write_manifest
from beam_dp.mechanisms.stream_groups import groups_for
from beam_dp.mechanisms.sums import make_counter
from beam_dp.steps.params import NoiseKey

__all__ = ["checkpoint_settings", "exact_counts", "kafka_lines", "main", "parse_line", "parse_unit_line",
           "private_default", "resume_problem"]


UID = "continual-sums"  # the release function's uid: its default noise domain
_STATE_BACKENDS = ("rocksdb", "hashmap")


def private_default(output: str) -> str:
    """The default raw-data location of ``output``: its sibling ``<output>.private`` (as the Beam jobs)."""
    return output.rstrip("/") + ".private"


def _uri(path: str) -> str:
    """A Flink filesystem URI: local paths become absolute ``file://`` URIs."""
    return path if "://" in path else "file://" + os.path.abspath(path)


#: the unit bounding flags (the continual_stats job's names): flag, default, what it bounds
_BOUNDING = (("--max-unit-steps", None, "the most steps a unit takes part in"),
             ("--min-separation", 1, "the fewest steps between two of a unit's steps"),
             ("--max-streams-per-step", 1, "the most streams a unit contributes to in one step"),
             ("--max-contributions-per-step", 1, "the most contributions of a unit summed per (stream, step)"))


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", help="a file or directory of CSV event lines")
    p.add_argument("--output", help="directory for the private release rows (JSON lines) only")
    p.add_argument("--dead-letter-output", default=None,
                   help="directory for dead letters: RAW DATA (rejected lines with their values); "
                        "default the sibling <output>.private; never inside --output")
    p.add_argument("--print-exact-counts", action="store_true",
                   help="print input lines and dead letters per reason at the end: NOT private (file input only)")
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
    p.add_argument("--calibration", default="analytic", choices=["analytic", "paper"],
                   help="Gaussian noise on the tree: the smallest exact sigma (default, as the Beam jobs) or the paper's")
    p.add_argument("--counter", default="auto")
    p.add_argument("--stream-groups", type=int, default=4,
                   help="key by this many groups of streams where the counter steps groups (0: by stream)")
    p.add_argument("--key-file", default=None)
    p.add_argument("--noise-domain", default=None,
                   help=f"the release function's noise domain (default {UID!r}): give each job under one key its own")
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--streaming", action="store_true", help="STREAMING mode for a file input too")
    p.add_argument("--file-input", default="blocks", choices=("blocks", "lines"),
                   help="a bounded replay of local files: blocks (default: byte-range splits parsed and summed per "
                        "key and step in numpy, beam_dp.flink.blocks) or lines (one Flink record per CSV line, "
                        "as --streaming and URIs other than file:// always are)")
    p.add_argument("--split-mib", type=int, default=SPLIT_BYTES >> 20,
                   help="MiB of input per split of the block input: each split is parsed in memory at once and "
                        "sends one record per key and step it touches")
    p.add_argument("--checkpoint-ms", type=int, default=60_000)
    p.add_argument("--checkpoint-dir", default=None,
                   help="durable checkpoint storage (a path or URI; shared storage on a cluster); default the "
                        "sibling <output>.checkpoints. Checkpoints hold un-noised state: keep them private")
    p.add_argument("--state-backend", default="rocksdb", choices=_STATE_BACKENDS,
                   help="rocksdb (default: state on local disk, incremental checkpoints) or hashmap (on the heap)")
    p.add_argument("--max-delay-ms", type=int, default=0, help="bounded out-of-orderness of the watermark")
    p.add_argument("--idle-ms", type=int, default=None, help="mark a silent source split idle after this")
    p.add_argument("--privacy-unit", default=None,
                   help="protect privacy units (users) named so in every release: the lines are "
                        "stream_id,timestamp,unit_id,v0[,v1,...] (docs/privacy_units.md); needs --max-unit-steps")
    for flag, default, what in _BOUNDING:
        p.add_argument(flag, type=int, default=default, help=f"{what} (with --privacy-unit)")
    args = p.parse_args(argv)
    given = [flag for flag, default, _ in _BOUNDING if getattr(args, _dest(flag)) != default]
    if args.privacy_unit is None and given:
        p.error(f"{', '.join(given)} bound privacy units: give --privacy-unit, or leave them out")
    if args.privacy_unit is not None and args.max_unit_steps is None:
        p.error("--privacy-unit needs --max-unit-steps (the most steps a unit takes part in)")
    if args.kafka_brokers:
        if not (args.kafka_topic and args.kafka_output_topic and args.kafka_dead_letter_topic):
            p.error("Kafka needs --kafka-topic, --kafka-output-topic and --kafka-dead-letter-topic")
        if args.kafka_dead_letter_topic in (args.kafka_output_topic, args.kafka_topic):
            p.error("--kafka-dead-letter-topic holds raw data: give it a topic of its own")
        if not args.checkpoint_dir:
            p.error("a Kafka job needs --checkpoint-dir (durable checkpoint storage)")
        if args.print_exact_counts:
            p.error("--print-exact-counts reads the dead-letter files: file input only")
    elif not (args.input and args.output):
        p.error("give --input and --output, or --kafka-brokers with the Kafka topics")
    else:
        args.dead_letter_output = args.dead_letter_output or private_default(args.output)
        args.checkpoint_dir = args.checkpoint_dir or args.output.rstrip("/") + ".checkpoints"
        for flag, path in (("--dead-letter-output", args.dead_letter_output), ("--checkpoint-dir", args.checkpoint_dir)):
            if nested := overlap_error([("--output", args.output), (flag, path)]):
                p.error(nested)
    if args.stream_groups < 0:
        p.error(f"--stream-groups must be >= 0, got {args.stream_groups}")
    if args.split_mib < 1:
        p.error(f"--split-mib must be >= 1, got {args.split_mib}")
    if args.checkpoint_ms < 10:
        p.error(f"--checkpoint-ms must be >= 10, got {args.checkpoint_ms}")
    return args


def _params(args: argparse.Namespace):
    """The job's params: its one release function calibrated to its share of ``--epsilon``/``--delta``
    (:func:`~beam_dp.core.budget.flag_budget`, the Beam jobs' rule: the same flags, the same calibration)."""
    from beam_dp.flink.params import FlinkReleaseParams

    clock = StepClock(start=args.start, period=args.period, end=args.end)
    share = flag_budget(args.epsilon, args.delta, args.noise, [UID])[UID]
    build = functools.partial(make_counter, args.counter, public_end=clock.last_step, dim=args.dim,
                              epsilon=share.epsilon, delta=share.delta, clip_bound=args.clip_bound, noise=args.noise,
                              calibration=args.calibration)
    streams = tuple(args.streams.split(",")) if args.streams else None
    secret = load_key(KEY_ENV_VAR, args.key_file)  # read at launch as the workers read it: an unusable key is exit 2
    key = NoiseKey(key_file=args.key_file) if args.key_file else NoiseKey()
    if args.noise_domain is not None:
        key = dataclasses.replace(key, domain=args.noise_domain)
    if args.privacy_unit is not None:
        if secret is None:
            raise ValueError("--privacy-unit needs the noise key (BEAM_DP_NOISE_KEY or --key-file): unit ids are "
                             "hashed with it on every worker, never with a random key")
        return _unit_params(args, clock, streams, key, share)
    return FlinkReleaseParams(build=build, clock=clock, streams=streams, allowed_lateness=args.allowed_lateness,
                              noise_key=key, budget=share, stream_groups=groups_for(build(), args.stream_groups),
                              step_records=not args.kafka_brokers)


def _unit_params(args: argparse.Namespace, clock: StepClock, streams, key: NoiseKey, share):
    """Unit-level sum params (the Beam params, calibrated on the unit's bounded contribution; keyed by stream)."""
    from beam_dp.beam.sums import ContinualSumParams
    from beam_dp.mechanisms.sums.unit_level import PrivacyUnit

    unit = PrivacyUnit(args.privacy_unit, args.max_streams_per_step, args.max_contributions_per_step,
                       args.max_unit_steps, args.min_separation)
    return ContinualSumParams(dim=args.dim, epsilon=share.epsilon, delta=share.delta, clip_bound=args.clip_bound,
                              noise=args.noise, calibration=args.calibration, counter=args.counter, clock=clock,
                              streams=streams, allowed_lateness=args.allowed_lateness, noise_key=key,
                              budget=share).with_privacy_unit(unit)


def parse_unit_line(line: str) -> tuple:
    """A CSV line ``stream_id,timestamp,unit_id,v0,...`` -> ``(stream_id, seconds, UnitValue(value, unit_id))``;
    a value that does not parse stays the line without its unit id (dead-lettered on the worker)."""
    from beam_dp.flink.units import UnitValue

    parts = line.strip().split(",")
    stream, seconds, value = parse_line(",".join(parts[:2] + parts[3:]))
    return stream, seconds, UnitValue(value, parts[2] if len(parts) > 2 else None)


def block_input(args: argparse.Namespace) -> str | None:
    """The local path of a replay's input read as blocks (``--file-input blocks``), else None (one record per line)."""
    if args.kafka_brokers or args.streaming or args.file_input != "blocks" or args.privacy_unit is not None:
        return None
    path = args.input[len("file://"):] if args.input.startswith("file://") else args.input
    return None if "://" in path else path


#: where the FileSink puts release files under --output: ``<bucket, e.g. 2026-01-31--12>/part-<uuid>-<n>``
RELEASE_FILES = "*/part"


def job_manifest(params) -> JobManifest:
    """The job's manifest (``beam_dp.io.manifest``): its one release function, with its bound noise
    domain (``--noise-domain`` or :data:`UID`), mechanism, composition and guarantee, the job's total
    (its budget's, as on Beam), and its release files under --output (:data:`RELEASE_FILES`)."""
    mechanism = params.build_mechanism()
    epsilon, delta = float(mechanism.guarantee.epsilon), float(mechanism.guarantee.delta)
    unit = getattr(params, "privacy_unit", None)
    transform = ManifestTransform(params.noise_key.domain or UID, mechanism.name, composition_of(mechanism), epsilon,
                                  delta, (RELEASE_FILES,), calibration_binding(params),
                                  privacy_unit=None if unit is None else unit.column)
    total = (epsilon, delta) if params.budget is None else (params.budget.plan.epsilon, params.budget.plan.delta)
    return JobManifest("flink_continual_sums", float(total[0]), float(total[1]), (transform,))


def resume_problem(output: str, manifest: JobManifest) -> str | None:
    """Why a job must not write into ``output``, whose existing manifest (a run resumed, or run again,
    into the same folder) declares other privacy parameters, else None.

    The parameters are bound into the noise (``calibration_binding``), so resuming a savepoint under
    changed ones would continue its keys' open noise cells with new draws beside releases made under
    the old ones (an averaging leak); such a resume is refused. What does not touch the state or the
    noise (checkpoint interval, split size, parallelism) resumes. A manifest written before the binding
    (no ``noise_binding``) is compared on its declared transforms only."""
    from beam_dp.io.manifest import manifest_path, read_manifest

    path = manifest_path(output)
    try:
        old = read_manifest(path)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        return f"{path} is not a beam_dp manifest ({exc}): give a new --output"

    def declared(m: JobManifest, bound: bool):
        return [(t.noise_domain, t.mechanism, t.composition, t.epsilon, t.delta) + ((t.noise_binding,) if bound else ())
                for t in m.transforms]

    bound = all(t.noise_binding is not None for t in old.transforms)
    if (old.job, old.epsilon, old.delta) != (manifest.job, manifest.epsilon, manifest.delta) or \
            declared(old, bound) != declared(manifest, bound):
        return (f"{output} holds releases of a job with other privacy parameters (its manifest {path} differs: "
                "epsilon, delta, clip bound, noise, counter, schedule, streams or noise domain): a resumed job keeps "
                "its parameters; give a new --output (and no savepoint) to release under new ones")
    return None


def checkpoint_settings(checkpoint_ms: int, checkpoint_dir: str, state_backend: str) -> dict[str, str]:
    """Flink settings of durable checkpoints: every ``checkpoint_ms`` to ``checkpoint_dir`` (files, never
    the JobManager's memory), kept when the job is cancelled (to resume with ``flink run -s``), with
    ``state_backend`` (RocksDB checkpoints incrementally)."""
    return {"execution.checkpointing.interval": f"{checkpoint_ms} ms",
            "execution.checkpointing.storage": "filesystem",
            "execution.checkpointing.dir": _uri(checkpoint_dir),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            "state.backend.type": state_backend,
            "execution.checkpointing.incremental": str(state_backend == "rocksdb").lower()}


def exact_counts(input_path: str, dead_letters: str) -> str:
    """``--print-exact-counts``: input lines read and dead letters per reason (read back from the raw-data
    folder). NOT private: they count raw data."""
    def lines(path: str):
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, names in os.walk(path)
                                                     for f in names if not f.startswith(".")]
        for name in sorted(files):
            with open(name, encoding="utf-8", errors="replace") as fh:
                yield from (line for line in fh if line.strip())

    read = sum(1 for _ in lines(input_path))
    reasons = collections.Counter(json.loads(line)["reason"] for line in lines(dead_letters))
    return (f"  exact counts (NOT private, they describe the raw data): {read} input lines read, "
            f"{sum(reasons.values())} dead letters" + (f" {dict(sorted(reasons.items()))}" if reasons else ""))


def kafka_lines(env, brokers: str, topic: str, jar: str | None = None):
    """The text messages of a Kafka ``topic`` (group ``beam_dp``, from its committed offsets) as a DataStream;
    ``jar``: the ``file://`` URL of the Kafka connector jar (else ``flink run --jarfile``)."""
    from pyflink.common import WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    if jar:
        env.add_jars(jar)
    source = (KafkaSource.builder().set_bootstrap_servers(brokers).set_topics(topic)
              .set_group_id("beam_dp").set_starting_offsets(KafkaOffsetsInitializer.committed_offsets())
              .set_value_only_deserializer(SimpleStringSchema()).build())
    return env.from_source(source, WatermarkStrategy.no_watermarks(), "kafka-events")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        params = _params(args)
        blocks = block_input(args)
        splits = None if blocks is None else file_splits(blocks, args.split_mib << 20, args.parallelism)
        problem = None if args.kafka_brokers else resume_problem(args.output, job_manifest(params))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from pyflink.common import Encoder, WatermarkStrategy
    from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat

    from beam_dp.flink.job import EVENT_TYPE, block_events, local_environment, release_stream

    streaming = args.streaming or bool(args.kafka_brokers)
    env = local_environment(args.parallelism, replay=not streaming,
                            settings=checkpoint_settings(args.checkpoint_ms, args.checkpoint_dir, args.state_backend))
    if args.kafka_brokers:
        from pyflink.common.serialization import SimpleStringSchema
        from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema, KafkaSink

        lines = kafka_lines(env, args.kafka_brokers, args.kafka_topic, args.kafka_jar)

        def sink(topic: str):
            return (KafkaSink.builder().set_bootstrap_servers(args.kafka_brokers).set_record_serializer(
                KafkaRecordSerializationSchema.builder().set_topic(topic)
                .set_value_serialization_schema(SimpleStringSchema()).build()).build())
        release_sink, dead_sink = sink(args.kafka_output_topic), sink(args.kafka_dead_letter_topic)
    else:
        if splits is None:
            source = FileSource.for_record_stream_format(StreamFormat.text_line_format(), args.input).build()
            lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "event-files")
            if args.parallelism > 1:  # a text file is one split of one reader: spread its lines to the parsers
                lines = lines.rebalance()
        release_sink = FileSink.for_row_format(args.output, Encoder.simple_string_encoder()).build()
        dead_sink = FileSink.for_row_format(args.dead_letter_output, Encoder.simple_string_encoder()).build()
    units = args.privacy_unit is not None
    if splits is None:
        parse = parse_unit_line if units else parse_line
        events = lines.filter(lambda line: bool(line.strip())).map(parse, output_type=EVENT_TYPE)
        parse_dead = None
    else:
        events, parse_dead = block_events(env, splits, params)
    # a FileSink writes the text and never reads a record's timestamp: only Kafka records carry it
    if units:
        from beam_dp.flink.units import unit_release_stream

        release = unit_release_stream
    else:
        release = release_stream
    releases, dead = release(env, events, params, uid=UID, max_delay_ms=args.max_delay_ms, idle_ms=args.idle_ms,
                             stamp=bool(args.kafka_brokers))
    if parse_dead is not None:
        dead = dead.union(parse_dead)
    releases.sink_to(release_sink)
    dead.sink_to(dead_sink)
    if not args.kafka_brokers:
        write_manifest(args.output, job_manifest(params))  # declares the job beside its releases (beam_dp.verify)
    env.execute("beam_dp continual sums")
    if not args.kafka_brokers:
        print(f"beam_dp flink: private releases under {args.output}; dead letters (RAW DATA, keep private) under "
              f"{args.dead_letter_output}; checkpoints (un-noised state, keep private) under {args.checkpoint_dir}")
        if args.print_exact_counts:
            print(exact_counts(args.input, args.dead_letter_output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
