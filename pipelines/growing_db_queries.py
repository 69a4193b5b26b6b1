"""Answer linear queries privately on growing databases (PMWG, BBScheduler, BBImprover) per stream.

Two inputs: ``--input`` (elements: ``stream_id``, ``timestamp`` and one column per field of the
public ``--universe``) and ``--queries`` (``stream_id``, ``query_id``, ``t`` = the database size the
query is asked at, and one of ``predicate`` (JSON ``{field: selection}``), ``indices`` (JSON list of
cells) or ``w_0..w_{N-1}`` / ``weights``). Elements join in event-time order on the public step
schedule (``--start``, ``--period``, ``--end``). CSV / Parquet elements are read in columns (one
block per Arrow batch, checked in vectorised passes; the same releases and dead letters as row by row). Streaming: one Pub/Sub / Kafka source carries both,
a message with a ``query_id`` is a query. With no ``--input`` the job runs on a small generated
dataset (two shops, a colour x size universe, 30 queries). With ``--privacy-unit-column COL
--max-unit-records K`` (files, or the element messages' field COL) every answer protects one unit's at most ``K``
elements instead of one element; queries carry no unit (``pipelines.record_units``, ``docs/growing_db.md``).

    python -m pipelines.growing_db_queries --help
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipelines.outputs import private_dir
from pipelines.paths import join, write_text
from pipelines.record_units import record_unit, unit_id, with_unit
from pipelines.rows import number, require_columns
from pipelines.runner import (
    Job,
    UsageError,
    lateness,
    noise_key_of,
    options_class,
    params_or_usage_error,
    run_cli,
    split_list,
)

NAME = "growing_db_queries"
PROG = f"python -m pipelines.{NAME}"
DEMO_UNIVERSE = '{"colour": ["red", "green", "blue", "grey"], "size": {"edges": [0, 1, 2, 5, 10]}}'
DEMO_START, DEMO_PERIOD, DEMO_END = 0.0, 10.0, 100.0


def __getattr__(name: str):  # the options class needs Beam: built on first use, not at import (fast --help)
    if name == "GrowingDbOptions":
        return options_class(NAME)
    raise AttributeError(name)


@dataclass(frozen=True)
class Plan:
    demo: bool
    elements: str | None
    queries: str | None
    out_dir: str
    params: Any
    streaming: bool

    @property
    def outputs(self) -> list[str]:
        return ["answers"] + (["synthetic"] if self.params.snapshots else [])


def parse_universe(text: str):
    """The ``--universe`` JSON -> a :class:`Universe` (a usage error when it is not one)."""
    from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, IntRange, Universe

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


def plan(options) -> Plan:
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.beam import GrowingDatabaseParams
    from pipelines.common import check_source
    from pipelines.spec import step_clock

    opts = options.view_as(options_class(NAME))
    streaming = bool(options.view_as(StandardOptions).streaming)
    check_source(opts, streaming)
    if opts.source != "files" and (opts.input or opts.queries):
        raise UsageError(f"--input and --queries read files: drop them with --source {opts.source}")
    out_dir = opts.output
    demo = opts.input is None and opts.source == "files"
    if demo:
        if opts.queries:
            raise UsageError("--queries needs --input (the demo dataset brings its own queries)")
        universe = parse_universe(opts.universe or DEMO_UNIVERSE)
        start, period, end = DEMO_START, DEMO_PERIOD, DEMO_END
        elements, queries = (join(private_dir(opts), name) for name in ("demo_elements.csv", "demo_queries.jsonl"))
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
            from pipelines.records import column_names

            header = column_names(elements, "--input")
            fields = () if "record" in header else tuple(f.name for f in universe.fields)  # JSON: {"record": {..}}
            require_columns(header, ("stream_id", "timestamp") + fields, "--input")
            require_columns(column_names(queries, "--queries"), ("stream_id", "query_id", "t"), "--queries")
    clock = params_or_usage_error(lambda: step_clock(opts, start, period, end), "step schedule")
    unit = record_unit(opts, demo, elements)
    params = params_or_usage_error(lambda: GrowingDatabaseParams(
        universe=universe, n=opts.n, epsilon=opts.epsilon, delta=opts.delta, clock=clock, mechanism=opts.mechanism,
        alpha=opts.alpha, a=opts.a, xi_n=opts.xi_n, beta=opts.beta, gamma=opts.gamma, snapshots=opts.snapshots,
        streams=split_list(opts.streams, "--streams"), noise_key=noise_key_of(opts),
        **lateness(opts, GrowingDatabaseParams)), opts.mechanism)
    return Plan(demo, elements, queries, out_dir, with_unit(params, unit, "privacy unit"), streaming)


# -- rows -> the transform's elements and queries -------------------------------------------------
def _field_value(field, value: Any) -> Any:
    from beam_dp.mechanisms.growing_db.universe import Categorical, IntRange

    if isinstance(field, Categorical):
        if value not in field.categories and str(value) in field.categories:
            return str(value)  # a numeric-looking category read from CSV
        return value
    value = number(value)
    if isinstance(field, IntRange) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def to_element(row: dict, universe) -> dict:
    """``{stream_id, timestamp, <field>: ..}`` (or ``record: {..}``) -> the transform's element mapping."""
    record = row.get("record") if isinstance(row.get("record"), dict) else row
    return {"stream_id": row.get("stream_id"), "timestamp": row.get("timestamp"),
            "value": {f.name: _field_value(f, record.get(f.name)) for f in universe.fields}}


