"""Moved to :mod:`beam_dp.steps.schema` (Beam-free); this path stays for existing imports."""

from beam_dp.steps.schema import RELEASE_SCHEMA, ReleaseLabels, ReleaseRow, release_to_row

__all__ = ["RELEASE_SCHEMA", "ReleaseLabels", "ReleaseRow", "release_to_row"]
