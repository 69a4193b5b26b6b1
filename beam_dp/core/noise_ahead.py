"""Views of a :class:`~beam_dp.core.noise.NoiseSource` that draw the noise of the next steps in one call.

A mechanism draws the cells of each step when it steps; each array draw has a fixed cost (~0.03 ms
for a handful of cells, ~0.2 ms for the Philox rounds on small arrays) that it pays at every step.
When an engine closes many steps at once (a batch replay, a watermark jump, a block of count-step
records) these views draw the cells of steps ``t .. t + ahead − 1`` together, keep them for the call
and hand them out step by step. Cell draws do not depend on which other cells are drawn with them
(``NoiseSource.draw_cells``), so the values are exactly those of drawing step by step; the cache
holds noise only (never data) and lives for one call.

* :class:`StepsAhead`: ``draw_steps`` — a mechanism names the cells of any step ``s`` (``cells_of(s)``,
  e.g. the window tree's nodes completing at ``s``) and gets those of step ``t``;
* :class:`NoiseAhead`: also ``draw_cells`` of one-integer indices ``(t,)`` (a group of streams drawing
  one cell per stream and step).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from beam_dp.core.noise import NoiseSource

__all__ = ["NoiseAhead", "StepsAhead"]

CellsOf = Callable[[int], Sequence[tuple[int, ...]]]


def _one_cell(step: int) -> tuple[tuple[int, ...]]:
    return ((step,),)


class StepsAhead:
    """``source`` whose ``draw_steps`` draws ``ahead`` steps of cells at a time; every other draw and
    attribute is the source's."""

    def __init__(self, source: NoiseSource, ahead: int):
        self._source, self._ahead = source, max(int(ahead), 1)
        self._cache: dict[tuple, dict[int, np.ndarray]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def draw_steps(self, law: str, streams: Sequence[str], purpose: str, t: int, cells_of: CellsOf,
                   scale: float, size: int) -> np.ndarray:
        """The cells ``cells_of(t)`` (one or more index tuples of one length) of every stream:
        ``(len(streams), len(cells_of(t)), size)``, entry ``[i, j]`` equal to
        ``draw_cells(law, [streams[i]], purpose, cells_of(t)[j], scale, size)[0]``."""
        cells = self._cache.setdefault((law, tuple(streams), purpose, float(scale), int(size), cells_of), {})
        if t not in cells:
            steps = range(t, t + self._ahead)
            plans = [np.asarray(cells_of(s), dtype=np.int64) for s in steps]
            n, counts = len(streams), [len(plan) for plan in plans]
            index = np.concatenate([np.tile(plan, (n, 1)) for plan in plans])
            if len(set(counts)) == 1:  # the usual case: the same cells each step, one step's names repeated
                names = [s for s in streams for _ in range(counts[0])] * len(counts)
            else:
                names = [s for count in counts for s in streams for _ in range(count)]
            rows = np.asarray(self._source.draw_cells(law, names, purpose, index, scale, size))
            cells.clear()
            ends = np.cumsum([n * count for count in counts])
            cells.update((s, part.reshape(n, count, -1))
                         for s, count, part in zip(steps, counts, np.split(rows, ends[:-1])))
        return cells.pop(t)


class NoiseAhead(StepsAhead):
    """:class:`StepsAhead` that also draws the cells of single-integer indices ``(t,)`` ahead."""

    def draw_cells(self, law: str, streams: Sequence[str], purpose: str, index: Sequence[int] | np.ndarray,
                   scale: float, size: int) -> np.ndarray:
        idx = np.asarray(index)
        if self._ahead == 1 or idx.shape != (1,) or not np.issubdtype(idx.dtype, np.integer):
            return self._source.draw_cells(law, streams, purpose, index, scale, size)
        return self.draw_steps(law, streams, purpose, int(idx[0]), _one_cell, scale, size)[:, 0]
