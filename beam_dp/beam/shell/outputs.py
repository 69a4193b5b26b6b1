"""The two outputs of every continual transform: privatized releases and the dead letters."""

from __future__ import annotations

from typing import NamedTuple

from apache_beam.pvalue import PCollection

__all__ = ["ContinualOutputs"]


class ContinualOutputs(NamedTuple):
    """``releases``: the privatized rows (or columns); ``dead_letter``: the rejected inputs with a reason."""

    releases: PCollection
    dead_letter: PCollection
