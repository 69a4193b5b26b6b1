"""Answer linear queries privately on growing databases (PMWG, BBScheduler, BBImprover) per stream.

Two inputs: ``--input`` (elements: ``stream_id``, ``timestamp`` and one column per field of the
public ``--universe``) and ``--queries`` (``stream_id``, ``query_id``, ``t`` = the database size the
query is asked at, and one of ``predicate`` (JSON ``{field: selection}``), ``indices`` (JSON list of
cells) or ``w_0..w_{N-1}`` / ``weights``). Elements join in event-time order on the public step
schedule (``--start``, ``--period``, ``--end``). Streaming: one Pub/Sub / Kafka source carries both,
a message with a ``query_id`` is a query. With no ``--input`` the job runs on a small generated
dataset (two shops, a colour x size universe, 30 queries).

    python -m pipelines.growing_db_queries --help
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dp.beam import GrowingDatabaseParams, GrowingDatabaseQueries
from beam_dp.core import StepClock
from beam_dp.mechanisms.universe import Bucketed, Categorical, IntRange, Universe
from pipelines.common import (
    JobOptions,
    UsageError,
    add_noise_key_flags,
    add_source_flags,
    check_source,
    match_files,
    metrics_summary,
    noise_key_of,
    output_summary,
    params_or_usage_error,
    prepare_output,
    run_cli,
    write_dead_letters,
    write_releases,
)
from pipelines.records import ReadRecords, number

log = logging.getLogger("beam_dp.growing_db_queries")

PROG = "python -m pipelines.growing_db_queries"
DEMO_UNIVERSE = '{"colour": ["red", "green", "blue", "grey"], "size": {"edges": [0, 1, 2, 5, 10]}}'
DEMO_START, DEMO_PERIOD, DEMO_END = 0.0, 10.0, 100.0


class GrowingDbOptions(JobOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp growing_db_queries")
        g.add_argument("--input", default=None,
                       help="Element files (CSV/Parquet/JSON lines): stream_id, timestamp, one column per universe "
                            "field. Default: a generated demo dataset.")
        g.add_argument("--queries", default=None,
                       help="Query files (CSV/Parquet/JSON lines): stream_id, query_id, t, and predicate (JSON text), "
                            "indices (JSON list) or w_0..w_{N-1}. Required with --input.")
        add_source_flags(g)
        g.add_argument("--output", default="output/growing_db",
                       help="Output folder: answers-*.parquet (synthetic-* with --snapshots true), "
                            "dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--universe", default=None,
                       help='Public universe as JSON: {"field": [categories] | {"edges": [e0, .., ek]} | '
                            '{"range": k}, ...} (fields in this order). Required with --input or a stream.')
        g.add_argument("--n", type=int, default=20, help="Initial database size before the first query. Default: %(default)s")
        g.add_argument("--mechanism", choices=("pmwg", "bbscheduler", "bbimprover"), default="pmwg",
                       help="PMWG (private multiplicative weights) or a black-box scheduler. Default: %(default)s")
        g.add_argument("--epsilon", type=float, default=1.0, help="Privacy budget per element. Default: %(default)s")
        g.add_argument("--delta", type=float, default=0.0, help="delta (> 0 for bbimprover). Default: %(default)s")
        g.add_argument("--alpha", type=float, default=0.25, help="pmwg: target accuracy. Default: %(default)s")
        g.add_argument("--beta", type=float, default=0.05, help="Schedulers: failure probability. Default: %(default)s")
        g.add_argument("--gamma", type=float, default=None, help="bbscheduler: growth exponent (default: the mechanism's).")
        g.add_argument("--start", type=float, default=None, help="Public start of the step schedule, epoch seconds.")
        g.add_argument("--period", type=float, default=None, help="Step length in seconds.")
        g.add_argument("--end", type=float, default=None,
                       help="Public end (exclusive), epoch seconds (required for a batch replay).")
        g.add_argument("--snapshots", choices=("false", "true"), default="false",
                       help="Also release the public synthetic histogram as steps close. Default: %(default)s")
        g.add_argument("--streams", default=None, help="Comma-separated declared streams.")
        add_noise_key_flags(g)


@dataclass(frozen=True)
class Plan:
    demo: bool
    elements: str | None
    queries: str | None
    out_dir: Path
    params: GrowingDatabaseParams
    streaming: bool


def parse_universe(text: str) -> Universe:
    """The ``--universe`` JSON -> a :class:`Universe` (a usage error when it is not one)."""
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict) or not spec:
            raise ValueError("expected a JSON object of fields")
        fields = []
        for name, field in spec.items():
            if isinstance(field, list):
                fields.append(Categorical(name, tuple(field)))
            elif isinstance(field, dict) and set(field) == {"edges"}:
                fields.append(Bucketed(name, tuple(field["edges"])))
            elif isinstance(field, dict) and set(field) == {"range"}:
                fields.append(IntRange(name, field["range"]))
            else:
                raise ValueError(f"field {name!r}: a list of categories, {{\"edges\": [...]}} or {{\"range\": k}}")
        return Universe(fields)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--universe: {exc}") from None


def plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(GrowingDbOptions)
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and (opts.input or opts.queries):
        raise UsageError(f"--input and --queries read files: drop them with --source {opts.source}")
    out_dir = Path(opts.output)
    demo = opts.input is None and opts.source == "files"
    if demo:
        if opts.queries:
            raise UsageError("--queries needs --input (the demo dataset brings its own queries)")
        universe = parse_universe(opts.universe or DEMO_UNIVERSE)
        start, period, end = DEMO_START, DEMO_PERIOD, DEMO_END
        elements, queries = str(out_dir / "demo_elements.csv"), str(out_dir / "demo_queries.jsonl")
    else:
        if opts.universe is None:
            raise UsageError("--universe is required: the universe is public and never read from data")
        universe = parse_universe(opts.universe)
        missing = [f for f, v in (("--start", opts.start), ("--period", opts.period)) if v is None]
        if opts.source == "files" and opts.end is None:
            missing.append("--end")
        if missing:
            raise UsageError(f"{', '.join(missing)} required: the step schedule is public and never read from data")
        start, period, end = opts.start, opts.period, opts.end
        elements, queries = opts.input, opts.queries
        if opts.source == "files":
            if not queries:
                raise UsageError("--queries is required with --input")
            match_files(elements, "--input")
            match_files(queries, "--queries")
    clock = params_or_usage_error(lambda: StepClock(start=start, period=period, end=end), "step schedule")
    params = params_or_usage_error(lambda: GrowingDatabaseParams(
        universe=universe, n=opts.n, epsilon=opts.epsilon, delta=opts.delta, clock=clock, mechanism=opts.mechanism,
        alpha=opts.alpha, beta=opts.beta, gamma=opts.gamma, snapshots=opts.snapshots == "true",
        streams=tuple(s for s in opts.streams.split(",") if s) if opts.streams else None,
        noise_key=noise_key_of(opts)), opts.mechanism)
    return Plan(demo, elements, queries, out_dir, params, streaming)


# -- rows -> the transform's elements and queries -------------------------------------------------
def _field_value(field, value: Any) -> Any:
    if isinstance(field, Categorical):
        if value not in field.categories and str(value) in field.categories:
            return str(value)  # a numeric-looking category read from CSV
        return value
    value = number(value)
    if isinstance(field, IntRange) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def to_element(row: dict, universe: Universe) -> dict:
    """``{stream_id, timestamp, <field>: ..}`` (or ``record: {..}``) -> the transform's element mapping."""
    record = row.get("record") if isinstance(row.get("record"), dict) else row
    return {"stream_id": row.get("stream_id"), "timestamp": row.get("timestamp"),
            "value": {f.name: _field_value(f, record.get(f.name)) for f in universe.fields}}


