"""Beam pieces every beam_dp job shares: strict flag checking, event and message sources, the
release and dead-letter sinks, and the summary read back from the outputs (all paths through
Beam's FileSystems, see :mod:`pipelines.paths`).

Sources: ``--source files`` (CSV/Parquet batch replay, columnar ``EventBatch`` blocks), ``--source
pubsub`` or ``--source kafka`` (streaming, Beam's own IO; one JSON event per message). Tests
substitute a ``TestStream`` of messages for the streaming source (``ReadEvents(..., messages=...)``),
so the message parsing is tested too. The run itself is :mod:`pipelines.runner`'s.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from beam_dp.beam import DeadLetter, Reason
from beam_dp.beam.shell.manifest import job_manifest, record_release_files
from beam_dp.beam.shell.parse import DEAD_LETTER
from beam_dp.io import (
    RELEASE_SCHEMA,
    ReleaseColumns,
    WriteReleasesToJsonLines,
    WriteReleasesToParquet,
    release_parquet_writer,
    release_table,
)
from beam_dp.io.manifest import write_manifest
from beam_dp.io.tables import csv_header
from pipelines.paths import join, match, read_text_lines
from pipelines.usage import UsageError

__all__ = [
    "JobOptions",
    "ReadEvents",
    "ReadMessages",
    "check_flags",
    "check_key_sources",
    "check_source",
    "rejected_input",
    "dead_letter_json",
    "file_header",
    "input_header",
    "match_files",
    "exact_counts",
    "output_summary",
    "write_dead_letters",
    "release_tables",
    "write_releases",
]

log = logging.getLogger("beam_dp.pipelines")


class _StrictParser(_BeamArgumentParser):
    def error(self, message: str):  # argparse prints usage and exits; we want one line
        raise UsageError(message)


class JobOptions(PipelineOptions):
    """Base of a job's own options. Beam collects the flags of every *direct* ``PipelineOptions``
    subclass into one parser, so two jobs imported into one process (tests, a notebook) that both
    define ``--input`` or ``--algorithm`` would clash; flags of ``JobOptions`` subclasses are parsed
    only by their own job (``view_as``, :func:`check_flags`)."""


def _all_option_classes(job_options: type[PipelineOptions]) -> list[type[PipelineOptions]]:
    seen, todo = [], list(PipelineOptions.__subclasses__()) + [job_options]
    while todo:
        cls = todo.pop()
        if cls not in seen and (cls is job_options or not issubclass(cls, JobOptions)):
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def check_flags(argv: list[str], job_options: type[PipelineOptions]) -> None:
    """Raise :class:`UsageError` for a flag that neither Beam nor the job knows, or a bad value."""
    parser = _StrictParser(allow_abbrev=False, add_help=False)
    added: set[str] = set()
    for cls in _all_option_classes(job_options):
        sub = _StrictParser(allow_abbrev=False, add_help=False)
        cls._add_argparse_args(sub)  # pylint: disable=protected-access
        for action in sub._actions:  # pylint: disable=protected-access
            if not set(action.option_strings) & added:
                parser._add_action(action)  # pylint: disable=protected-access
                added.update(action.option_strings)
    _, unknown = parser.parse_known_args(argv)
    flags = [u.split("=", 1)[0] for u in unknown if u.startswith("-")]
    if flags:
        raise UsageError(f"unknown flag {flags[0]} (see --help for this job's flags; "
                         "any Apache Beam pipeline option is accepted too)")
    if unknown:
        raise UsageError(f"unexpected argument {unknown[0]!r}: every option is a --flag=value")


def match_files(pattern: str, flag: str = "--input") -> list[str]:
    """Sorted paths matching ``pattern`` (local or any Beam filesystem), or a usage error."""
    try:
        matches = match(pattern)
    except Exception as exc:  # a bad scheme or an unreachable bucket
        raise UsageError(f"cannot list {flag} {pattern!r}: {type(exc).__name__}") from None
    if not matches:
        raise UsageError(f"no files match {flag} {pattern!r}: check the path")
    return matches


def file_header(path: str, flag: str = "--input") -> tuple[list[str], dict]:
    """Column names of one input file (CSV: its first line, a UTF-8 byte order mark dropped; Parquet:
    its schema; JSON lines: the first object's keys) and, for Parquet, each column's Arrow type."""
    from pipelines.paths import FileSystems

    try:
        with FileSystems().open(path) as fh:
            if path.endswith(".parquet"):
                schema = pq.ParquetFile(fh).schema_arrow
                return list(schema.names), {f.name: f.type for f in schema}
            line = fh.readline()
            if path.endswith((".jsonl", ".json", ".ndjson")):
                first = line.decode("utf-8-sig")
                return list(json.loads(first) if first.strip() else []), {}
            return [n.strip() for n in csv_header(line)], {}  # RFC 4180: quoted names
    except Exception as exc:  # unreadable header or file
        raise UsageError(f"cannot read the header of {path} ({flag}): {type(exc).__name__}") from None


def input_header(pattern: str, flag: str = "--input") -> tuple[str, list[str], dict]:
    """The first file matching ``pattern``, its columns and (Parquet) types, after checking at launch
    that no header repeats a column and that every file of the glob has the same columns (and the
    same Parquet types): otherwise a usage error naming the file and the difference (else a file of
    another shape would be read as one dead letter, or not at all)."""
    paths = match_files(pattern, flag)
    first, (names, types) = paths[0], file_header(paths[0], flag)
    for path in paths:
        cols, kinds = (names, types) if path == first else file_header(path, flag)
        repeated = sorted({c for c in cols if cols.count(c) > 1})
        if repeated:
            raise UsageError(f"{flag} {path}: column {repeated[0]!r} appears more than once in the header")
        if cols != names:
            extra, missing = [c for c in cols if c not in names], [c for c in names if c not in cols]
            diff = (f"has {extra[0]!r} that {first} lacks" if extra else f"lacks {missing[0]!r} that {first} has"
                    if missing else "has the same columns in another order")
            raise UsageError(f"{flag} {path} does not match {first}: it {diff}; every file of a glob needs one header")
        differ = [c for c in cols if c in kinds and c in types and kinds[c] != types[c]]
        if differ:
            raise UsageError(f"{flag} {path}: column {differ[0]!r} is {kinds[differ[0]]} but {types[differ[0]]} "
                             f"in {first}; every file of a glob needs one schema")
    return first, names, types


def check_source(opts, streaming: bool) -> None:
    """Usage errors for an incomplete source configuration."""
    if opts.source == "files":
        return
    if not streaming:
        raise UsageError(f"--source {opts.source} is unbounded: add --streaming")
    if opts.source == "pubsub" and not (opts.pubsub_subscription or opts.pubsub_topic):
        raise UsageError("--source pubsub needs --pubsub-subscription or --pubsub-topic")
    if opts.source == "pubsub" and opts.pubsub_subscription and opts.pubsub_topic:
        raise UsageError("give only one of --pubsub-subscription and --pubsub-topic")
    if opts.source == "kafka" and not (opts.kafka_bootstrap_servers and opts.kafka_topic):
        raise UsageError("--source kafka needs --kafka-bootstrap-servers and --kafka-topic")


#: how a job's command names its three noise key sources (run_yaml and YAML name them by their config keys)
KEY_FLAGS = ("--noise-key-secret", "--noise-key-file", "--noise-key-env")


def check_key_sources(secret: str | None, key_file: str | None, env_var: str | None, local: bool,
                      names: tuple[str, str, str] = KEY_FLAGS) -> None:
    """The launch check of a job's noise key, read here as the workers will read it (never shown);
    a :class:`UsageError` (one line, exit 2) for anything unusable.

    At most one source may be named (``names``: how the user gives the secret, the key file and the env
    var). A named secret (``projects/P/secrets/S/versions/V``) or key file (any Beam filesystem) is read
    and validated now (``beam_dp.core.noise.load_key``: hex of at least 64 digits or at least 32 raw
    bytes). A named env var must be set here and valid when the run is ``local``; for a remote runner it
    is the workers' and is checked here only when set. With no source named, the default env var
    ``BEAM_DP_NOISE_KEY`` is validated when set (else the run may use a random key, said once)."""
    from beam_dp.core.noise import KEY_ENV_VAR
    from beam_dp.io.keys import is_secret_version

    given = [(name, value) for name, value in zip(names, (secret, key_file, env_var)) if value]
    if len(given) > 1:
        raise UsageError(f"give one noise key source, not {' and '.join(name for name, _ in given)}: "
                         "the workers would read only one of them")
    if secret and not is_secret_version(secret):
        raise UsageError(f"{names[0]} must be a secret version projects/P/secrets/S/versions/V")
    if secret:
        _check_key(names[0], secret=secret, local=local)
    elif key_file:
        _check_key(names[1], key_file=key_file)
    elif env_var and not os.environ.get(env_var):
        if local:
            raise UsageError(f"{names[2]} {env_var}: the env var {env_var} is not set (a named key source must "
                             "hold the key; leave the flag out for a random key)")
    elif os.environ.get(env_var or KEY_ENV_VAR):
        _check_key("", env_var=env_var or KEY_ENV_VAR)  # load_key's message names the env var


def _check_key(what: str, key_file: str | None = None, env_var: str | None = None, secret: str | None = None,
               local: bool = True) -> None:
    """Read the key the workers will read and refuse it now if it cannot be used (never shown). A remote
    run's secret is left to its workers when this machine lacks the Secret Manager client (a WARNING)."""
    from beam_dp.cli import one_line
    from beam_dp.core.noise import NoiseSource, load_key
    from beam_dp.io.keys import read_key_file, read_secret
    from pipelines.paths import FileSystems, display, is_local

    if key_file:
        try:
            found = FileSystems().exists(key_file)
        except Exception as exc:  # an unknown scheme or no credentials here
            raise UsageError(f"cannot check {what} {key_file}: {type(exc).__name__}: {one_line(exc)}") from None
        if not found:
            raise UsageError(f"{what} {key_file} does not exist")
        if is_local(key_file) and os.path.isdir(display(key_file)):
            raise UsageError(f"{what} {key_file} is a folder: give the key file")
    try:
        key = load_key(env_var, secret, read_secret) if secret else load_key(env_var, key_file, read_key_file)
        NoiseSource(key)
    except ImportError as exc:  # the client library's extra is not installed here
        if secret and not local:
            logging.getLogger(__name__).warning("%s: not checked at launch (%s); the workers read it", what,
                                                one_line(exc))
            return
        raise UsageError(f"{what}: {one_line(exc)}" if what else one_line(exc)) from None
    except ValueError as exc:
        raise UsageError(f"{what}: {one_line(exc)}" if what else one_line(exc)) from None
    except Exception as exc:  # unreadable: permissions, I/O, a missing secret
        raise UsageError(f"cannot read {what} {secret or key_file or ''}: {type(exc).__name__}".rstrip()) from None


class ParseMessages(beam.DoFn):
    """One JSON event per message (bytes or text) -> a mapping the transforms accept, or a dead letter.

    Keys: ``stream_id``, ``timestamp`` and ``value`` (or ``value_0..value_{d-1}``). Validation of
    the fields themselves (NaN, shape, schedule) is the transform's job. ``as_event=False`` yields
    the JSON object unchanged (jobs whose records have other fields map them themselves).
    """

    def __init__(self, as_event: bool = True):
        self._as_event = as_event

    def process(self, message: Any) -> Iterator:
        payload = message[1] if isinstance(message, tuple) and len(message) == 2 else message  # Kafka (key, value)
        try:
            event = json.loads(payload.decode("utf-8") if isinstance(payload, bytes) else payload)
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError):
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER, DeadLetter(Reason.MALFORMED, "message is not JSON text", None, payload))
            return
        if not isinstance(event, dict):
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER, DeadLetter(Reason.MALFORMED, "message is not a JSON object", None, payload))
            return
        if not self._as_event:
            yield event
            return
        if "value" not in event:
            columns = sorted((k for k in event if k.startswith("value_") and k[6:].isdigit()), key=lambda k: int(k[6:]))
            if columns:
                event["value"] = [event[k] for k in columns]
        yield {"stream_id": event.get("stream_id"), "timestamp": event.get("timestamp"), "value": event.get("value")}


