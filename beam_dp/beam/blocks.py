"""Per-record families fed in blocks: a parse stage's valid records of one bundle, gathered per stream.

A family whose steps need the records themselves (ERM's labelled examples, an online learner's
records) cannot pre-aggregate like the sums, but it need not send the keyed stage one element per
record either: :class:`BundleBlocks` keeps, for one bundle, each (stream, window)'s validated rows in
arrival order and hands them on as one block — at most ``max_rows`` rows, the rest at the end of
the bundle — so the keyed stage decodes a key's state once per block and closes every count step
the block completes in one call (:meth:`beam_dp.steps.driver.StepDriver.add`).

Nothing here is state: the lists live for one bundle (``start_bundle`` to ``finish_bundle``) and a
retried bundle rebuilds them from its own elements. The order of rows inside a block is their arrival
order in the bundle, as the per-element path fed them; which records share a block depends only on
the bundle, never on their values. A block's ``original`` is :class:`BlockOriginals`, the tuple of its
elements: a dead letter the keyed stage writes for a whole block (its stream ended, its step was
already released) leaves as one dead letter per element (:meth:`BlockOriginals.letters`), as before.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.steps.events import DeadLetter

__all__ = ["BlockOriginals", "BundleBlocks"]


class BlockOriginals(tuple):
    """The elements of one block, in its order (the ``original`` the keyed stage gets with the block)."""

    def letters(self, letter: DeadLetter) -> list[DeadLetter]:
        """A dead letter written for the whole block, as one letter per element."""
        return [letter._replace(element=element) for element in self]


class BundleBlocks:
    """Rows of one bundle by (key, window), ``key`` a stream or a (stream, step); ``make(key, rows,
    originals)`` turns a list of rows and their :class:`BlockOriginals` into the keyed stage's outputs
    (the block's element, and any ``TaggedOutput`` dead letters of rows a block-wide check refused).
    ``add`` returns a full block's outputs (``max_rows`` rows) when one is ready, else nothing."""

    def __init__(self, make: Callable[[Any, list, BlockOriginals], list], max_rows: int):
        self._make, self._max = make, max_rows
        self._open: dict[tuple[Any, Any], tuple[list, list, list]] = {}

    def add(self, key: Any, row: Any, element: Any, timestamp: Any, window: Any) -> list:
        rows, originals, latest = self._open.setdefault((key, window), ([], [], [MIN_TIMESTAMP]))
        rows.append(row)
        originals.append(element)
        if timestamp is not None and timestamp > latest[0]:
            latest[0] = timestamp
        if len(rows) < self._max:
            return []
        del self._open[(key, window)]
        return self._make(key, rows, BlockOriginals(originals))

    def flush(self, where: Callable[[Any], bool] | None = None) -> Iterator[Any]:
        """Every open block's outputs (or those whose key satisfies ``where``: a marker that must follow
        its stream's rows), as windowed values stamped with their latest element's timestamp."""
        for (key, window) in [k for k in self._open if where is None or where(k[0])]:
            rows, originals, latest = self._open.pop((key, window))
            for out in self._make(key, rows, BlockOriginals(originals)):
                if isinstance(out, TaggedOutput):
                    yield TaggedOutput(out.tag, WindowedValue(out.value, latest[0], (window,)))
                else:
                    yield WindowedValue(out, latest[0], (window,))
