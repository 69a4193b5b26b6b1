"""``NoiseAhead``: a view of a :class:`~beam_dp.core.noise.NoiseSource` that draws the noise of the next
steps of a group of streams in one call.

A mechanism stepping a group draws one cell per stream and step, ``(stream, purpose, (t,))``. Each
array draw has a fixed cost (~0.25 ms for the Philox rounds on small arrays) that a small group pays
at every step. When an engine closes many steps at once (a batch replay, a watermark jump) this view
draws the cells of steps ``t .. t + ahead − 1`` for all the group's streams together, keeps them for
the call and hands them out step by step. Cell draws do not depend on which other cells are drawn
with them (``NoiseSource.draw_cells``), so the values are exactly those of drawing step by step; the
cache holds noise only (never data) and lives for one call.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from beam_dp.core.noise import NoiseSource

__all__ = ["NoiseAhead"]


class NoiseAhead:
    """``source`` with cells of single-integer indices drawn ``ahead`` steps at a time; every other
    draw and attribute is the source's."""

    def __init__(self, source: NoiseSource, ahead: int):
        self._source, self._ahead = source, max(int(ahead), 1)
        self._cache: dict[tuple, dict[int, np.ndarray]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def draw_cells(self, law: str, streams: Sequence[str], purpose: str, index: Sequence[int] | np.ndarray,
                   scale: float, size: int) -> np.ndarray:
        idx = np.asarray(index)
        if self._ahead == 1 or idx.shape != (1,) or not np.issubdtype(idx.dtype, np.integer):
            return self._source.draw_cells(law, streams, purpose, index, scale, size)
        t, n = int(idx[0]), len(streams)
        cells = self._cache.setdefault((law, tuple(streams), purpose, float(scale), int(size)), {})
        if t not in cells:
            steps = np.arange(t, t + self._ahead, dtype=np.int64)
            rows = self._source.draw_cells(law, list(streams) * len(steps), purpose, np.repeat(steps, n)[:, None],
                                           scale, size)
            cells.clear()
            cells.update(zip(steps.tolist(), np.asarray(rows).reshape(len(steps), n, -1)))
        return cells.pop(t)