class ReadEvents(beam.PTransform):
    """The job's events and the source's dead letters, from the source the flags select.

    ``messages``: a PTransform producing raw messages (e.g. a ``TestStream``) used instead of
    Pub/Sub or Kafka, so tests run the same parsing as production.
    """

    def __init__(self, opts, pattern: str | None = None, messages: beam.PTransform | None = None,
                 timestamps: bool = True):
        super().__init__()
        self.opts = opts
        self.pattern = pattern
        self.messages = messages
        self.timestamps = timestamps

    def expand(self, pbegin):
        from beam_dp.io.sources import ReadEventFiles

        opts = self.opts
        if self.messages is None and opts.source == "files":
            return pbegin | "ReadEventFiles" >> ReadEventFiles(self.pattern, timestamps=self.timestamps)
        parsed = pbegin | "Messages" >> ReadMessages(opts, self.messages, as_event=True)
        return parsed.events, parsed[DEAD_LETTER]


class ReadMessages(beam.PTransform):
    """Raw messages from Pub/Sub, Kafka or ``messages`` (a test source), parsed: outputs ``events``
    (mappings, see :class:`ParseMessages`) and ``dead_letter``."""

    def __init__(self, opts, messages: beam.PTransform | None = None, as_event: bool = True):
        super().__init__()
        self.opts = opts
        self.messages = messages
        self.as_event = as_event

    def expand(self, pbegin):
        opts = self.opts
        if self.messages is not None:
            raw = pbegin | "Messages" >> self.messages
        elif opts.source == "pubsub":
            raw = pbegin | "ReadFromPubSub" >> beam.io.ReadFromPubSub(
                topic=opts.pubsub_topic, subscription=opts.pubsub_subscription,
                timestamp_attribute=opts.pubsub_timestamp_attribute)
        else:
            from apache_beam.io.kafka import ReadFromKafka  # cross-language: needs Java and the expansion jar

            raw = pbegin | "ReadFromKafka" >> ReadFromKafka(
                consumer_config={"bootstrap.servers": opts.kafka_bootstrap_servers},
                topics=[opts.kafka_topic], timestamp_policy=ReadFromKafka.create_time_policy)
        return raw | "ParseMessages" >> beam.ParDo(ParseMessages(self.as_event)).with_outputs(
            DEAD_LETTER, main="events")


