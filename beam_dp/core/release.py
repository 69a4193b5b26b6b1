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
    node counts, window, calibration). ``purpose`` tells apart the releases one step of one stream
    makes (``""`` when a step makes one release; e.g. ``"model:3"``, ``"query:7"``, ``"synthetic"``
    for a mechanism that releases several things at a step): a noise domain never writes two releases
    with the same (stream, step, purpose), which is what the job verifier checks. ``noise`` declares
    the worst-hit element's noise (JSON, :mod:`beam_dp.core.noise_declaration`) so that a verifier
    recomputes ``epsilon_spent``; ``""`` for a mechanism that declares none.
    """

    stream: str
    step: int
    mechanism: str
    value: ReleaseValue
    epsilon_spent: float
    delta_spent: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    purpose: str = ""
    noise: str = ""  # the noise declaration (beam_dp.core.noise_declaration), "" when none

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
            (self.stream, self.step, self.mechanism, self.epsilon_spent, self.delta_spent, dict(self.meta),
             self.purpose, self.noise)
            == (other.stream, other.step, other.mechanism, other.epsilon_spent, other.delta_spent, dict(other.meta),
                other.purpose, other.noise)
            and mine.keys() == theirs.keys()
            and all(mine[k].shape == theirs[k].shape and mine[k].tobytes() == theirs[k].tobytes() for k in mine)
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        # Rebuild through __init__ so that __post_init__ runs again: unpickled values stay read-only float64.
        return (Release, (self.stream, self.step, self.mechanism, self.value, self.epsilon_spent, self.delta_spent,
                          self.meta, self.purpose, self.noise))
