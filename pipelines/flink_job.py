"""Run any beam_dp job on Flink: ``--job`` and the Beam job's own flags (the same params, the same releases).

    python -m pipelines.flink_job --job model_release --input examples.csv --output out/ --update-size 64 ...
    flink run --python pipelines/flink_job.py --pyFiles . -- --job lifelong --input tasks.csv --output out/ ...

Every job takes the flags of ``python -m pipelines.<job>`` (parsed and validated by that job: the same
params object, so the same noise binding) and runs that job's transform on Flink, its noise domain the
Beam job's transform label, so the releases under one key equal the Beam batch job's. ``continual_stats``
releases its sums (``ContinualSum``, through :func:`beam_dp.flink.job.release_stream`; ``--count``,
``--window`` and ``--privacy-unit-column`` run on Beam); its events are read as the Beam job reads them
(``beam_dp.io.sources``: one Flink record per row) or one JSON event per Kafka message, and its releases
go under ``<output>/sum/``. ``model_release``, ``online_learning``, ``growing_db_queries`` and
``lifelong`` run through :mod:`beam_dp.flink.families` (the same parse stage, policy, release rows and
dead letters). (:mod:`beam_dp.flink.run` is the sums' own Flink job, with its own flags, blocks of
headerless CSV lines and its own noise domain.) Rows are read as the Beam job reads them (CSV /
Parquet / JSON-lines files, ``pipelines.records``) and mapped by the job's own per-row function; a file's
rows of one stream reach the keyed function as blocks (one parse bundle each). Outputs: release rows as
JSON lines under ``<output>/<name>/`` (``models``, ``answers``, ``synthetic``), the job's manifest in
``--output``, dead letters (RAW DATA) under the job's private folder (``--dead-letter-output``, default
``<output>.private``), checkpoints under ``--checkpoint-dir`` (default ``<output>.checkpoints``). A bounded
file input is a replay (every step of the public schedule releases at the end).

The entry point lives here, not in ``beam_dp.flink``: the job flags, their checks and the per-row
functions are the Beam jobs' (``pipelines/``), which ``beam_dp`` never imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from functools import partial
from typing import Any, Callable, Iterator

from pipelines.runner import UsageError

__all__ = ["FAMILY_JOBS", "SUMS_JOB", "event_file_records", "event_message_records", "file_records", "flink_args",
           "inputs_of", "job_arg", "main", "manifest_of", "message_records", "readers_of", "run_family", "sums_params"]

#: the jobs run by the family shell (beam_dp.flink.families)
FAMILY_JOBS = ("model_release", "online_learning", "growing_db_queries", "lifelong")
SUMS_JOB = "continual_stats"  # its sums run through beam_dp.flink.job.release_stream
EVENT_ROWS = 262_144  # rows of an event file read at once (as the Beam job's ReadEventFiles)
BLOCK_ROWS = 4096  # rows of one stream per record (one parse bundle), as the Beam parse stages' blocks


def job_arg(argv: list[str]) -> tuple[str, list[str]]:
    """``--job`` and the other flags."""
    p = argparse.ArgumentParser(prog="python -m pipelines.flink_job", description=__doc__.split("\n\n")[0],
                                add_help=False, allow_abbrev=False)
    p.add_argument("--job", required=True, choices=(SUMS_JOB,) + FAMILY_JOBS)
    args, rest = p.parse_known_args(argv)
    return args.job, rest


def flink_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The Flink flags of a family job and the rest (the Beam job's own flags)."""
    p = argparse.ArgumentParser(prog="python -m pipelines.flink_job", add_help=False, allow_abbrev=False)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--checkpoint-ms", type=int, default=60_000)
    p.add_argument("--checkpoint-dir", default=None,
                   help="durable checkpoint storage; default the sibling <output>.checkpoints (un-noised state)")
    p.add_argument("--state-backend", default="rocksdb", choices=("rocksdb", "hashmap"))
    p.add_argument("--kafka-jar", help="file:// URL of flink-sql-connector-kafka-*.jar (--source kafka)")
    p.add_argument("--max-delay-ms", type=int, default=0, help="bounded out-of-orderness of the watermark (Kafka)")
    p.add_argument("--idle-ms", type=int, default=None, help="mark a silent source split idle after this (Kafka)")
    args, rest = p.parse_known_args(argv)
    if args.parallelism < 1:
        p.error(f"--parallelism must be >= 1, got {args.parallelism}")
    if args.checkpoint_ms < 10:
        p.error(f"--checkpoint-ms must be >= 10, got {args.checkpoint_ms}")
    return args, rest


