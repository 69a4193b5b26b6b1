"""Figures and a summary of a job's releases: ``python -m beam_dp.report JOB_FOLDER --out DIR``.

See :func:`beam_dp.report.figures.make_report` and docs/report.md. Reads the releases an Arrow batch
at a time (memory grows with the streams, not the releases). Needs matplotlib.
"""

from beam_dp.report.figures import make_report

__all__ = ["make_report"]
