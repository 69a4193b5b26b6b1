"""``python -m beam_dp.report JOB_FOLDER|RELEASES [...] --out DIR [--dead-letters GLOB] [--max-streams N]``."""

from __future__ import annotations

import logging
import sys

from beam_dp.cli import OneLineParser, exit_now, guarded
from beam_dp.report.figures import make_report


def _log_progress_to_stderr() -> None:
    """The command's own process: the ``beam_dp.report`` logger's INFO lines (progress, when stderr is
    not a terminal) go to stderr, with a time stamp."""
    logger = logging.getLogger("beam_dp.report")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    command = argv is None
    parser = OneLineParser(prog="python -m beam_dp.report", description=(
        "Draw PNG figures of beam_dp releases: released values over time with their noise bands "
        "(meta noise_std) for the first --max-streams streams by name, the privacy spend per step over "
        "every stream, model-snapshot accuracy where the release meta has one; print a summary (rows "
        "read, streams, steps released, dead letters, which streams each figure draws)."))
    parser.add_argument("releases", nargs="+", help="A job's output folder (its manifest names the release files, as "
                        "for python -m beam_dp.verify), or release files (Parquet or JSON lines): globs, file "
                        "prefixes or files; a glob skips the manifest, JSON summaries and dead letters.")
    parser.add_argument("--out", required=True, help="Folder for the PNG figures and summary.json.")
    parser.add_argument("--dead-letters", dest="dead_letters", default=None,
                        help="Glob of dead-letter JSON-lines files; default: dead_letter* next to the releases.")
    parser.add_argument("--max-streams", dest="max_streams", type=int, default=6,
                        help="Streams drawn per mechanism (the first N by name; the spend figure and the summary "
                             "cover every stream). Default: %(default)s")
    parser.add_argument("--band", type=float, default=2.0,
                        help="Half-width of the noise band in standard deviations. Default: %(default)s")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an unexpected failure")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if command:
        _log_progress_to_stderr()

    def report() -> int:
        summary = make_report(args.releases, args.out, dead_letters=args.dead_letters, max_streams=args.max_streams,
                              band=args.band)
        print("\n".join(summary.lines()))
        return 0

    code = guarded(parser.prog, args.verbose, report, (FileNotFoundError, ValueError), command=command)
    if command:  # nothing left to write: skip the interpreter's teardown
        exit_now(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