def _json_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # the transform dead-letters it
    return value


def to_query(row: dict, size: int) -> dict:
    """``{stream_id, query_id, t, predicate | indices | w_0.. | weights}`` -> the transform's query mapping."""
    t = number(row.get("t"))
    query = {"stream_id": row.get("stream_id"), "query_id": row.get("query_id"),
             "t": int(t) if isinstance(t, float) and t.is_integer() else t,
             "weights": None, "predicate": None, "indices": None}
    for name in ("predicate", "indices"):
        if row.get(name) not in (None, ""):
            query[name] = _json_text(row[name])
    if row.get("weights") is not None:
        query["weights"] = _json_text(row["weights"])
    elif "w_0" in row:
        query["weights"] = [number(row.get(f"w_{i}")) for i in range(size)]
    return query


def _is_query(row: dict) -> bool:
    return "query_id" in row


def build(pipeline: beam.Pipeline, job: Plan, opts: GrowingDbOptions, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``GrowingDatabaseOutputs``."""
    universe = job.params.universe
    if messages is None and opts.source == "files":
        rows, bad_rows = pipeline | "ReadElements" >> ReadRecords(opts, job.elements)
        query_rows, bad_queries = pipeline | "ReadQueries" >> ReadRecords(opts, job.queries)
        dead = {"read": bad_rows, "read_queries": bad_queries}
    else:  # one stream of messages: a message with a query_id is a query
        both, bad_rows = pipeline | "ReadMessages" >> ReadRecords(opts, None, messages)
        rows = both | "Elements" >> beam.Filter(lambda r: not _is_query(r))
        query_rows = both | "Queries" >> beam.Filter(_is_query)
        dead = {"read": bad_rows}
    out = {"elements": rows | "ToElements" >> beam.Map(to_element, universe),
           "queries": query_rows | "ToQueries" >> beam.Map(to_query, universe.size)} | "GrowingDatabaseQueries" >> \
        GrowingDatabaseQueries(job.params)
    write_releases(out.releases, job.out_dir, "answers", opts.format, job.streaming)
    if job.params.snapshots:
        write_releases(out.snapshots, job.out_dir, "synthetic", opts.format, job.streaming)
    dead["answers"] = out.dead_letter
    write_dead_letters(dead, job.out_dir, job.streaming)
    return out


def write_demo(elements: str, queries: str, seed: int = 7) -> int:
    """Two shops selling items (colour, size) over 10 steps, and 15 queries per shop; returns the count."""
    rng = np.random.default_rng(seed)
    colours = ("red", "green", "blue", "grey")
    lines, qlines = ["stream_id,timestamp,colour,size"], []
    for shop in ("shop-a", "shop-b"):
        ts = np.sort(rng.uniform(DEMO_START, DEMO_END, 80))
        for i, t in enumerate(ts):
            colour = colours[min(3, int(rng.integers(0, 2)) + i // 30)]  # tastes drift
            lines.append(f"{shop},{t:.3f},{colour},{rng.uniform(0, 10):.3f}")
        for k, t in enumerate(range(20, 80, 4)):
            clause = {"colour": [colours[k % 4]]} if k % 2 else {"size": [0, 2]}
            qlines.append(json.dumps({"stream_id": shop, "query_id": f"q{k:02d}", "t": t, "predicate": clause}))
    Path(elements).parent.mkdir(parents=True, exist_ok=True)
    Path(elements).write_text("\n".join(lines) + "\n")
    Path(queries).write_text("\n".join(qlines) + "\n")
    return len(lines) - 1


def run(options: PipelineOptions, job: Plan, messages=None) -> str:
    opts = options.view_as(GrowingDbOptions)
    prepare_output(job.out_dir)
    if job.demo:
        log.info("wrote the demo dataset (%d elements) to %s", write_demo(job.elements, job.queries), job.elements)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, job, opts, messages)
    result = pipeline.run()
    result.wait_until_finish()
    source = "generated demo dataset" if job.demo else (opts.input or opts.source)
    names = ["answers"] + (["synthetic"] if job.params.snapshots else [])
    lines = [f"beam_dp growing_db_queries ({job.params.mechanism}): releases written under {job.out_dir.resolve()}",
             f"  input: {source}; universe N={job.params.universe.size}; {job.params.clock.last_step} steps"]
    return "\n".join(lines + output_summary(job.out_dir, names) + [metrics_summary(result)])


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, prog=PROG, description=__doc__.split("\n\n")[0], options_class=GrowingDbOptions,
                   plan=plan, run=run)


if __name__ == "__main__":
    raise SystemExit(main())