def _label(name: str, job: Any, opts: Any) -> str:
    """The Beam job's transform label (its noise domain there, so here)."""
    if name == "model_release":
        from pipelines.model_release import ALGORITHMS

        return ALGORITHMS[opts.algorithm][1]
    if name == "online_learning":
        return "OnlineLearner" if opts.learner == "online" else "IncrementalRegression"
    return {SUMS_JOB: "ContinualSum", "growing_db_queries": "GrowingDatabaseQueries", "lifelong": "LifelongLearner"}[name]


def inputs_of(name: str, job: Any) -> list[tuple[str, str, Callable[[dict], Any]]]:
    """``(input kind, file pattern, row -> the transform's element)`` of a planned job: the job's own functions."""
    params = job.params
    column = None if params.privacy_unit is None else params.privacy_unit.column  # kept in each element
    if name == "model_release":
        from pipelines.model_release import labelled, to_unit_example

        return [("elements", job.pattern, labelled(params).record if column is None else partial(
            to_unit_example, dim=params.n_features, classification=params.classes is not None, column=column))]
    if name == "online_learning":
        from pipelines.online_learning import to_record

        return [("elements", job.pattern, partial(to_record, dim=params.dim, event_time=job.event_time,
                                                  unit_column=column))]
    if name == "growing_db_queries":
        from pipelines.growing_db_queries import elements, to_query, to_unit_element

        return [("elements", job.elements, elements(params.universe).record if column is None else partial(
                    to_unit_element, universe=params.universe, column=column)),
                ("queries", job.queries, partial(to_query, size=params.universe.size))]
    from pipelines.lifelong import to_task_row

    return [("elements", job.pattern, partial(to_task_row, dim=params.learner.input_dim, classes=job.classes,
                                              unit_column=column))]


def file_records(path: str, kind: str, to_element: Callable[[dict], Any]) -> Iterator[tuple[str, Any]]:
    """One file's rows as ``("event", record)`` (the family's block records, :data:`BLOCK_ROWS` rows of
    one stream each, in file order) and ``("dead", letter JSON)`` of its unreadable rows (stage ``read``)."""
    from apache_beam.pvalue import TaggedOutput

    from beam_dp.flink.families import block_record, stream_of
    from pipelines.common import dead_letter_json
    from pipelines.records import ReadRecordFile

    open_blocks: dict[str, list] = {}
    for row in ReadRecordFile().process(path):
        if isinstance(row, TaggedOutput):
            yield "dead", dead_letter_json(row.value, "read")
            continue
        element = to_element(row)
        stream = stream_of(element)
        block = open_blocks.setdefault(stream, [])
        block.append(element)
        if len(block) >= BLOCK_ROWS:
            yield "event", block_record(stream, open_blocks.pop(stream), kind=kind)
    for stream, block in open_blocks.items():
        yield "event", block_record(stream, block, kind=kind)