# -- dead letters and summaries ------------------------------------------------------------------
def dead_letter_json(letter: DeadLetter, stage: str) -> str:
    """One dead letter as a JSON line (``DeadLetter.to_json``: stage, reason, value-free detail, stream,
    source, the element as JSON values as read)."""
    return json.dumps(letter.to_json(stage), allow_nan=False)


class _WriteBundleFiles(beam.DoFn):
    """Streaming file sink: each bundle's elements go to one new file ``<prefix>-<uuid><suffix>``.

    Windows and triggers play no part: releases are emitted by timers behind the watermark (a step
    closes when the watermark passes its end), and Beam's windowed file sinks would drop them as
    late data. At-least-once: a retried bundle may write its file twice; the copies are identical
    (keyed noise), so readers may deduplicate on (stream, step).
    """

    def __init__(self, prefix: str, fmt: str):
        self._prefix, self._fmt = prefix, fmt

    def start_bundle(self) -> None:
        self._items = []

    def process(self, item) -> None:
        self._items.append(item)

    def finish_bundle(self) -> None:
        if not self._items:
            return
        from apache_beam.io.filesystems import FileSystems

        path = f"{self._prefix}-{uuid.uuid4().hex}{'.parquet' if self._fmt == 'parquet' else '.jsonl'}"
        columnar = isinstance(self._items[0], ReleaseColumns)  # a group-keyed transform's releases
        with FileSystems.create(path) as fh:
            if self._fmt == "parquet":
                with release_parquet_writer(fh) as writer:
                    writer.write_table(release_table(self._items) if columnar else pa.Table.from_pylist(
                        [r._asdict() for r in self._items], schema=RELEASE_SCHEMA))
            else:
                rows = [r for c in self._items for r in c.rows()] if columnar else self._items
                text = "".join((i if isinstance(i, str) else json.dumps(i._asdict(), sort_keys=True)) + "\n"
                               for i in rows)
                fh.write(text.encode("utf-8"))
        self._items = []


