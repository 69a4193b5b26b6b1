"""``ReleaseBatch``: the releases of a group of streams at one step, columnar.

A group step of a mechanism releases one value per stream and the same public facts for all of them
(step, ``epsilon_spent``, ``delta_spent``, ``meta``: they depend on the step, never on a stream's
data), so they are kept once, next to a ``(streams, d)`` array of values. ``rows()`` gives the
per-stream :class:`~beam_dp.core.release.Release` records (identical to those of per-stream steps).
A mechanism whose release value is one named array (the online learners' ``{"x": ...}``) sets
``value_name``; the rows then carry ``{value_name: values[i]}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from beam_dp.core.release import Release

__all__ = ["ReleaseBatch"]


@dataclass(frozen=True, eq=False)
class ReleaseBatch:
    """Releases of ``streams`` at ``step``: ``values[i]`` is stream ``i``'s released vector (named
    ``value_name`` in each row's value when that is set)."""

    streams: tuple[str, ...]
    step: int
    mechanism: str
    values: np.ndarray
    epsilon_spent: float
    delta_spent: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    value_name: str | None = None
    noise: str = ""  # the releases' noise declaration (beam_dp.core.noise_declaration)

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float64)
        if values.ndim != 2 or values.shape[0] != len(self.streams):
            raise ValueError(f"values must be (streams, d), got {values.shape} for {len(self.streams)} streams")
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return len(self.streams)

    def rows(self) -> list[Release]:
        """One :class:`Release` per stream, in group order."""
        name = self.value_name
        return [
            Release(stream, self.step, self.mechanism, value if name is None else {name: value},
                    self.epsilon_spent, self.delta_spent, self.meta, noise=self.noise)
            for stream, value in zip(self.streams, self.values)
        ]
