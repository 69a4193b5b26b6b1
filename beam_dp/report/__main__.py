"""``python -m beam_dp.report RELEASES [RELEASES ...] --out DIR [--dead-letters GLOB] [--max-streams N]``."""

from __future__ import annotations

from beam_dp.cli import OneLineParser, guarded
from beam_dp.report.figures import make_report


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m beam_dp.report", description=(
        "Draw PNG figures of beam_dp releases: released values over time with their noise bands "
        "(meta noise_std), the privacy spend per stream, model-snapshot accuracy where the release meta "
        "has one; print a summary (rows read, steps released, dead letters)."))
    parser.add_argument("releases", nargs="+", help="Release files (Parquet or JSON lines) or globs.")
    parser.add_argument("--out", required=True, help="Folder for the PNG figures and summary.json.")
    parser.add_argument("--dead-letters", dest="dead_letters", default=None,
                        help="Glob of dead-letter JSON-lines files; default: dead_letter* next to the releases.")
    parser.add_argument("--max-streams", dest="max_streams", type=int, default=6,
                        help="Streams drawn per figure (the first N in name order). Default: %(default)s")
    parser.add_argument("--band", type=float, default=2.0,
                        help="Half-width of the noise band in standard deviations. Default: %(default)s")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an unexpected failure")
    args = parser.parse_args(argv)

    def report() -> int:
        print(make_report(args.releases, args.out, dead_letters=args.dead_letters, max_streams=args.max_streams,
                          band=args.band).line())
        return 0

    return guarded(parser.prog, args.verbose, report, (FileNotFoundError, ValueError))


if __name__ == "__main__":
    raise SystemExit(main())
