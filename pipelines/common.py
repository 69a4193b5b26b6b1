"""What every beam_dp job shares: a strict CLI on Beam ``PipelineOptions``, event sources, dead letters.

A job module declares a ``PipelineOptions`` subclass for its own flags and calls :func:`run_cli`
with a ``plan`` function (validate the flags and files, build the params objects; raise
:class:`UsageError` for anything the user must fix) and a ``run`` function (build and run the
pipeline, return the summary text). :func:`run_cli` then gives every job the same behaviour:

* ``--help`` lists the job's flags (any Beam pipeline option is accepted too);
* an unknown flag, a bad flag value, a missing input file or an invalid privacy parameter prints
  **one line** ``<prog>: error: <what to fix>`` on stderr and exits with code 2;
* the default runner is the FnApiRunner (the DirectRunner first tries to download Prism);
* after the run, one summary line from the Beam metrics: events read, steps released, dead letters.

Sources (:func:`add_source_flags`, :class:`ReadEvents`): ``--source files`` (CSV/Parquet batch
replay, columnar ``EventBatch`` blocks), ``--source pubsub`` or ``--source kafka`` (streaming,
Beam's own IO; one JSON event per message). Tests substitute a ``TestStream`` of messages for the
streaming source (``ReadEvents(..., messages=...)``), so the message parsing is tested too.

The noise key never travels as a flag value: jobs take a key *file path* or an *env var name*.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, _BeamArgumentParser

from beam_dp.beam import DeadLetter, NoiseKey, Reason
from beam_dp.beam.parse import DEAD_LETTER
from beam_dp.io import RELEASE_SCHEMA, WriteReleasesToJsonLines, WriteReleasesToParquet

__all__ = [
    "JobOptions",
    "ReadEvents",
    "ReadMessages",
    "UsageError",
    "add_noise_key_flags",
    "add_source_flags",
    "dead_letter_json",
    "match_files",
    "metrics_summary",
    "noise_key_of",
    "params_or_usage_error",
    "run_cli",
    "write_dead_letters",
    "write_releases",
]

log = logging.getLogger("beam_dp.pipelines")


class _JobFlagsFilter(logging.Filter):
    """Beam warns about every flag of a :class:`JobOptions` job when the pipeline runs (it only knows
    the direct ``PipelineOptions`` subclasses); those flags were validated by :func:`check_flags`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Unparseable argument", "Discarding unparseable args"))


logging.getLogger("apache_beam.options.pipeline_options").addFilter(_JobFlagsFilter())

SOURCES = ("files", "pubsub", "kafka")


class UsageError(Exception):
    """Something the user fixes by changing a flag or a file; printed as one line, exit code 2."""


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


