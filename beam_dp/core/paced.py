"""``Paced``: a computation cut into small units of work, run a few units at a time or all at once.

The computation is a generator that ``yield``s between units and ``return``s its result; ``advance``
runs some units (spread over a stream's steps, so that no step pays for the whole computation),
``finish`` runs what is left and returns the result. The units run in the same order however they are
paced, so a computation finished at once gives the same floats as a paced one. Generators do not
pickle: an owner keeps its ``Paced`` jobs in worker-local caches, dropped when it is pickled.
"""

from __future__ import annotations

from typing import Generator, Generic, TypeVar

__all__ = ["Paced", "run_to_end"]

T = TypeVar("T")


def run_to_end(units: Generator[None, None, T]) -> T:
    """The result of a paced computation, all its units run now."""
    while True:
        try:
            next(units)
        except StopIteration as stop:
            return stop.value


class Paced(Generic[T]):
    """A paced computation (module docstring)."""

    def __init__(self, units: Generator[None, None, T]):
        self._units: Generator[None, None, T] | None = units
        self._result: T | None = None

    def advance(self, units: int = 1) -> bool:
        """Run up to ``units`` more units; ``True`` once the computation is done."""
        for _ in range(units):
            if self._units is None:
                break
            try:
                next(self._units)
            except StopIteration as stop:
                self._units, self._result = None, stop.value
        return self._units is None

    def finish(self) -> T:
        """The result, computing what is left of it now."""
        if self._units is not None:
            self._result, self._units = run_to_end(self._units), None
        return self._result  # type: ignore[return-value]
