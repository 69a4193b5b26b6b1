"""Output locations that must not nest: pure path arithmetic (no Beam, no filesystem access).

A job writes its releases (``--output``) and its raw data (``--dead-letter-output``, a checkpoint
folder) into separate folders, and a local run stages each in ``<folder>.staging-<run id>`` beside it.
Publishing renames those folders, so a folder inside another one (or inside another's staging folder)
would be moved, or lost, with it, and raw data would be published with the releases. These checks
refuse such a layout before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["inside", "overlap_error"]


def _key(path: str) -> str:
    """A local path resolved (absolute, ``..``, ``.`` and links), a URI without its trailing ``/``."""
    if "://" in path:
        return path.rstrip("/") or path
    return os.path.realpath(os.path.abspath(path)).rstrip(os.sep) or os.sep


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (local paths resolved; URIs compared as text)."""
    p, f = _key(path), _key(folder)
    return p == f or p.startswith(f.rstrip("/") + "/")


def overlap_error(locations: Sequence[tuple[str, str]]) -> str | None:
    """One line naming the first pair of ``(flag, path)`` locations that are the same folder, lie one
    inside the other, or one inside the other's staging folder ``<path>.staging-*``; None when none do."""
    for i, (flag_a, a) in enumerate(locations):
        for flag_b, b in locations[i + 1:]:
            ka, kb = _key(a), _key(b)
            how = ("is the same folder" if ka == kb else "lies inside it" if inside(b, a) else
                   "contains it" if inside(a, b) else
                   "lies inside its staging folder" if kb.startswith(ka + ".staging-") else
                   "is where its staging folder goes" if ka.startswith(kb + ".staging-") else None)
            if how:
                return (f"{flag_b} {b} overlaps {flag_a} {a}: it {how}; give separate folders side by side "
                        "(a run replaces each folder whole, and raw data never goes with the releases)")
    return None