def run_cli(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    options_class: type[PipelineOptions],
    plan: Callable[[PipelineOptions], Any],
    run: Callable[[PipelineOptions, Any], str],
) -> int:
    """Parse, validate (``plan``), run (``run``) and print the summary; exit 2 on a usage error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        parser = argparse.ArgumentParser(
            prog=prog, description=description + " Any Apache Beam pipeline option (--runner, --streaming, "
            "Dataflow or Flink options) is accepted too; the default runner is the FnApiRunner.")
        options_class._add_argparse_args(parser)  # pylint: disable=protected-access
        parser.print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_flags(argv, options_class)
        options = PipelineOptions(argv)
        if not any(a == "--runner" or a.startswith("--runner=") for a in argv):
            options.view_as(StandardOptions).runner = "FnApiRunner"  # skip the Prism download attempt
        job_plan = plan(options)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(run(options, job_plan))
    return 0


def params_or_usage_error(build: Callable[[], Any], what: str) -> Any:
    """Build a params object; its ``ValueError`` (invalid privacy parameter) becomes a usage error."""
    try:
        return build()
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def match_files(pattern: str, flag: str = "--input") -> list[str]:
    """Sorted paths matching ``pattern`` (local or any Beam filesystem), or a usage error."""
    from apache_beam.io.filesystems import FileSystems

    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # a bad scheme or an unreachable bucket
        raise UsageError(f"cannot list {flag} {pattern!r}: {type(exc).__name__}") from None
    if not matches:
        raise UsageError(f"no files match {flag} {pattern!r}: check the path")
    return sorted(m.path for m in matches)


# -- noise key -----------------------------------------------------------------------------------
def add_noise_key_flags(group) -> None:
    """Key *location* flags (each also spelled with underscores, as Flex Template parameters are)."""
    group.add_argument("--noise-key-file", "--noise_key_file", dest="noise_key_file", default=None,
                       help="File holding the secret noise key (raw bytes or hex), read on the workers.")
    group.add_argument("--noise-key-env", "--noise_key_env", dest="noise_key_env", default="BEAM_DP_NOISE_KEY",
                       help="Name of the env var holding the noise key as hex, read on the workers. Default: "
                            "%(default)s. Without a key a random one is drawn and the run is not reproducible.")


def noise_key_of(opts) -> NoiseKey:
    """The key *location* (never the key) from the flags; the file must exist here if it is local."""
    key_file = opts.noise_key_file
    if key_file and "://" not in key_file and not Path(key_file).is_file():
        raise UsageError(f"--noise-key-file {key_file!r} does not exist")
    return NoiseKey(env_var=opts.noise_key_env, key_file=key_file)


# -- sources -------------------------------------------------------------------------------------
def add_source_flags(group) -> None:
    group.add_argument("--source", choices=SOURCES, default="files",
                       help="files: batch replay of --input; pubsub / kafka: a streaming job (add --streaming) "
                            "reading one JSON event per message: "
                            '{"stream_id": "s1", "timestamp": 1767225600.5, "value": [0.1, 0.2]}.')
    group.add_argument("--pubsub-subscription", "--pubsub_subscription", dest="pubsub_subscription",
                       default=None,
                       help="projects/P/subscriptions/S to read (--source pubsub).")
    group.add_argument("--pubsub-topic", "--pubsub_topic", dest="pubsub_topic", default=None,
                       help="projects/P/topics/T to read through a temporary subscription (--source pubsub).")
    group.add_argument("--pubsub-timestamp-attribute", "--pubsub_timestamp_attribute",
                       dest="pubsub_timestamp_attribute", default=None,
                       help="Message attribute holding the event time (drives the watermark); default: publish time.")
    group.add_argument("--kafka-bootstrap-servers", "--kafka_bootstrap_servers", dest="kafka_bootstrap_servers",
                       default=None,
                       help="host:port[,host:port] of the Kafka brokers (--source kafka).")
    group.add_argument("--kafka-topic", "--kafka_topic", dest="kafka_topic", default=None,
                       help="Kafka topic to read (--source kafka).")


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
    """One dead letter as a JSON line: stage, reason, value-free detail, stream, the element (repr, cut)."""
    return json.dumps({"stage": stage, "reason": letter.reason, "detail": letter.detail, "stream": letter.stream,
                       "element": repr(letter.element)[:2000]})


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
        with FileSystems.create(path) as fh:
            if self._fmt == "parquet":
                pq.write_table(pa.Table.from_pylist([r._asdict() for r in self._items], schema=RELEASE_SCHEMA), fh)
            else:
                text = "".join((i if isinstance(i, str) else json.dumps(i._asdict(), sort_keys=True)) + "\n"
                               for i in self._items)
                fh.write(text.encode("utf-8"))
        self._items = []


def write_releases(releases: beam.PCollection, out_dir: Path, name: str, fmt: str, streaming: bool):
    """Write release rows to ``<out_dir>/<name>-*.parquet`` (or ``.jsonl``).

    Batch: Beam's Parquet/text sinks. Streaming: one file per bundle (see ``_WriteBundleFiles``).
    """
    if not streaming:
        sink = WriteReleasesToParquet if fmt == "parquet" else WriteReleasesToJsonLines
        return releases | f"Write-{name}" >> sink(str(out_dir / name))
    return releases | f"Write-{name}" >> beam.ParDo(_WriteBundleFiles(str(out_dir / name), fmt))


def write_dead_letters(dead: dict[str, beam.PCollection], out_dir: Path, streaming: bool = False):
    """Write every stage's dead letters as JSON lines to ``<out_dir>/dead_letter-*.jsonl``."""
    tagged = tuple(pc | f"Tag-{stage}" >> beam.Map(dead_letter_json, stage) for stage, pc in dead.items())
    merged = tagged | "AllDeadLetters" >> beam.Flatten()
    if streaming:
        return merged | "WriteDeadLetters" >> beam.ParDo(_WriteBundleFiles(str(out_dir / "dead_letter"), "jsonl"))
    return merged | "WriteDeadLetters" >> beam.io.WriteToText(str(out_dir / "dead_letter"), file_name_suffix=".jsonl")


def metrics_summary(result) -> str:
    """``events read, steps released, dead letters`` from the ``beam_dp/*`` counters of a finished run."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        counters = result.metrics().query(MetricsFilter())["counters"]
    except Exception:  # pragma: no cover - a runner without metrics
        return "  progress: metrics not available on this runner"
    totals: dict[str, int] = {}
    for c in counters:
        if c.key.metric.namespace.startswith("beam_dp/"):
            name = c.key.metric.name
            totals[name] = totals.get(name, 0) + int(c.committed if c.committed is not None else c.attempted or 0)
    return (f"  progress: {totals.get('elements', 0)} events accepted (all transforms), "
            f"{totals.get('releases', 0)} releases, {totals.get('dead_letters', 0)} dead letters (beam metrics)")


def prepare_output(out_dir: Path) -> None:
    """Create the output folder and remove the shards of an earlier batch run (``*-of-*``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*-of-*"):
        old.unlink()


def output_summary(out_dir: Path, names: list[str]) -> list[str]:
    """Summary lines of a finished local run: releases per output, epsilon spent, dead letters by reason."""
    from collections import Counter

    from beam_dp.io import read_releases

    lines = []
    for name in names:
        try:
            rows = read_releases(str(out_dir / f"{name}-*"))
        except FileNotFoundError:
            rows = []
        if not rows:
            lines.append(f"  {name}: no releases")
            continue
        streams = sorted({r["stream"] for r in rows})
        eps = max(r["epsilon_spent"] for r in rows)
        lines.append(f"  {name}: {len(rows)} releases, {len(streams)} streams, mechanism {rows[0]['mechanism']}, "
                     f"max epsilon_spent {eps:.4g} of budget {rows[0]['epsilon_budget']:g}")
    letters = [json.loads(line) for f in sorted(out_dir.glob("dead_letter-*.jsonl"))
               for line in f.read_text().splitlines() if line]
    reasons = Counter(f"{d['stage']}:{d['reason']}" for d in letters)
    lines.append(f"  dead letters: {len(letters)} {dict(sorted(reasons.items())) if reasons else ''}".rstrip())
    return lines