def _exact_flags() -> None:
    """Parse the job flags exactly under the Flink venv's Beam (2.61), as Beam 2.77 does: its views of the
    options (``view_as``) parse with argparse abbreviations, so a job flag that prefixes a Beam flag
    (``growing_db_queries``' ``--n``, Beam's ``--no_wait_until_finish``) would be misread."""
    from apache_beam.options import pipeline_options

    parser = pipeline_options._BeamArgumentParser
    if parser.__dict__.get("_beam_dp_exact"):
        return
    init = parser.__init__

    def exact(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        init(self, *args, **kwargs)

    parser.__init__, parser._beam_dp_exact = exact, True


def message_records(message: str, inputs: list[tuple[str, str | None, Callable[[dict], Any]]]
                    ) -> Iterator[tuple[str, Any]]:
    """One Kafka message (a JSON object with the file columns' names, as the Beam job reads it) as
    ``("event", record)`` (one element; its ``timestamp``, epoch seconds, drives the watermark) or
    ``("dead", letter JSON)``. A growing database's message with a ``query_id`` is a query."""
    from apache_beam.pvalue import TaggedOutput

    from beam_dp.flink.families import block_record, stream_of
    from pipelines.common import ParseMessages, dead_letter_json

    for row in ParseMessages(as_event=False).process(message):
        if isinstance(row, TaggedOutput):
            yield "dead", dead_letter_json(row.value, "read")
            continue
        kind, _, to_element = inputs[1] if len(inputs) > 1 and "query_id" in row else inputs[0]
        element = to_element(row)
        seconds = row.get("timestamp")
        seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0
        yield "event", block_record(stream_of(element), [element], seconds, kind)


def event_file_records(path: str) -> Iterator[tuple[str, Any]]:
    """One event file of ``continual_stats`` (CSV / Parquet, read as the Beam job reads it:
    ``beam_dp.io.sources``) as ``("event", (stream, seconds, value))`` per readable row and ``("dead",
    letter JSON)`` per unreadable one (stage ``read``)."""
    from apache_beam.pvalue import TaggedOutput

    from beam_dp.io.sources import _ReadEventFile
    from pipelines.common import dead_letter_json

    for out in _ReadEventFile(EVENT_ROWS, timestamps=True).process(path):
        if isinstance(out, TaggedOutput):
            yield "dead", dead_letter_json(out.value, "read")
        else:
            yield from (("event", out.row(i)) for i in range(len(out)))


def event_message_records(message: str) -> Iterator[tuple[str, Any]]:
    """One Kafka message of ``continual_stats`` (a JSON event, read as the Beam job reads it) as
    ``("event", (stream, seconds, value))`` (a timestamp that is no number or ISO-8601 text: NaN, and a
    stream id that is no text: empty, both dead-lettered by the release function) or ``("dead", letter JSON)``."""
    from apache_beam.pvalue import TaggedOutput

    from beam_dp.steps.events import to_micros
    from pipelines.common import ParseMessages, dead_letter_json

    for event in ParseMessages(as_event=True).process(message):
        if isinstance(event, TaggedOutput):
            yield "dead", dead_letter_json(event.value, "read")
            continue
        stream, when = event["stream_id"], event["timestamp"]
        try:
            seconds = float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else \
                to_micros(when) / 1e6
        except (TypeError, ValueError):
            seconds = float("nan")
        yield "event", (stream if isinstance(stream, str) else "", seconds, event["value"])


def sums_params(job: Any) -> Any:
    """The ``ContinualSumParams`` of a planned ``continual_stats`` job; a usage error for what Flink does
    not release (its count and windowed sums, unit-level sums)."""
    extra = [f"--{name.replace('windowed', 'window')}" for name in job.params if name != "sum"]
    if extra:
        raise UsageError(f"{', '.join(extra)} run on Beam: on Flink continual_stats releases its sums")
    if job.unit is not None:
        raise UsageError("--privacy-unit-column: the unit-level sums run on Flink with python -m beam_dp.flink.run "
                         "--privacy-unit (its own flags), or on Beam")
    return job.params["sum"]


def readers_of(name: str, job: Any) -> tuple[Callable[[str], Iterator], list[tuple[str, Callable[[str], Iterator]]]]:
    """A planned job's readers: ``(a Kafka message's records, [(file pattern, a file's records)])``, each
    record ``("event", EVENT_TYPE record)`` or ``("dead", letter JSON)``."""
    if name == SUMS_JOB:
        return event_message_records, [(job.pattern, event_file_records)]
    inputs = inputs_of(name, job)
    return partial(message_records, inputs=inputs), [
        (pattern, partial(file_records, kind=kind, to_element=to_element))
        for kind, pattern, to_element in inputs if pattern is not None]


def _plan(name: str, argv: list[str]) -> tuple[Any, Any]:
    """The Beam job's plan of ``argv`` (its flags, checks and params) and its options."""
    from pipelines.runner import options_class, parse

    _exact_flags()

    module = importlib.import_module(f"pipelines.{name}")
    options = parse(argv, module.JOB)
    job = module.plan(options)
    opts = options.view_as(options_class(name))
    if job.demo:
        raise UsageError("give --input (or --source kafka): the demo data is the Beam job's")
    if opts.source == "pubsub":
        raise UsageError("--source pubsub runs on Beam: on Flink give files or --source kafka")
    if (opts.source == "kafka") != bool(getattr(job, "streaming", False)):
        raise UsageError("on Flink, --source kafka is a streaming job (add --streaming) and files are a replay")
    return job, opts


def manifest_of(job_name: str, params: Any, domain: str, outputs: tuple[str, ...]) -> Any:
    """The job's manifest: its one release function (domain, mechanism, composition, guarantee, binding)
    and its release files (``<name>/*/part`` under --output)."""
    from beam_dp.beam.shell.manifest import params_composition
    from beam_dp.core.noise_binding import calibration_binding
    from beam_dp.io.manifest import JobManifest, ManifestTransform

    mechanism = params.build_mechanism()
    budget = getattr(params, "budget", None)
    own = mechanism.guarantee if budget is None else budget  # its share of the job's budget, as on Beam
    total = own if budget is None else budget.plan
    transform = ManifestTransform(domain, mechanism.name, params_composition(params, mechanism), float(own.epsilon),
                                  float(own.delta), tuple(f"{name}/*/part" for name in outputs),
                                  calibration_binding(params))
    return JobManifest(f"flink_{job_name}", float(total.epsilon), float(total.delta), (transform,))


def run_family(flags: argparse.Namespace, argv: list[str]) -> int:
    """Plan the Beam job ``flags.job`` from ``argv`` and run its transform on Flink (``continual_stats``: its
    sums, :func:`sums_params`; files: a replay; ``--source kafka --streaming``: event-time watermarks
    from the messages' timestamps)."""
    import dataclasses

    from beam_dp.flink.run import checkpoint_settings, resume_problem
    from beam_dp.io.locations import overlap_error
    from pipelines.outputs import private_dir
    from pipelines.paths import join

    job, opts = _plan(flags.job, argv)
    planned, outputs = (sums_params(job), ("sum",)) if flags.job == SUMS_JOB else (job.params, tuple(job.outputs))
    domain = planned.noise_key.domain or _label(flags.job, job, opts)
    params = dataclasses.replace(planned, noise_key=dataclasses.replace(planned.noise_key, domain=domain))
    private = private_dir(opts)
    checkpoints = flags.checkpoint_dir or opts.output.rstrip("/") + ".checkpoints"
    for flag, path in (("--dead-letter-output", private), ("--checkpoint-dir", checkpoints)):
        if nested := overlap_error([("--output", opts.output), (flag, path)]):
            raise UsageError(nested)
    manifest = manifest_of(flags.job, params, domain, outputs)
    if problem := resume_problem(opts.output, manifest):
        raise UsageError(problem)
    from pyflink.common import Encoder, Types
    from pyflink.datastream.connectors.file_system import FileSink

    from beam_dp.flink.families import family_stream
    from beam_dp.flink.job import EVENT_TYPE, local_environment, release_stream
    from beam_dp.io.manifest import write_manifest
    from pipelines.common import match_files

    streaming = opts.source == "kafka"
    env = local_environment(flags.parallelism, replay=not streaming,
                            settings=checkpoint_settings(flags.checkpoint_ms, checkpoints, flags.state_backend))
    read_message, read_files = readers_of(flags.job, job)
    tagged = Types.TUPLE([Types.STRING(), Types.PICKLED_BYTE_ARRAY()])  # the readers' ("event" | "dead", value)
    if streaming:
        from beam_dp.flink.run import kafka_lines

        lines = kafka_lines(env, opts.kafka_bootstrap_servers, opts.kafka_topic, flags.kafka_jar)
        sources = [lines.flat_map(read_message, output_type=tagged)]
    else:
        sources = [env.from_collection(match_files(pattern), type_info=Types.STRING()).rebalance().flat_map(
            read_file, output_type=tagged) for pattern, read_file in read_files]
    records = sources[0] if len(sources) == 1 else sources[0].union(*sources[1:])
    events = records.filter(lambda r: r[0] == "event").map(lambda r: r[1], output_type=EVENT_TYPE)
    read_dead = records.filter(lambda r: r[0] == "dead").map(lambda r: r[1], output_type=Types.STRING())
    if flags.job == SUMS_JOB:
        releases, dead = release_stream(env, events, params, uid=domain, max_delay_ms=flags.max_delay_ms,
                                        idle_ms=flags.idle_ms, stamp=False)
    else:
        releases, snapshots, dead = family_stream(env, events, params, uid=domain, max_delay_ms=flags.max_delay_ms,
                                                  idle_ms=flags.idle_ms, stamp=False)

    def sink(stream, folder: str, name: str) -> None:
        stream.sink_to(FileSink.for_row_format(folder, Encoder.simple_string_encoder()).build()).name(name)

    sink(releases, join(opts.output, outputs[0]), f"{outputs[0]}-files")
    if len(outputs) > 1:
        sink(snapshots, join(opts.output, outputs[1]), f"{outputs[1]}-files")
    sink(dead.union(read_dead), private, "dead-letter-files")
    write_manifest(opts.output, manifest)
    env.execute(f"beam_dp {flags.job}")
    print(f"beam_dp flink {flags.job}: private releases under {opts.output}; dead letters (RAW DATA, keep private) "
          f"under {private}; checkpoints (un-noised state, keep private) under {checkpoints}")
    return 0


def main(argv: list[str] | None = None) -> int:
    job, rest = job_arg(list(sys.argv[1:] if argv is None else argv))
    flags, rest = flink_args(rest)
    flags.job = job
    try:
        return run_family(flags, rest)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