def to_unit_element(row: dict, universe, column: str) -> tuple:
    """A row with a unit column -> ``(stream_id, timestamp, record, unit id)`` (the unit stage strips the id)."""
    element = to_element(row, universe)
    return element["stream_id"], element["timestamp"], element["value"], unit_id(row.get(column))


def elements(universe):
    """How the job reads its elements (``pipelines.records.Elements``): files in columns (a bucketed
    field's cells as numbers, the others once per distinct cell by ``_field_value``), messages and
    odd rows by ``to_element``."""
    from beam_dp.mechanisms.growing_db.universe import Bucketed
    from pipelines.records import Elements

    fields = tuple((f.name, None if isinstance(f, Bucketed) else partial(_field_value, f)) for f in universe.fields)
    return Elements(fields, partial(to_element, universe=universe))


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


def build(pipeline, job: Plan, opts, messages=None):
    """Add the job to ``pipeline``; returns the transform's ``GrowingDatabaseOutputs``."""
    import apache_beam as beam

    from beam_dp.beam import GrowingDatabaseQueries
    from pipelines.common import write_dead_letters, write_releases
    from pipelines.records import ReadRecords, Records

    universe, unit = job.params.universe, job.params.privacy_unit
    if messages is None and opts.source == "files":
        if unit is None:  # elements in columns: one ElementColumns per Arrow batch
            element_blocks, bad_rows = pipeline | "ReadElements" >> ReadRecords(opts, job.elements, None,
                                                                                elements(universe))
        else:  # one row at a time, with its unit id (the columnar blocks have no unit column)
            rows, bad_rows = pipeline | "ReadElements" >> ReadRecords(opts, job.elements)
            element_blocks = rows | "ToUnitElements" >> beam.Map(to_unit_element, universe, unit.column)
        queries, bad_queries = pipeline | "ReadQueries" >> ReadRecords(
            opts, job.queries, None, Records(partial(to_query, size=universe.size)))
        dead = {"read": bad_rows, "read_queries": bad_queries}
    else:  # one stream of messages: a message with a query_id is a query
        both, bad_rows = pipeline | "ReadMessages" >> ReadRecords(opts, None, messages)
        rows = both | "Elements" >> beam.Filter(lambda r: not _is_query(r))
        element_blocks = (rows | "ToElements" >> beam.Map(to_element, universe) if unit is None
                          else rows | "ToUnitElements" >> beam.Map(to_unit_element, universe, unit.column))
        queries = both | "Queries" >> beam.Filter(_is_query) | "ToQueries" >> beam.Map(to_query, universe.size)
        dead = {"read": bad_rows}
    out = {"elements": element_blocks, "queries": queries} | "GrowingDatabaseQueries" >> GrowingDatabaseQueries(
        job.params)
    write_releases(out.releases, job.out_dir, "answers", opts.format, job.streaming)
    if job.params.snapshots:
        write_releases(out.snapshots, job.out_dir, "synthetic", opts.format, job.streaming)
    dead["answers"] = out.dead_letter
    write_dead_letters(dead, private_dir(opts), job.streaming)
    return out


def write_demo(elements: str, queries: str, seed: int = 7) -> int:
    """Two shops selling items (colour, size) over 10 steps, and 15 queries per shop; returns the count."""
    import numpy as np

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
    write_text(elements, "\n".join(lines) + "\n")
    write_text(queries, "\n".join(qlines) + "\n")
    return len(lines) - 1


def summary(job: Plan, opts) -> list[str]:
    source = "generated demo dataset" if job.demo else (opts.input or opts.source)
    return [f"  {job.params.mechanism}; input: {source}; universe N={job.params.universe.size}; "
            f"{job.params.clock.last_step} steps"]


def _write_demo(job: Plan) -> str:
    return f"wrote the demo dataset ({write_demo(job.elements, job.queries)} elements) to {job.elements}"


JOB = Job(NAME, __doc__.split("\n\n")[0], plan, build, summary, _write_demo)


def run(options, job: Plan, messages=None) -> str:
    """Run a planned job (tests pass ``messages``, a ``TestStream`` in place of Pub/Sub or Kafka)."""
    from pipelines.runner import run as run_job

    return run_job(options, JOB, job, messages)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, JOB)


if __name__ == "__main__":
    raise SystemExit(main())
