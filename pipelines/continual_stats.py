"""Main job: continual private sums (and windowed sums) per stream from an event file.

Reads CSV or Parquet events (``stream_id, timestamp, value`` or ``value_0..value_{d-1}``), runs
``ContinualSum`` (and ``WindowedSum`` when ``--window`` is given) per stream, writes the releases to
Parquet (or JSON lines) and dead letters to JSON lines, and prints a short summary.

With no ``--input`` it runs on the embedded demo dataset (``pipelines/demo_data.py``).
``--epsilon`` is the total budget of the job: with ``--window`` it is split equally between the
two transforms (sequential composition), and the summary says so.

    python -m pipelines.continual_stats --help
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_dp.beam import ContinualSum, ContinualSumParams, NoiseKey, WindowedSum, WindowedSumParams
from beam_dp.core import StepClock
from beam_dp.io import WriteReleasesToJsonLines, WriteReleasesToParquet, read_releases
from beam_dp.io.sources import ReadEventFiles, value_columns
from pipelines import demo_data

log = logging.getLogger("beam_dp.continual_stats")


class ContinualStatsOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("beam_dp continual_stats")
        g.add_argument("--input", default=None,
                       help="CSV/Parquet event file or glob with columns stream_id, timestamp (epoch seconds or "
                            "ISO-8601), value or value_0..value_{d-1}. Default: the embedded demo dataset.")
        g.add_argument("--output", default="output/continual_stats",
                       help="Output folder; releases go to <output>/sum-*.parquet (and windowed-*), dead letters "
                            "to <output>/dead_letter-*.jsonl. Default: %(default)s")
        g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="Release file format.")
        g.add_argument("--epsilon", type=float, default=1.0,
                       help="Total privacy budget epsilon of the job per contribution. Default: %(default)s")
        g.add_argument("--delta", type=float, default=0.0,
                       help="Total delta; must be > 0 with --noise gaussian and 0 with gamma. Default: %(default)s")
        g.add_argument("--noise", choices=("gamma", "gaussian"), default="gamma",
                       help="gamma: K-norm noise, pure epsilon-DP under the L2 bound; gaussian: (epsilon, delta)-DP.")
        g.add_argument("--calibration", choices=("paper", "analytic"), default="paper",
                       help="Gaussian only: the paper's sigma (certified exactly, refused if it fails) or the "
                            "smallest exact (analytic) sigma.")
        g.add_argument("--clip-bound", dest="clip_bound", type=float, default=1.0,
                       help="L2 norm bound R each contribution is clipped to (sensitivity 2R). Default: %(default)s")
        g.add_argument("--start", type=float, default=None,
                       help="Public start of the step schedule, epoch seconds (required with --input).")
        g.add_argument("--period", type=float, default=None,
                       help="Step length in seconds (required with --input).")
        g.add_argument("--end", type=float, default=None,
                       help="Public end (exclusive) of the replay, epoch seconds (required with --input).")
        g.add_argument("--horizon", type=int, default=None,
                       help="Known horizon in steps for ContinualSum (binary tree); default: unbounded.")
        g.add_argument("--unbounded", choices=("hybrid", "doubling"), default="hybrid",
                       help="Unbounded-horizon construction when --horizon is not given. Default: %(default)s")
        g.add_argument("--window", type=int, default=None,
                       help="Also run WindowedSum protecting the last W steps (privacy expiration).")
        g.add_argument("--streams", default=None,
                       help="Comma-separated list of declared streams: only these are released, from step 1, "
                            "and events of other streams are dead-lettered.")
        g.add_argument("--noise-key-file", dest="noise_key_file", default=None,
                       help="File holding the secret noise key (raw bytes or hex), read on the workers.")
        g.add_argument("--noise-key-env", dest="noise_key_env", default="BEAM_DP_NOISE_KEY",
                       help="Env var holding the noise key as hex, read on the workers. Default: %(default)s. "
                            "Without a key a random one is drawn and the run is not reproducible.")


def _help_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.continual_stats",
        description=__doc__.split("\n\n")[0] + " Any other Apache Beam pipeline option (e.g. --runner, "
                    "--streaming, Dataflow options) is passed through; the default runner is FnApiRunner.",
    )
    ContinualStatsOptions._add_argparse_args(parser)
    return parser


def build(pipeline: beam.Pipeline, opts: ContinualStatsOptions, out_dir: Path) -> dict:
    """Add the job to ``pipeline``; returns what the summary needs."""
    demo = opts.input is None
    if demo:
        data_path = out_dir / "demo_events.csv"
        n_events = demo_data.write_demo_events(data_path)
        log.info("wrote the embedded demo dataset (%d events) to %s", n_events, data_path)
        pattern, start, period, end = str(data_path), demo_data.DEMO_START, demo_data.DEMO_PERIOD, demo_data.DEMO_END
        streams = opts.streams.split(",") if opts.streams else list(demo_data.DEMO_STREAMS)
        window = opts.window or 24
    else:
        if None in (opts.start, opts.period, opts.end):
            raise SystemExit("--start, --period and --end are required with --input (the schedule is public)")
        pattern, start, period, end = opts.input, opts.start, opts.period, opts.end
        streams = opts.streams.split(",") if opts.streams else None
        window = opts.window
    dim = _dim_of(pattern)
    clock = StepClock(start=start, period=period, end=end)
    parts = 2 if window else 1
    common = dict(
        dim=dim, epsilon=opts.epsilon / parts, delta=opts.delta / parts, clip_bound=opts.clip_bound,
        noise=opts.noise, calibration=opts.calibration, clock=clock,
        streams=tuple(streams) if streams else None,
        noise_key=NoiseKey(env_var=opts.noise_key_env, key_file=opts.noise_key_file),
    )
    batches, bad_rows = pipeline | "ReadEvents" >> ReadEventFiles(pattern)
    sink = WriteReleasesToParquet if opts.format == "parquet" else WriteReleasesToJsonLines
    outputs = {"sum": batches | "ContinualSum" >> ContinualSum(
        ContinualSumParams(horizon=opts.horizon, unbounded=opts.unbounded, **common))}
    if window:
        outputs["windowed"] = batches | "WindowedSum" >> WindowedSum(WindowedSumParams(window=window, **common))
    dead = [bad_rows | "TagRead" >> beam.Map(_dead_letter_json, "read")]
    for name, out in outputs.items():
        out.releases | f"Write-{name}" >> sink(str(out_dir / name))
        dead.append(out.dead_letter | f"Tag-{name}" >> beam.Map(_dead_letter_json, name))
    (
        tuple(dead)
        | "AllDeadLetters" >> beam.Flatten()
        | "WriteDeadLetters" >> beam.io.WriteToText(str(out_dir / "dead_letter"), file_name_suffix=".jsonl")
    )
    return {"demo": demo, "dim": dim, "clock": clock, "window": window, "parts": parts, "outputs": list(outputs)}


def _dead_letter_json(letter, stage: str) -> str:
    """One dead letter as a JSON line; each transform that rejects an event writes its own line."""
    return json.dumps({"stage": stage, "reason": letter.reason, "detail": letter.detail, "stream": letter.stream,
                       "element": repr(letter.element)[:2000]})


def _dim_of(pattern: str) -> int:
    from apache_beam.io.filesystems import FileSystems
    import pyarrow.parquet as pq

    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise SystemExit(f"no input files match {pattern!r}")
    path = sorted(m.path for m in matches)[0]
    with FileSystems.open(path) as fh:
        if path.endswith(".parquet"):
            names = pq.ParquetFile(fh).schema_arrow.names
        else:
            names = [n.strip() for n in fh.readline().decode("utf-8").split(",")]
    return len(value_columns(names))


def summarize(out_dir: Path, info: dict, opts: ContinualStatsOptions) -> str:
    lines = [f"beam_dp continual_stats: releases written under {out_dir.resolve()}"]
    lines.append(f"  input: {'embedded demo dataset' if info['demo'] else opts.input}; dim={info['dim']}; "
                 f"steps of {info['clock'].period:g}s, {info['clock'].last_step} steps")
    for name in info["outputs"]:
        rows = read_releases(str(out_dir / f"{name}-*"))
        if not rows:
            lines.append(f"  {name}: no releases (no valid events and no declared streams)")
            continue
        streams = sorted({r["stream"] for r in rows})
        eps = max(r["epsilon_spent"] for r in rows)
        budget = rows[0]["epsilon_budget"]
        last = [r for r in rows if r["step"] == info["clock"].last_step]
        noise_std = last[0]["meta"].get("noise_std") if last else None
        lines.append(f"  {name}: {len(rows)} releases, {len(streams)} streams, mechanism {rows[0]['mechanism']}, "
                     f"max epsilon_spent {eps:.4g} of budget {budget:g}"
                     + (f", noise std at the last step {noise_std:.3g}" if noise_std else ""))
    dead_files = sorted(out_dir.glob("dead_letter-*.jsonl"))
    letters = [json.loads(line) for f in dead_files for line in f.read_text().splitlines() if line]
    reasons = Counter(f"{d['stage']}:{d['reason']}" for d in letters)
    lines.append(f"  dead letters: {len(letters)} {dict(sorted(reasons.items())) if reasons else ''}".rstrip())
    if info["parts"] == 2:
        lines.append(f"  total privacy: the two transforms each spend epsilon={opts.epsilon / 2:g}: "
                     f"{opts.epsilon:g} per contribution in all")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _help_parser().print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = PipelineOptions(argv)
    if "--runner" not in " ".join(argv):
        options.view_as(StandardOptions).runner = "FnApiRunner"  # skip the Prism download attempt
    opts = options.view_as(ContinualStatsOptions)
    out_dir = Path(opts.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*-of-*"):
        old.unlink()
    with beam.Pipeline(options=options) as pipeline:
        info = build(pipeline, opts, out_dir)
    print(summarize(out_dir, info, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
