"""``python -m beam_dp.report RELEASES [RELEASES ...] --out DIR [--dead-letters GLOB] [--max-streams N]``."""

from __future__ import annotations

import argparse
import sys

from beam_dp.report.figures import make_report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"python -m beam_dp.report: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m beam_dp.report", description=(
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
    args = parser.parse_args(argv)
    try:
        summary = make_report(args.releases, args.out, dead_letters=args.dead_letters,
                              max_streams=args.max_streams, band=args.band)
    except (FileNotFoundError, ValueError) as exc:
        print(f"python -m beam_dp.report: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(summary.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
