"""Figures and a summary of a release file: ``python -m beam_dp.report RELEASES --out DIR``.

See :func:`beam_dp.report.figures.make_report`. Needs matplotlib (the ``report`` extra).
"""

from beam_dp.report.figures import make_report

__all__ = ["make_report"]
