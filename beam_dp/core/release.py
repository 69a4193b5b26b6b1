"""The release record: the only thing that leaves a mechanism."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["Release", "ReleaseValue"]

ReleaseValue = np.ndarray | Mapping[str, np.ndarray]


def _as_float_array(value: Any) -> np.ndarray:
    arr = np.array(value, dtype=np.float64)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Release:
    """A privatized snapshot of one stream at one step.

    ``value`` is a float64 array (or a mapping name -> array, e.g. model weights and intercepts).
    ``epsilon_spent``/``delta_spent`` are the worst-case cumulative loss of any single element up to
    and including this release, from the mechanism's own composition argument; they never exceed
    the mechanism's guarantee. ``meta`` holds public, JSON-serialisable facts (noise law and scale,
    node counts, window, calibration).
    """

    stream: str
    step: int
    mechanism: str
    value: ReleaseValue
    epsilon_spent: float
    delta_spent: float
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.value, Mapping):
            object.__setattr__(self, "value", {str(k): _as_float_array(v) for k, v in self.value.items()})
        else:
            object.__setattr__(self, "value", _as_float_array(self.value))

    def arrays(self) -> dict[str, np.ndarray]:
        """The released arrays by name (a plain array is named ``"value"``)."""
        return dict(self.value) if isinstance(self.value, Mapping) else {"value": self.value}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Release):
            return NotImplemented
        mine, theirs = self.arrays(), other.arrays()
        return (
            (self.stream, self.step, self.mechanism, self.epsilon_spent, self.delta_spent, dict(self.meta))
            == (other.stream, other.step, other.mechanism, other.epsilon_spent, other.delta_spent, dict(other.meta))
            and mine.keys() == theirs.keys()
            and all(mine[k].shape == theirs[k].shape and mine[k].tobytes() == theirs[k].tobytes() for k in mine)
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        # Rebuild through __init__ so that __post_init__ runs again: unpickled values stay read-only float64.
        return (Release, (self.stream, self.step, self.mechanism, self.value, self.epsilon_spent, self.delta_spent, self.meta))
