"""Row helpers of the record-reading jobs, free of Beam (the job modules import them at load time)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from pipelines.runner import UsageError

__all__ = ["features_of", "indexed_columns", "number", "require_columns"]


def number(value: Any) -> Any:
    """``float(value)`` for numbers and numeric text; anything else unchanged (the transform rejects it)."""
    if isinstance(value, bool) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def indexed_columns(names: list[str], prefix: str) -> list[str]:
    """``<prefix>_0 .. <prefix>_{d-1}`` of a header, in order (a usage error if there is a gap)."""
    pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)$")
    indexed = sorted((int(m.group(1)), n) for n in names if (m := pattern.match(n)))
    if [i for i, _ in indexed] != list(range(len(indexed))):
        raise UsageError(f"columns {prefix}_0 .. {prefix}_{{d-1}} must have no gaps")
    return [n for _, n in indexed]


def features_of(row: Mapping[str, Any], dim: int, prefix: str = "x") -> Any:
    """The feature vector of a row: its ``features`` list, or the columns ``x_0 .. x_{dim-1}``."""
    if row.get("features") is not None:
        return row["features"]
    return [number(row.get(f"{prefix}_{i}")) for i in range(dim)]



def require_columns(names: list[str], required: tuple[str, ...], flag: str) -> None:
    """A usage error when the input's header lacks a column the job needs: one line instead of every
    row dead-lettered for the same reason."""
    missing = [c for c in required if c not in names]
    if missing:
        # a name with invisible characters (a byte-order mark, a zero-width space) is shown escaped
        shown = ", ".join(n if n.isprintable() else repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        hint = "; the file starts with a UTF-8 byte-order mark (\\ufeff): save it without one" if (
            names and names[0].startswith("\ufeff")) else ""
        raise UsageError(f"{flag} has no column {missing[0]!r} (needs {', '.join(required)}; has {shown}{hint})"[:400])