def release_tables(out_dir: str, name: str, columns: list[str] | tuple[str, ...] | None = None) -> Iterator[pa.Table]:
    """The releases ``<out_dir>/<name>-*`` as Arrow tables of up to 65,536 rows, text columns as
    dictionaries (``beam_dp.io.iter_release_tables``), none if none were written."""
    from beam_dp.io import iter_release_tables

    try:
        yield from iter_release_tables(join(out_dir, f"{name}-*"), columns, dictionary_text=True)
    except FileNotFoundError:
        return


def write_releases(releases: beam.PCollection, out_dir: str, name: str, fmt: str, streaming: bool,
                   columnar: bool = False):
    """Write releases (rows, or ``ReleaseColumns`` when ``columnar``) to ``<out_dir>/<name>-*.parquet``
    (or ``.jsonl``), on any Beam filesystem.

    Batch: Beam's Parquet/text sinks. Streaming: one file per bundle (see ``_WriteBundleFiles``).
    """
    record_release_files(releases, name)
    if not streaming:
        sink = WriteReleasesToParquet if fmt == "parquet" else WriteReleasesToJsonLines
        return releases | f"Write-{name}" >> sink(join(out_dir, name), columnar=columnar)
    return releases | f"Write-{name}" >> beam.ParDo(_WriteBundleFiles(join(out_dir, name), fmt))


def write_job_manifest(pipeline: beam.Pipeline, job: str, out_dir: str) -> str:
    """Write the job's manifest (``beam_dp.io.manifest``: its transforms, noise domains, shares, total
    and release files) to ``<out_dir>/_beam_dp_manifest.json``; returns its path."""
    return write_manifest(out_dir, job_manifest(pipeline, job))


#: the counter namespace of the dead letters written, one counter per stage (:func:`rejected_input`)
DEAD_LETTER_COUNTS = "beam_dp/dead_letters"


class _DeadLetterJson(beam.DoFn):
    """A stage's dead letter as its JSON line, counted (``DEAD_LETTER_COUNTS``, named by the stage)."""

    def __init__(self, stage: str):
        self._stage = stage

    def setup(self) -> None:
        self._count = Metrics.counter(DEAD_LETTER_COUNTS, self._stage)

    def process(self, letter: DeadLetter) -> Iterator[str]:
        self._count.inc()
        yield dead_letter_json(letter, self._stage)


def write_dead_letters(dead: dict[str, beam.PCollection], out_dir: str, streaming: bool = False):
    """Write every stage's dead letters as JSON lines to ``<out_dir>/dead_letter-*.jsonl`` (batch: one
    file even when there are none, so a reader can tell "none" from "not written"). They hold raw
    data: ``out_dir`` is the job's private folder (``pipelines.outputs.private_dir``), never ``--output``."""
    tagged = tuple(pc | f"Tag-{stage}" >> beam.ParDo(_DeadLetterJson(stage)) for stage, pc in dead.items())
    merged = tagged | "AllDeadLetters" >> beam.Flatten()
    prefix = join(out_dir, "dead_letter")
    if streaming:
        return merged | "WriteDeadLetters" >> beam.ParDo(_WriteBundleFiles(prefix, "jsonl"))
    return merged | "WriteDeadLetters" >> beam.io.WriteToText(prefix, file_name_suffix=".jsonl", num_shards=1)


def exact_counts(result, private: str) -> list[str]:
    """``--print-exact-counts``: accepted events (the ``beam_dp/*`` counters of a finished run) and dead
    letters by stage and reason (read back from ``private``: one source, so the two never disagree).
    NOT private: these count raw data."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        counters = result.metrics().query(MetricsFilter())["counters"]
        accepted = str(sum(int(c.committed if c.committed is not None else c.attempted or 0) for c in counters
                           if c.key.metric.namespace.startswith("beam_dp/") and c.key.metric.name == "elements"))
    except Exception:  # pragma: no cover - a runner without metrics
        accepted = "unknown (no metrics on this runner)"
    letters = [json.loads(line) for line in read_text_lines(join(private, "dead_letter-*.jsonl"))]
    reasons = Counter(f"{d['stage']}:{d['reason']}" for d in letters)
    return ["  exact counts (NOT private, they describe the raw data): "
            f"{accepted} events accepted (all transforms), {len(letters)} dead letters"
            + (f" {dict(sorted(reasons.items()))}" if reasons else "")]


@dataclass(frozen=True)
class RejectedInput:
    """How many input rows a finished run rejected (dead letters) among those it read. NOT private:
    these count raw data; they are shown to the operator, never written with the releases."""

    rows: int
    rejected: int

    @property
    def fraction(self) -> float:
        return self.rejected / self.rows if self.rows else 0.0

    def line(self) -> str:
        return f"{self.rejected} of {self.rows} input rows were rejected (raw-data count, not private)"


def rejected_input(result) -> RejectedInput | None:
    """The rows a finished local run read and rejected, from its counters (None without metrics).

    Rejected: the dead letters of the read stages (stages ``read*``) plus the most any one transform
    stage dead-lettered (the job's transforms see the same rows). Read: the read stages' rejects plus
    the most rows any one transform saw (its ``elements``, ``querys`` and ``dead_letters`` counters; a
    row accepted and later dead-lettered, e.g. a late event, counts twice there)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        counters = result.metrics().query(MetricsFilter())["counters"]
    except Exception:  # pragma: no cover - a runner without metrics
        return None
    read, stages, seen = 0, Counter(), Counter()
    for c in counters:
        value = int(c.committed if c.committed is not None else c.attempted or 0)
        namespace, name = c.key.metric.namespace, c.key.metric.name
        if namespace == DEAD_LETTER_COUNTS:
            read += value if name.startswith("read") else 0
            stages[name] += 0 if name.startswith("read") else value
        elif namespace.startswith("beam_dp/") and name in ("elements", "querys", "dead_letters"):
            seen[c.key.step.split("/")[0]] += value  # by transform (two may share a mechanism's namespace)
    rejected = read + max(stages.values(), default=0)
    return RejectedInput(max(read + max(seen.values(), default=0), rejected), rejected)


def output_summary(out_dir: str, names: list[str]) -> list[str]:
    """Summary lines of a finished local run, public values only: releases, streams and epsilon spent per output."""
    lines = []
    for name in names:
        rows, streams, eps, first = 0, [], float("-inf"), None
        for table in release_tables(out_dir, name, ["stream", "mechanism", "epsilon_spent", "epsilon_budget"]):
            rows += table.num_rows
            streams.append(pc.unique(table.column("stream")).cast(pa.string()))  # counted in Arrow, not a set
            eps = max(eps, pc.max(table.column("epsilon_spent")).as_py())
            first = first or table.slice(0, 1).to_pylist()[0]
        if not rows:
            lines.append(f"  {name}: no releases")
            continue
        distinct = pc.count_distinct(pa.chunked_array(streams, pa.string()), mode="only_valid").as_py()
        lines.append(f"  {name}: {rows} releases, {distinct} streams, mechanism {first['mechanism']}, max "
                     f"epsilon_spent {eps:.4g} of budget {first['epsilon_budget']:g}")
    return lines
